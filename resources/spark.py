"""The Spark resource the artifact assets use: one session per run process, opened on first use.

A local Spark Connect server is the default runtime (a warm JVM shared by every run; see
snapshot_assets/spark/session.py); `remote` or `master` point at a cluster. dagster-pyspark's
PySparkResource only builds classic sessions, so this resource wraps the project's runtime
chooser instead, and exposes the same `spark_session` attribute name.
"""

from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from snapshot_assets.config import SparkConfig


class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    remote: str = ""
    master: str = ""
    conf: dict[str, str] = Field(default_factory=dict)
    state_dir: str = ".snapshotter/spark-connect"
    _runtime: Any = PrivateAttr(default=None)

    def runtime(self) -> Any:
        if self._runtime is None:
            from snapshot_assets.spark.session import open_spark

            self._runtime = open_spark(SparkConfig(self.remote, self.master, dict(self.conf)),
                                       state_dir=self.state_dir)
        return self._runtime

    @property
    def spark_session(self) -> Any:
        return self.runtime().spark

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._runtime is not None:
            self._runtime.stop()
            self._runtime = None
