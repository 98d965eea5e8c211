"""The Spark runtime: which Spark a run talks to, decided from `SparkConfig`.

In order of preference:
  1. `spark.remote` set: a Spark Connect session to that server (a cluster's, or one you run);
  2. `spark.master` set: a classic session on that master (`local[4]`, `spark://...`, `yarn`);
  3. neither: the LOCAL Spark Connect server (`connect_server`), started once and then reused,
     so every later run gets a session in ~1 s instead of booting a JVM (~10-15 s on 2 cores),
     until it has gone `spark.local_server_idle_timeout` without a session (then it stops itself);
  4. fallback: when that server cannot start (no Java, a port problem, ...) a classic in-process
     `local[2]` session, with the reason logged. The job code is the same on every runtime: it
     uses only DataFrame APIs that Connect supports (no RDDs, SQL-expression strings rather than
     `pyspark.sql.functions` Columns, so a process may even hold both kinds of session).

`spark.conf` settings are applied on top of small-machine defaults (`LOCAL_DEFAULTS`: few shuffle
partitions, no UI), which any setting overrides. The session's start time is measured and logged.

The choice is one function (`plan_spark`: builder settings with `spark.remote` or `spark.master`,
the local server started around it); who builds the session from those settings is the caller's:
Dagster runs use dagster-pyspark's builder (`resources/spark.py`), `open_spark`'s default is the
project's own for processes that hold both kinds of session.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from snapshot_assets.config import SparkConfig
from snapshot_assets.spark.connect_server import (
    DEFAULT_STATE_DIR,
    ConnectServerError,
    ServerInfo,
    ensure_local_connect_server,
    server_lost,
    stop_local_connect_server,
)
from snapshot_assets.spark.server_memory import DEFAULT_OVERHEAD

log = logging.getLogger(__name__)

Mode = Literal["connect", "connect-local", "classic", "classic-local"]

#: Defaults sized for a small machine (2 cores): every one can be overridden by `spark.conf`.
LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    "spark.driver.memoryOverhead": DEFAULT_OVERHEAD,  # the JVM's memory outside the heap (server_memory.py)
    "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
    "spark.sql.adaptive.enabled": "true",
    "spark.python.worker.reuse": "true",
}
#: Settings every session gets, local or remote (`spark.conf` overrides them).
#: - hugeMethodLimit: the typed-columns projection of a parquet artifact (spark/parquet_artifact.py)
#:   compiles to whole-stage methods past 8,000 bytecode bytes, which HotSpot never JIT-compiles: they
#:   ran interpreted, 16.8 s for 1,000,000 rows of 8 columns. Above this limit Spark generates
#:   per-expression code instead: 6.6 s.
#: - dataFrameDebugging: on a classic session pyspark wraps every DataFrame and Column call to record
#:   the Python call site in the JVM (an active-session lookup, a class lookup, a settings read and two
#:   more calls through py4j each time). The jobs build their plans from thousands of such calls: off,
#:   a chain of 8 builds (tests/spark/test_cluster_build.py) made 11,543 py4j calls instead of 23,337.
#:   An error then names the failing expression without the Python line that built it. (On a Connect
#:   session the wrapper records call sites on the client and makes no extra calls to the server.) The
#:   setting is static: a Connect session cannot set it (the server refuses it), so it is given at a
#:   JVM's start only (`_STATIC_PREFIXES`).
SESSION_DEFAULTS: Mapping[str, str] = {
    "spark.sql.codegen.hugeMethodLimit": "8000",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
#: Settings that only take effect when a JVM starts (server command line / classic builder).
_STATIC_PREFIXES = ("spark.driver.", "spark.executor.", "spark.ui.", "spark.master", "spark.jars",
                    "spark.connect.", "spark.local.dir", "spark.python.worker.reuse",
                    "spark.python.sql.dataFrameDebugging.")
FALLBACK_MASTER = "local[2]"


@dataclass(slots=True)
class SparkRuntime:
    """A ready session, how it was obtained, and how long that took."""

    spark: Any  # pyspark.sql.SparkSession (classic) or pyspark.sql.connect.session.SparkSession
    mode: Mode
    startup_s: float
    note: str = ""
    #: False when a classic session was joined rather than started: `getOrCreate` hands out the
    #: process's running SparkContext (a host process's own, e.g. a notebook or a test session),
    #: which is not this runtime's to stop.
    owned: bool = True
    server: ServerInfo | None = None  # the local server the session goes to (connect-local)

    @property
    def is_connect(self) -> bool:
        return self.mode in ("connect", "connect-local")

    def server_lost(self) -> str | None:
        """Why this runtime's local server is gone (`connect_server.server_lost`); None while it
        runs, and for any other kind of session."""
        return None if self.server is None else server_lost(self.server)

    def stop(self) -> None:
        """End this client's session (a local Connect server keeps running for the next run)."""
        if self.owned:
            self.spark.stop()
        if self.is_connect:
            os.environ.pop(CONNECT_MODE, None)


@dataclass(frozen=True, slots=True)
class SparkPlan:
    """Where a session goes: the builder's settings (`spark.remote` or `spark.master` among them)."""

    settings: dict[str, str]
    mode: Mode
    note: str
    server: ServerInfo | None = None  # the local server the session goes to (connect-local)

    @property
    def ships_code(self) -> bool:
        """A cluster's executors import this project from what the driver ships them."""
        return self.mode == "connect" or (self.mode == "classic" and not self.settings["spark.master"].startswith(
            "local"))


SessionMaker = Callable[[Mapping[str, str]], Any]
"""Opens a session from builder settings: dagster-pyspark's `spark_session_from_config` in runs, or
`session_from_settings` in processes that may hold both kinds of session (tests, benchmarks)."""


CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


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


def classic_session(master: str, conf: Mapping[str, str], app_name: str = "snapshotter") -> Any:
    """A classic (in-process JVM) session on `master` with `conf`.

    In a process that already runs a SparkContext (a notebook, a test session), pyspark's builder
    would hand that context's session back with `conf` applied to it, changing its owner's settings
    (its shuffle width, say) under it. The running session is joined as its owner set it instead:
    `open_spark` marks such a runtime not owned, and its teardown leaves the session alone too."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.pop(CONNECT_MODE, None)  # a classic session builds classic columns
    if SparkContext._active_spark_context is not None:
        log.info("joining the SparkContext this process already runs; its own settings stand")
        return SparkSession.builder.getOrCreate()
    builder = SparkSession.builder.master(master).appName(app_name)
    if master.startswith("local"):
        _local_python()
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _local_python() -> None:
    # Python workers must run this interpreter (the venv with pyarrow and this project); a classic
    # SparkContext takes it from the environment only.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def session_from_settings(settings: Mapping[str, str], *,
                          before_first_call: Callable[[Any], None] | None = None) -> Any:
    """The project's own builder: a Connect session straight from the Connect builder, else classic.

    pyspark's generic builder (what dagster-pyspark calls) refuses a Connect session while a classic
    SparkContext exists and flips a process-wide "connect mode" switch; a process that holds both
    kinds (the test suite, the benchmarks) opens its sessions here instead. `before_first_call`
    prepares a Connect session before anything reaches its endpoint (the session settings are the
    first call): a sensor bounds the client's retries there.
    """
    rest = {k: v for k, v in settings.items() if k not in ("spark.remote", "spark.master")}
    if "spark.remote" in settings:
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        spark = ConnectSession.builder.remote(settings["spark.remote"]).create()
        if before_first_call is not None:
            before_first_call(spark)
        # pyspark.sql.functions build Connect columns only in "connect mode" (what pyspark's generic
        # builder switches on); the jobs build columns with them, so a process that holds only this
        # session switches it on (SparkRuntime.stop switches it off). A process that also holds a
        # classic session (tests, benchmarks) must choose per use; the mode is left alone there.
        from pyspark import SparkContext

        if SparkContext._active_spark_context is None:
            os.environ[CONNECT_MODE] = "1"
        _apply_runtime_conf(spark, rest)
        return spark
    return classic_session(settings["spark.master"], rest, rest.get("spark.app.name", "snapshotter"))


def plan_spark(config: SparkConfig, state_dir: Path | str = DEFAULT_STATE_DIR,
               app_name: str = "snapshotter") -> SparkPlan:
    """Where the session goes (see the module docstring), starting the local Connect server when it is the one."""
    if config.remote:
        return SparkPlan({**SESSION_DEFAULTS, **_session_level(config.conf), "spark.remote": config.remote}, "connect",
                         config.remote)
    named = {"spark.app.name": app_name}
    if config.master:
        base = LOCAL_DEFAULTS if config.master.startswith("local") else {}
        settings = {**named, **SESSION_DEFAULTS, **base, **config.conf, "spark.master": config.master}
        return SparkPlan(settings, "classic", config.master)
    conf = _local_server_conf(config)
    try:
        info, started_now = ensure_local_connect_server(
            Path(state_dir), conf=conf, idle_timeout_s=config.local_server_idle_timeout.total_seconds())
    except (ConnectServerError, OSError) as exc:
        return _fallback(config, app_name, f"local Spark Connect server unavailable ({exc})")
    note = f"{'started' if started_now else 'reused'} local server pid {info.pid} port {info.port}"
    return SparkPlan({**_session_level(conf), "spark.remote": info.url}, "connect-local", note, info)


def _local_server_conf(config: SparkConfig) -> dict[str, str]:
    return {**SESSION_DEFAULTS, **LOCAL_DEFAULTS, **config.conf}


def uses_local_server(config: SparkConfig) -> bool:
    """Whether `config` points at the local Spark Connect server (neither `remote` nor `master`)."""
    return not config.remote and not config.master


def warm_local_server(config: SparkConfig, state_dir: Path | str = DEFAULT_STATE_DIR) -> threading.Thread | None:
    """Start the local Connect server in the background, when `config` uses it, and return the thread.

    Why: booting the server's JVM takes seconds (about 5 on 2 cores) that a caller with other work
    first (`run --once` ingests before it builds) need not wait for. `plan_spark` later takes the
    same server-directory lock, so it waits for this start rather than starting a second server; a
    failure here is only logged, as `plan_spark` tries again and falls back on its own. Join the
    thread before the process ends (the start is bounded by the server's start timeout).
    """
    if not uses_local_server(config):
        return None

    def start() -> None:
        try:
            ensure_local_connect_server(Path(state_dir), conf=_local_server_conf(config),
                                        idle_timeout_s=config.local_server_idle_timeout.total_seconds())
        except (ConnectServerError, OSError, ValueError) as exc:  # ValueError: a bad memory size, which
            # `plan_spark` raises again as the run's error (a setting to mend, not a server to fall back from)
            log.info("warming the local Spark Connect server failed (the run will try again): %s", exc)

    thread = threading.Thread(target=start, name="spark-connect-warm-up", daemon=True)
    thread.start()
    return thread


def _session_level(conf: Mapping[str, str]) -> dict[str, str]:
    """The settings a Connect session can take (static ones belong to the server's command line)."""
    return {k: v for k, v in conf.items() if not _is_static(k)}


def _fallback(config: SparkConfig, app_name: str, why: str) -> SparkPlan:
    reason = f"{why}; using a classic {FALLBACK_MASTER} session"
    log.warning("%s", reason)
    settings = {"spark.app.name": app_name, **SESSION_DEFAULTS, **LOCAL_DEFAULTS, **config.conf,
                "spark.master": FALLBACK_MASTER}
    return SparkPlan(settings, "classic-local", reason)


def open_spark(config: SparkConfig | None = None, *, state_dir: Path | str = DEFAULT_STATE_DIR,
               app_name: str = "snapshotter", ship_code: bool = True,
               make_session: SessionMaker = session_from_settings) -> SparkRuntime:
    """A Spark session per `config` (see the module docstring for the order of preference).

    `state_dir` holds the local Connect server's pid/port file and log. `ship_code` uploads this
    project's packages to a remote Spark (Connect `addArtifacts` / `addPyFile`), whose executors
    need them because the tasks call the archive code; local runtimes import it from this venv.
    `make_session` opens the session from the plan's settings.
    """
    config = config or SparkConfig()
    started = time.monotonic()
    plan = plan_spark(config, state_dir, app_name)
    if plan.settings.get("spark.master", "").startswith("local"):
        _local_python()
    joined = _running_context()
    try:
        spark = make_session(plan.settings)
    except Exception as exc:  # a local server that started but refuses sessions (e.g. a bad setting)
        if plan.mode != "connect-local":
            raise
        plan = _fallback(config, app_name, f"Spark Connect session failed ({type(exc).__name__}: {exc})")
        _local_python()
        joined = _running_context()
        spark = make_session(plan.settings)
    runtime = SparkRuntime(spark, plan.mode, time.monotonic() - started, plan.note,
                           owned=plan.mode.startswith("connect") or not joined,
                           server=plan.server if plan.mode == "connect-local" else None)
    if runtime.server is not None:
        from snapshot_assets.spark.server_retries import LocalServerRetries

        spark.client.set_retry_policies([LocalServerRetries(runtime.server)])
    if ship_code and plan.ships_code:
        try:
            ship_project_code(spark, connect=plan.mode == "connect")
        except BaseException:
            # `create` made it the process's default session, which pyspark's `getOrCreate` (what
            # dagster-pyspark's builder calls) hands out whatever URL it is asked for.
            runtime.stop()
            raise
        runtime.startup_s = time.monotonic() - started
    log.info("Spark session ready in %.2fs (%s%s)", runtime.startup_s, runtime.mode,
             f": {runtime.note}" if runtime.note else "")
    return runtime


def _running_context() -> bool:
    """Whether this process already runs a classic SparkContext (which a classic builder would join)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


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
    "SESSION_DEFAULTS",
    "SessionMaker",
    "SparkPlan",
    "SparkRuntime",
    "classic_session",
    "open_spark",
    "plan_spark",
    "project_code_zip",
    "session_from_settings",
    "ship_project_code",
    "stop_local_connect_server",
]
