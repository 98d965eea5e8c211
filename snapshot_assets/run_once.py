"""`snapshotter run --once`: catch every configured table up to the source position seen at start.

Per table: ingest until the buffer holds everything the source had when the command started (for
PostgreSQL, `pg_current_wal_lsn()` at start; a finite source until its end; otherwise until the
stream goes quiet), then ask the same decision the re-base trigger sensor asks and materialize the
same assets (diff or snapshot, then manifest) in process, until nothing is left to write. Exit
status 0 means every table's archive reached its buffer's durable position. With a `RunOutput`
(the CLI's), progress goes to its live view and Dagster's event log to its file (`run_output`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from resources.buffer import BufferReader
from resources.table_storage import buffer_storage
from snapshot_assets.archive.positions import comparator, format_lsn
from snapshot_assets.config import SnapshotterConfig, TableConfig
from snapshot_assets.pipeline.diff_size import MeasuringSpark, diff_size
from snapshot_assets.progress import LiveView, rate
from snapshot_assets.run_output import RunOutput
from snapshot_assets.services import ingest_table
from snapshot_assets.spark.session import warm_local_server

if TYPE_CHECKING:
    import dagster as dg

log = logging.getLogger(__name__)
RUN_MEASURE_BUDGET_S = 300.0  # seconds `run --once` may spend measuring pending diffs (it runs Spark anyway)
#: `source_position_now` for a PostgreSQL table without its slot: the ingest starts with a copy of the
#: table taken after that call (an initial load, or a lost slot's re-sync), so the buffer holds
#: everything the source had once a durable position other than the one at the start appears.
NEXT_COPY = "the copy of the table"


class InProcessRuns:
    """The code location's jobs on a Dagster instance, for runs in this process: both made on the
    first run. Why lazily: importing Dagster and the definitions, and opening an instance, take
    seconds of a `run --once`, and a pass with nothing to write needs none of it. `warm` (called
    before each job is looked up; once is enough for it) starts what the run will need and can boot
    on its own meanwhile: the local Spark server's JVM, on the other core, while Dagster imports."""

    def __init__(self, instance: Callable[[], dg.DagsterInstance], warm: Callable[[], None] = lambda: None) -> None:
        self._instance = instance
        self._warm = warm

    @functools.cached_property
    def instance(self) -> dg.DagsterInstance:
        return self._instance()

    def job(self, name: str) -> dg.JobDefinition:
        self._warm()
        from snapshot_assets.definitions import defs

        return defs.resolve_job_def(name)


@dataclass
class TableOutcome:
    table: str
    ingested_to: str | None
    artifacts: list[str] = field(default_factory=list)
    head: str = ""


def source_position_now(table: TableConfig) -> str | None:
    """The position the buffer must reach to hold everything the source has now, where the source can tell.

    PostgreSQL positions are commit LSNs, so the durable position is the commit LSN of the last
    transaction that touched the table, always below `pg_current_wal_lsn()`: the target is that
    commit LSN, found by peeking the table's slot (without consuming it) up to the current WAL
    position — the final LSN of the last transaction there with a change of the table — or ""
    when nothing is pending after the slot's confirmed position; NEXT_COPY when the table has no
    slot yet (the copy the ingest starts with covers everything). None when the source cannot tell
    (another source type; a peek refused, say by a slot in use): the caller then waits for the
    stream to go quiet instead.
    """
    if table.source.type != "postgres":
        return None
    import psycopg2

    from resources.subscribers.factory import slot_name

    slot = slot_name(table.source)
    publication = table.source.publication or slot
    try:
        with contextlib.closing(psycopg2.connect(table.source.dsn)) as conn, conn, conn.cursor() as cur:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            found = cur.fetchone()
            if found is None:
                return NEXT_COPY
            if found[0]:
                return None
            # pgoutput v1 messages: Begin = 'B' (66) + final (commit) LSN as int64; changes are
            # Insert 'I' (73), Update 'U' (85), Delete 'D' (68), Truncate 'T' (84).
            cur.execute(
                "WITH m AS (SELECT xid, data FROM pg_logical_slot_peek_binary_changes("
                "  %s, pg_current_wal_lsn(), NULL, 'proto_version', '1', 'publication_names', %s)) "
                "SELECT max(('x' || encode(substring(b.data FROM 2 FOR 8), 'hex'))::bit(64)::bigint) FROM m b "
                "WHERE get_byte(b.data, 0) = 66 AND EXISTS (SELECT 1 FROM m c WHERE c.xid = b.xid "
                "  AND get_byte(c.data, 0) IN (73, 85, 68, 84))",
                (slot, _quoted(publication)))
            row = cur.fetchone()
    except psycopg2.Error as e:
        log.warning("%s: cannot peek the replication slot %s (%s); waiting for the stream to go quiet instead",
                    table.name, slot, str(e).strip())
        return None
    return format_lsn(int(row[0])) if row and row[0] is not None else ""


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def ingest_until_caught_up(table: TableConfig, *, idle_s: float = 2.0, timeout_s: float = 600.0,
                           ingest: Callable[[TableConfig, threading.Event], object] = ingest_table,
                           view: LiveView | None = None, on_pending: Callable[[], object] | None = None) -> str | None:
    """Run the table's ingest loop until the buffer reaches the start-time source position.

    Done when the source ends (finite), when the durable position reaches the target, or — for a
    source that cannot say where it is — when nothing new became durable for `idle_s`. `view`
    shows the changes made durable since the start (the buffer index's counts) as they grow.
    `on_pending` is called before the ingest starts unless the source says nothing is pending.
    """
    target = source_position_now(table)
    if on_pending is not None and target != "":
        on_pending()
    log.info("%s: catching up to %s", table.name,
             target or ("the durable position" if target == "" else "the end of the stream (until it is quiet)"))
    cmp = comparator("lsn")
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            ingest(table, stop)
        except BaseException as e:  # surfaced below, with the table's name
            errors.append(e)

    reader = BufferReader(table.buffer.path, table.name, storage=buffer_storage(table))
    start = _durable(reader)  # before the ingest begins: a copy made durable after it is new
    thread = threading.Thread(target=work, name=f"ingest-{table.name}")
    thread.start()
    last, last_change, deadline = None, time.monotonic(), time.monotonic() + timeout_s
    shown = _IngestShown(table.name, view, start)

    def reached(durable: str | None) -> bool:
        if durable is None or target is None:
            return False
        if target == NEXT_COPY:
            return durable != start
        return not target or cmp(durable, target) >= 0

    try:
        while thread.is_alive():
            thread.join(timeout=0.2)
            durable = _durable(reader)
            if durable != last:
                last, last_change = durable, time.monotonic()
                shown.update(reader, durable)
            if reached(durable):
                break
            if target is None and durable is not None and time.monotonic() - last_change >= idle_s:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{table.name}: ingest did not catch up within {timeout_s:.0f} s")
    finally:
        stop.set()
        thread.join()
    if errors:
        raise RuntimeError(f"{table.name}: ingest failed: {errors[0]}") from errors[0]
    durable = _durable(reader)
    shown.finish(reader, durable)
    return durable


class _IngestShown:
    """The ingest line of the live view: changes durable since the start, their rate, the position."""

    def __init__(self, table: str, view: LiveView | None, start: str | None) -> None:
        self.table, self.view, self.start = table, view, start
        self.started = self.shown_at = time.monotonic()

    def _changes(self, reader: BufferReader) -> int:
        return reader.stats(self.start).changes if self.start else reader.stats().changes

    def update(self, reader: BufferReader, durable: str | None) -> None:
        now = time.monotonic()
        if self.view is None or now - self.shown_at < 0.5:  # the index is read at most twice a second
            return
        self.shown_at = now
        changes = self._changes(reader)
        self.view.status(self.table, "ingest", f"{changes:,} changes durable ({rate(changes, now - self.started)}), "
                                               f"at {durable}", since=self.started)

    def finish(self, reader: BufferReader, durable: str | None) -> None:
        if self.view is None:
            return
        seconds = time.monotonic() - self.started
        changes = self._changes(reader) if durable != self.start else 0
        self.view.result(self.table, f"ingested {changes:,} changes in {seconds:.1f}s ({rate(changes, seconds)}), "
                                     f"buffer durable at {durable or '-'}")


def _durable(reader: BufferReader) -> str | None:
    try:
        return reader.durable_position()
    except FileNotFoundError:
        return None


def catch_up(runs: InProcessRuns, table: str, *, force: bool = False,
             max_artifacts: int = 10, output: RunOutput | None = None,
             measuring: MeasuringSpark | None = None) -> TableOutcome:
    """Materialize artifacts until the sensor's decision says there is nothing left to write.

    With `output`, each run is watched by it (live view, event log file); without, Dagster logs as
    it is configured to (its console logger). With `measuring`, the size triggers judge the pending
    diff's encoded size as the sensor's do (else the buffer's bytes)."""
    from snapshot_assets.tables import FROM_TAG, TABLE_TAG, TO_TAG, TRIGGER_TAG, pipeline

    pipe = pipeline(table)
    outcome = TableOutcome(table, pipe.buffer().durable_position())
    for i in range(max_artifacts):
        sizes = None
        if measuring is not None:
            stand_in = pipe.buffer().stats(pipe.manifest().head_position or None).bytes
            sizes = diff_size(pipe, measuring, stand_in, log)
        nxt = pipe.decide(force=force and i == 0, diff_size=sizes)
        if nxt.kind == "none":
            break
        job, instance = runs.job("diff_job" if nxt.kind == "diff" else "snapshot_job"), runs.instance
        tags = {TABLE_TAG: table, TRIGGER_TAG: nxt.trigger, FROM_TAG: nxt.from_position or "",
                TO_TAG: nxt.to_position or ""}
        result = (output.execute(job, table, nxt, instance=instance, tags=tags) if output is not None else
                  job.execute_in_process(partition_key=table, tags=tags, instance=instance, raise_on_error=True))
        if not result.success:
            raise RuntimeError(f"{table}: the {nxt.kind} run failed")
        outcome.artifacts.append(f"{nxt.kind}@{nxt.to_position} ({nxt.trigger})")
    else:
        raise RuntimeError(f"{table}: still not caught up after {max_artifacts} artifacts")
    outcome.head = pipe.manifest().head_position
    return outcome


def run_once(config: SnapshotterConfig, tables: Sequence[str] = (), *, instance: Callable[[], dg.DagsterInstance],
             force: bool = False, ingest: bool = True, output: RunOutput | None = None) -> list[TableOutcome]:
    chosen = [config.table(t) for t in tables] if tables else list(config.tables)
    sized = any(t.policy.max_diff_bytes or t.policy.max_diff_fraction for t in chosen)
    measuring = MeasuringSpark(config.spark, budget_s=RUN_MEASURE_BUDGET_S) if sized else None
    warming: list[threading.Thread | None] = []

    def warm() -> None:  # the Spark server boots while the changes come in, or Dagster imports (once)
        if not warming:
            warming.append(warm_local_server(config.spark))

    runs = InProcessRuns(instance, warm)

    outcomes = []
    try:
        for table in chosen:
            if ingest:
                ingested = ingest_until_caught_up(table, view=output.view if output is not None else None,
                                                  on_pending=warm)
                log.info("%s: buffer durable at %s", table.name, ingested)
            outcomes.append(catch_up(runs, table.name, force=force, output=output,
                                     measuring=measuring))
    finally:
        if measuring is not None:
            measuring.close()
        for thread in warming:
            if thread is not None:
                thread.join()  # a server start left running unattended could lose its pid file
    return outcomes
