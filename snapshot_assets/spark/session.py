"""The Spark runtime: which Spark a run talks to, decided from `SparkConfig`.

In order of preference:
  1. `spark.remote` set: a Spark Connect session to that server (a cluster's, or one you run);
  2. `spark.master` set: a classic session on that master (`local[4]`, `spark://...`, `yarn`);
  3. neither: the LOCAL Spark Connect server (`connect_server`), started once and then reused,
     so every later run gets a session in ~1 s instead of booting a JVM (~10-15 s on 2 cores);
  4. fallback: when that server cannot start (no Java, a port problem, ...) a classic in-process
     `local[2]` session, with the reason logged. The job code is the same on every runtime: it
     uses only DataFrame APIs that Connect supports (no RDDs, SQL-expression strings rather than
     `pyspark.sql.functions` Columns, so a process may even hold both kinds of session).

`spark.conf` settings are applied on top of small-machine defaults (`LOCAL_DEFAULTS`: few shuffle
partitions, no UI), which any setting overrides. The session's start time is measured and logged.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from snapshot_assets.config import SparkConfig
from snapshot_assets.spark.connect_server import (
    DEFAULT_STATE_DIR,
    ConnectServerError,
    ensure_local_connect_server,
    stop_local_connect_server,
)

log = logging.getLogger(__name__)

Mode = Literal["connect", "connect-local", "classic", "classic-local"]

#: Defaults sized for a small machine (2 cores): every one can be overridden by `spark.conf`.
LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
    "spark.sql.adaptive.enabled": "true",
    "spark.python.worker.reuse": "true",
}
#: Settings that only take effect when a JVM starts (server command line / classic builder).
_STATIC_PREFIXES = ("spark.driver.", "spark.executor.", "spark.ui.", "spark.master", "spark.jars",
                    "spark.connect.", "spark.local.dir", "spark.python.worker.reuse")
FALLBACK_MASTER = "local[2]"


@dataclass(slots=True)
class SparkRuntime:
    """A ready session, how it was obtained, and how long that took."""

    spark: Any  # pyspark.sql.SparkSession (classic) or pyspark.sql.connect.session.SparkSession
    mode: Mode
    startup_s: float
    note: str = ""

    @property
    def is_connect(self) -> bool:
        return self.mode in ("connect", "connect-local")

    def stop(self) -> None:
        """End this client's session (a local Connect server keeps running for the next run)."""
        self.spark.stop()


def _is_static(key: str) -> bool:
    return key.startswith(_STATIC_PREFIXES)


def _apply_runtime_conf(spark: Any, conf: Mapping[str, str]) -> None:
    """Set session-level settings on a Connect session; refused (static) ones are logged, not fatal."""
    for key, value in conf.items():
        if _is_static(key):
            continue
        try:
            spark.conf.set(key, value)
        except Exception as exc:  # the server refuses static or unknown settings
            log.warning("Spark setting %s=%s not applied to the session: %s", key, value, exc)


def _connect_session(url: str, conf: Mapping[str, str]) -> Any:
    # The Connect builder directly: pyspark's generic builder refuses a Connect session while a
    # classic SparkContext exists and flips a process-wide "connect mode" switch.
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    spark = ConnectSession.builder.remote(url).create()
    _apply_runtime_conf(spark, conf)
    return spark


def classic_session(master: str, conf: Mapping[str, str], app_name: str = "snapshotter") -> Any:
    """A classic (in-process JVM) session on `master` with `conf`."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    if master.startswith("local"):
        # Python workers must run this interpreter (the venv with pyarrow and this project); a
        # classic SparkContext takes it from the environment only.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def open_spark(config: SparkConfig | None = None, *, state_dir: Path | str = DEFAULT_STATE_DIR,
               app_name: str = "snapshotter", ship_code: bool = True) -> SparkRuntime:
    """A Spark session per `config` (see the module docstring for the order of preference).

    `state_dir` holds the local Connect server's pid/port file and log. `ship_code` uploads this
    project's packages to a remote Spark (Connect `addArtifacts` / `addPyFile`), whose executors
    need them because the tasks call the archive code; local runtimes import it from this venv.
    """
    config = config or SparkConfig()
    started = time.monotonic()
    if config.remote:
        conf = dict(config.conf)
        runtime = SparkRuntime(_connect_session(config.remote, conf), "connect", 0.0, config.remote)
        if ship_code:
            ship_project_code(runtime.spark, connect=True)
    elif config.master:
        conf = {**LOCAL_DEFAULTS, **config.conf} if config.master.startswith("local") else dict(config.conf)
        runtime = SparkRuntime(classic_session(config.master, conf, app_name), "classic", 0.0, config.master)
        if ship_code and not config.master.startswith("local"):
            ship_project_code(runtime.spark, connect=False)
    else:
        runtime = _local(config, Path(state_dir), app_name)
    runtime.startup_s = time.monotonic() - started
    log.info("Spark session ready in %.2fs (%s%s)", runtime.startup_s, runtime.mode,
             f": {runtime.note}" if runtime.note else "")
    return runtime


def _local(config: SparkConfig, state_dir: Path, app_name: str) -> SparkRuntime:
    conf = {**LOCAL_DEFAULTS, **config.conf}
    try:
        info, started_now = ensure_local_connect_server(state_dir, conf=conf)
        spark = _connect_session(info.url, conf)
        note = f"{'started' if started_now else 'reused'} local server pid {info.pid} port {info.port}"
        return SparkRuntime(spark, "connect-local", 0.0, note)
    except (ConnectServerError, OSError) as exc:
        reason = f"local Spark Connect server unavailable ({exc}); using a classic {FALLBACK_MASTER} session"
        log.warning("%s", reason)
    except Exception as exc:  # a server that started but refuses sessions (e.g. a bad setting)
        reason = f"Spark Connect session failed ({type(exc).__name__}: {exc}); using classic {FALLBACK_MASTER}"
        log.warning("%s", reason)
    return SparkRuntime(classic_session(FALLBACK_MASTER, conf, app_name), "classic-local", 0.0, reason)


def project_code_zip(dest_dir: Path | str | None = None) -> Path:
    """A zip of this project's Python packages (snapshot_assets, resources) for remote executors."""
    import resources
    import snapshot_assets

    out_dir = Path(dest_dir) if dest_dir is not None else Path(tempfile.mkdtemp(prefix="snapshotter-code-"))
    target = out_dir / "snapshotter_code.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in (snapshot_assets, resources):
            root = Path(next(iter(package.__path__))).resolve()
            for path in sorted(root.rglob("*.py")):
                zf.write(path, path.relative_to(root.parent).as_posix())
    return target


def ship_project_code(spark: Any, *, connect: bool) -> None:
    """Make this project importable on a remote cluster's executors (dependencies must be there)."""
    archive = project_code_zip()
    if connect:
        spark.addArtifacts(str(archive), pyfile=True)
    else:
        spark.sparkContext.addPyFile(str(archive))
    log.info("shipped project code to Spark (%s, %d bytes)", archive, os.path.getsize(archive))


__all__ = [
    "DEFAULT_STATE_DIR",
    "LOCAL_DEFAULTS",
    "SparkRuntime",
    "classic_session",
    "open_spark",
    "project_code_zip",
    "ship_project_code",
    "stop_local_connect_server",
]
