"""Where the in-process runs of `snapshotter run --once` and `snapshotter demo` report.

A person gets the live view (`progress.LiveView`); everything else goes to an event log file whose
path is printed first: every Dagster event of every run (what Dagster's console logger printed,
hundreds of DEBUG lines per demo) and the Python log records and warnings of the process. With
`--verbose` there is no file: Dagster's console logger and Python logging print to the terminal as
before, and the view prints plain lines among them.

How the view is fed, without parsing any log text:
  - Dagster's events of each run, from an event listener on the instance for the run's id
    (`DagsterInstance.add_event_listener`, called in the run's own thread in process): STEP_START
    of the build and manifest steps give the stage, the artifact's materialization gives its rows
    or changes and build seconds, RUN_SUCCESS / RUN_FAILURE the result line;
  - Spark's own progress reports on a Spark Connect session (`registerProgressHandler`: tasks done
    of each job's stages), on the session the run's `spark` resource opened, which is the active
    session of the run's thread when its build step starts. A classic session reports no
    progress: the stage and seconds still move.
The console logger is silenced through the run's config (`loggers.console.config.log_level`), the
switch Dagster offers for it; the events themselves are still stored in the instance as always.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from snapshot_assets.pipeline.decide import NextArtifact
from snapshot_assets.progress import LiveView, Tasks
from snapshot_assets.redaction import redact

if TYPE_CHECKING:  # a command that starts no run (nothing to do) never imports Dagster
    import dagster as dg

#: Where a command's event log goes by default: beside the local Spark server's state, per directory.
DEFAULT_LOG_DIR = Path(".snapshotter") / "logs"
#: Event log files kept per directory (one per command run; older ones are deleted).
KEEP_LOGS = 20
_PROJECT_LOGGERS = ("snapshot_assets", "resources", "sensors")
_STAGES = {"snapshot": "build", "diff": "build", "manifest": "commit", "manifest_archive_is_sound": "check"}
_FORMAT = "%(asctime)s %(levelname)s %(name)s - %(message)s"


class EventLog:
    """The file Dagster's events and the process's log records go to (line-buffered, append)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.file = path.open("a", buffering=1, encoding="utf-8")
        self.handler = logging.StreamHandler(self.file)
        self.handler.setFormatter(logging.Formatter(_FORMAT))

    def event(self, entry: dg.EventLogEntry) -> None:
        """One Dagster event, as Dagster's console logger would have printed it."""
        when = _dt.datetime.fromtimestamp(entry.timestamp, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        kind = entry.dagster_event.event_type_value if entry.dagster_event is not None else "LOG"
        level = logging.getLevelName(entry.level)
        text = f"{when} {level} dagster - {entry.job_name} {entry.run_id} {entry.step_key or '-'} {kind} - " \
               f"{entry.message}\n"
        self.handler.acquire()
        try:
            self.file.write(redact(text))
        finally:
            self.handler.release()

    def close(self) -> None:
        self.handler.close()
        self.file.close()


def default_log_path(directory: Path, command: str) -> Path:
    """`<directory>/<command>-<UTC time>.log`, after deleting all but the newest `KEEP_LOGS - 1` there."""
    old = sorted(directory.glob(f"{command}-*.log"))
    for path in old[:max(0, len(old) - (KEEP_LOGS - 1))]:
        path.unlink(missing_ok=True)
    return directory / f"{command}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"


class _NoteHandler(logging.Handler):
    """The project's warnings and errors, shown to the person through the view (they matter)."""

    def __init__(self, view: LiveView) -> None:
        super().__init__(logging.WARNING)
        self.view = view

    def emit(self, record: logging.LogRecord) -> None:
        self.view.note(f"{record.levelname.lower()}: {record.getMessage()}")


@dataclass
class RunOutput:
    """The live view and the event log (None: the terminal, `--verbose`) of one command."""

    view: LiveView
    event_log: EventLog | None
    installed: list[tuple[logging.Logger, logging.Handler]] = field(default_factory=list)
    root_level: int = logging.NOTSET

    def run_config(self, job: dg.JobDefinition, partition: str) -> dict[str, Any] | None:
        """The run config of an in-process run: the partition's own, with Dagster's console logger
        silenced unless verbose (a run config given replaces the partition's, so it is merged here)."""
        if self.event_log is None:
            return None
        config = job.partitioned_config.get_run_config_for_partition_key(partition) if job.partitioned_config else {}
        return {**config, "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}

    def watch(self, instance: dg.DagsterInstance, run_id: str, table: str, nxt: NextArtifact) -> RunWatch:
        """Feed the view (and the event log) from the events of the run `run_id`, before it starts."""
        watch = RunWatch(self, table, nxt)
        instance.add_event_listener(run_id, watch)
        return watch

    def execute(self, job: dg.JobDefinition, table: str, nxt: NextArtifact, *, instance: dg.DagsterInstance,
                tags: dict[str, str]) -> dg.ExecuteInProcessResult:
        """Run `job` for the table's partition in this process, watched."""
        run_id = str(uuid.uuid4())  # chosen here, so the listener is registered before the first event
        watch = self.watch(instance, run_id, table, nxt)
        try:
            return job.execute_in_process(partition_key=table, tags=tags, instance=instance, raise_on_error=True,
                                          run_id=run_id, run_config=self.run_config(job, table))
        finally:
            watch.detach_spark()

    def close(self) -> None:
        for logger, handler in self.installed:
            logger.removeHandler(handler)
        self.installed.clear()
        logging.getLogger().setLevel(self.root_level)
        logging.captureWarnings(False)
        if self.event_log is not None:
            self.event_log.close()


@contextlib.contextmanager
def command_output(out: TextIO, log_path: Path | None) -> Iterator[RunOutput]:
    """The output of a command that runs Dagster runs in process, with logging routed for it.

    With `log_path`: the root logger writes INFO and up (and Python warnings, Dagster's beta
    notices among them) to the event log there, whose path is printed first; the project's own
    warnings are also shown through the view. Without (`--verbose`): INFO to stderr, Dagster's
    console logger on, the view in plain lines.
    """
    view = LiveView(out) if log_path is not None else LiveView(out, live=False)
    root = logging.getLogger()
    if log_path is None:
        output = RunOutput(view, None)
        handler: logging.Handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
    else:
        event_log = EventLog(log_path)
        output = RunOutput(view, event_log)
        handler = event_log.handler
        view.line(f"event log: {log_path}")
        logging.captureWarnings(True)
        note = _NoteHandler(view)
        for name in _PROJECT_LOGGERS:
            logging.getLogger(name).addHandler(note)
            output.installed.append((logging.getLogger(name), note))
    root.addHandler(handler)
    output.installed.append((root, handler))
    output.root_level = root.level
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    try:
        with view:
            yield output
    finally:
        output.close()


class RunWatch:
    """One run's events, to the event log and to the view (the stage, the Spark bar, the result line)."""

    def __init__(self, output: RunOutput, table: str, nxt: NextArtifact) -> None:
        self.view = output.view
        self.event_log = output.event_log
        self.table = table
        self.nxt = nxt
        self.what = f"{nxt.kind} ({nxt.trigger})"
        self.started = time.monotonic()
        self.stage = "start"
        self.count: int | None = None
        self.build_s: float | None = None
        self.spark: Any = None
        self.operation = ""  # the Spark Connect operation (one action) reporting now
        self.actions = 0
        self._lock = threading.Lock()
        self.view.status(table, self.what, f"to {nxt.to_position}: {self.stage}", since=self.started)

    def __call__(self, entry: dg.EventLogEntry) -> None:
        import dagster as dg  # loaded already: this is a run's event

        if self.event_log is not None:
            self.event_log.event(entry)
        event = entry.dagster_event
        if event is None:
            return
        kind = event.event_type
        if kind == dg.DagsterEventType.STEP_START and entry.step_key in _STAGES:
            self.stage = _STAGES[entry.step_key]
            if self.stage == "build":
                self.attach_spark()
            self._show()
        elif kind in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE) and \
                _STAGES.get(entry.step_key or "") == "build":
            self.detach_spark()
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION and entry.step_key in ("snapshot", "diff"):
            self._materialized(entry)
        elif kind == dg.DagsterEventType.RUN_SUCCESS:
            self.view.result(self.table, self.summary())
        elif kind == dg.DagsterEventType.RUN_FAILURE:
            where = f"; details in {self.event_log.path}" if self.event_log is not None else ""
            self.view.result(self.table, f"{self.what} to {self.nxt.to_position}: FAILED in {self.stage}{where}")

    def summary(self) -> str:
        """The artifact's result line: what was written, how much, how long (and the build's part)."""
        noun = "rows" if self.nxt.kind == "snapshot" else "changes"
        count = f"{self.count:,} {noun}" if self.count is not None else "written"
        build = f", build {self.build_s:.1f}s" if self.build_s is not None else ""
        return f"{self.what} to {self.nxt.to_position}: {count} in {time.monotonic() - self.started:.1f}s{build}"

    def _materialized(self, entry: dg.EventLogEntry) -> None:
        materialization = entry.asset_materialization
        meta = materialization.metadata if materialization is not None else {}
        value = meta.get("rows", meta.get("changes"))
        self.count = int(value.value) if value is not None and isinstance(value.value, int) else None
        duration = meta.get("duration_s")
        self.build_s = float(duration.value) if duration is not None and isinstance(duration.value, float) else None

    def _show(self, tasks: Tasks | None = None) -> None:
        self.view.status(self.table, self.what, f"to {self.nxt.to_position}: {self.stage}", tasks=tasks)

    # ---- Spark's progress reports ---------------------------------------------------------------

    def attach_spark(self) -> None:
        """Listen to the progress of the run's Spark Connect session (the active one of this thread)."""
        try:
            from pyspark.sql.connect.session import SparkSession
        except ImportError:  # pyspark without Connect's client dependencies
            return
        session = SparkSession.getActiveSession()
        if session is not None:
            # pyspark only calls its handlers: a callable with ProgressHandler's signature is one
            session.registerProgressHandler(self.on_spark_progress)  # type: ignore[arg-type]
            self.spark = session

    def detach_spark(self) -> None:
        if self.spark is not None:
            with contextlib.suppress(Exception):  # a stopped session forgets its handlers anyway
                self.spark.removeProgressHandler(self.on_spark_progress)
            self.spark = None

    def on_spark_progress(self, stages: Iterable[Any] | None, inflight_tasks: int, operation_id: str | None,
                          done: bool) -> None:
        """pyspark's ProgressHandler: the tasks of the current Spark job's stages."""
        with self._lock:
            if operation_id and operation_id != self.operation:
                self.operation, self.actions = operation_id, self.actions + 1
            known = list(stages or ())
            total = sum(int(s.num_tasks) for s in known)
            finished = sum(int(s.num_completed_tasks) for s in known)
            self._show(Tasks(total if done else finished, total, self.actions))
