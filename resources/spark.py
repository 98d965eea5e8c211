"""The Spark resource of the artifact assets: dagster-pyspark's PySparkResource, pointed by the runtime chooser.

`spark_config` is PySparkResource's own field: the builder's settings, `spark.remote` (a Spark
Connect server or cluster) or `spark.master` among them, as the configuration's `spark` block
gives them. With neither, the resource starts (or reuses) the local Spark Connect server first and
hands its `sc://` URL to the same builder; when that server cannot start, a classic `local[2]`
session. The choice is `snapshot_assets.spark.session.plan_spark`, shared with the CLI tools; the
session itself comes from dagster-pyspark's `spark_session_from_config`, whose generic pyspark
builder opens a Connect session when `spark.remote` is set. The session is opened when the
resource is set up for a step that needs it (each step process under the multiprocess executor,
once per in-process run) and stopped at its teardown; a local Connect server keeps running.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
from dagster_pyspark import PySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field, PrivateAttr

from snapshot_assets.config import SparkConfig
from snapshot_assets.spark.connect_server import DEFAULT_STATE_DIR


class SparkServerLost(RuntimeError):
    """A run's Spark work failed because its local Spark Connect server ended."""


class SparkResource(PySparkResource):
    spark_config: dict[str, Any] = Field(
        default_factory=dict, description="Spark builder settings: spark.remote or spark.master, and any spark.* key.")
    state_dir: str = Field(default=str(DEFAULT_STATE_DIR),
                           description="Where the local Spark Connect server's pid/port file and log live.")
    local_server_idle_timeout_s: float = Field(
        default=SparkConfig.local_server_idle_timeout.total_seconds(),
        description="The local Spark Connect server stops after this many seconds without a session (0: never).")
    _runtime: Any = PrivateAttr(default=None)

    @classmethod
    def from_config(cls, spark: SparkConfig) -> SparkResource:
        """The resource for the configuration's `spark` block."""
        named = {"spark.remote": spark.remote, "spark.master": spark.master}
        return cls(spark_config={**spark.conf, **{k: v for k, v in named.items() if v}},
                   local_server_idle_timeout_s=spark.local_server_idle_timeout.total_seconds())

    def spark_settings(self) -> SparkConfig:
        settings: Mapping[str, Any] = self.spark_config
        rest = {k: str(v) for k, v in settings.items() if k not in ("spark.remote", "spark.master")}
        return SparkConfig(str(settings.get("spark.remote", "")), str(settings.get("spark.master", "")), rest,
                           _dt.timedelta(seconds=self.local_server_idle_timeout_s))

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        from snapshot_assets.spark.session import open_spark

        self._runtime = open_spark(self.spark_settings(), state_dir=self.state_dir,
                                   make_session=spark_session_from_config)
        self._spark_session = self._runtime.spark

    @property
    def mode(self) -> str:
        """How the session was obtained (connect, connect-local, classic, classic-local)."""
        return str(self._runtime.mode) if self._runtime is not None else ""

    @contextlib.contextmanager
    def watching_server(self, what: str) -> Iterator[None]:
        """Run Spark work (`what` names it in the error) so that a failure caused by the local
        server ending (killed, out of memory) is reported as that, naming the server's log, rather
        than as the gRPC error the next call happened to get."""
        try:
            yield
        except Exception as exc:
            lost = self._runtime.server_lost() if self._runtime is not None else None
            if lost is None:
                raise
            raise SparkServerLost(f"{what}: {lost}") from exc

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._runtime is not None:
            self._runtime.stop()
            self._runtime = None
            self._spark_session = None
