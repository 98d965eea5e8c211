"""`snapshotter run --once`: catch every configured table up to the source position seen at start.

Per table: ingest until the buffer holds everything the source had when the command started (for
PostgreSQL, `pg_current_wal_lsn()` at start; a finite source until its end; otherwise until the
stream goes quiet), then ask the same decision the re-base trigger sensor asks and materialize the
same assets (diff or snapshot, then manifest) in process, until nothing is left to write. Exit
status 0 means every table's archive reached its buffer's durable position.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import dagster as dg

from resources.buffer import BufferReader
from snapshot_assets.archive.positions import comparator
from snapshot_assets.config import SnapshotterConfig, TableConfig
from snapshot_assets.services import ingest_table

log = logging.getLogger(__name__)


@dataclass
class TableOutcome:
    table: str
    ingested_to: str | None
    artifacts: list[str] = field(default_factory=list)
    head: str = ""


def source_position_now(table: TableConfig) -> str | None:
    """The position the source is at right now, where the source can tell."""
    if table.source.type != "postgres":
        return None
    import psycopg2

    with psycopg2.connect(table.source.dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        row = cur.fetchone()
    return str(row[0]) if row else None


def ingest_until_caught_up(table: TableConfig, *, idle_s: float = 2.0, timeout_s: float = 600.0,
                           ingest: Callable[[TableConfig, threading.Event], object] = ingest_table) -> str | None:
    """Run the table's ingest loop until the buffer reaches the start-time source position.

    Done when the source ends (finite), when the durable position reaches the target, or — for a
    source that cannot say where it is — when nothing new became durable for `idle_s`.
    """
    target = source_position_now(table)
    cmp = comparator("lsn")
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            ingest(table, stop)
        except BaseException as e:  # surfaced below, with the table's name
            errors.append(e)

    thread = threading.Thread(target=work, name=f"ingest-{table.name}")
    thread.start()
    reader = BufferReader(table.buffer.path, table.name)
    last, last_change, deadline = None, time.monotonic(), time.monotonic() + timeout_s
    try:
        while thread.is_alive():
            thread.join(timeout=0.2)
            durable = _durable(reader)
            if durable != last:
                last, last_change = durable, time.monotonic()
            if target is not None and durable is not None and cmp(durable, target) >= 0:
                break
            if durable is not None and time.monotonic() - last_change >= idle_s:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{table.name}: ingest did not catch up within {timeout_s:.0f} s")
    finally:
        stop.set()
        thread.join()
    if errors:
        raise RuntimeError(f"{table.name}: ingest failed: {errors[0]}") from errors[0]
    return _durable(reader)


def _durable(reader: BufferReader) -> str | None:
    try:
        return reader.durable_position()
    except FileNotFoundError:
        return None


def catch_up(defs: dg.Definitions, table: str, *, instance: dg.DagsterInstance, force: bool = False,
             max_artifacts: int = 10) -> TableOutcome:
    """Materialize artifacts until the sensor's decision says there is nothing left to write."""
    from snapshot_assets.tables import FROM_TAG, TABLE_TAG, TO_TAG, TRIGGER_TAG, pipeline

    pipe = pipeline(table)
    outcome = TableOutcome(table, pipe.buffer().durable_position())
    for i in range(max_artifacts):
        nxt = pipe.decide(force=force and i == 0)
        if nxt.kind == "none":
            break
        job = defs.resolve_job_def("diff_job" if nxt.kind == "diff" else "snapshot_job")
        tags = {TABLE_TAG: table, TRIGGER_TAG: nxt.trigger, FROM_TAG: nxt.from_position or "",
                TO_TAG: nxt.to_position or ""}
        result = job.execute_in_process(partition_key=table, tags=tags, instance=instance, raise_on_error=True)
        if not result.success:
            raise RuntimeError(f"{table}: the {nxt.kind} run failed")
        outcome.artifacts.append(f"{nxt.kind}@{nxt.to_position} ({nxt.trigger})")
    else:
        raise RuntimeError(f"{table}: still not caught up after {max_artifacts} artifacts")
    outcome.head = pipe.manifest().head_position
    return outcome


def run_once(config: SnapshotterConfig, tables: Sequence[str] = (), *, instance: dg.DagsterInstance,
             force: bool = False, ingest: bool = True) -> list[TableOutcome]:
    from snapshot_assets.definitions import defs

    chosen = [config.table(t) for t in tables] if tables else list(config.tables)
    outcomes = []
    for table in chosen:
        if ingest:
            ingested = ingest_until_caught_up(table)
            log.info("%s: buffer durable at %s", table.name, ingested)
        outcomes.append(catch_up(defs, table.name, instance=instance, force=force))
    return outcomes
