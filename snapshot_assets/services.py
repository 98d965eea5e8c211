"""Long-running services behind the CLI: `snapshotter ingest` and `snapshotter fanout-serve`.

`ingest` runs one subscriber → buffer loop per configured table (a thread each) until SIGTERM or
SIGINT, then seals what is complete and exits; a crash at any instant loses nothing (the buffer
resumes from its durable position). A second ingest of the same table (another host, say) stands by
until the writer's lock or lease is free, then takes over. The Dagster side runs the same loop as a long-running run
kept alive by the ingest supervisor sensor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resources import stop_signals
from resources.ingest import WRITER_POLL_S, IngestResult, run_ingest, writer_when_free
from resources.subscribers.factory import feed_subscriber
from resources.table_storage import open_buffer_writer
from snapshot_assets.config import SnapshotterConfig, TableConfig

if TYPE_CHECKING:  # Dagster's resources: the CLI's ingest opens the same things without importing Dagster
    from resources.buffer_resource import ChangeBufferResource
    from resources.subscriber_resource import SubscriberResource

log = logging.getLogger(__name__)


@dataclass
class IngestOutcome:
    table: str
    result: IngestResult | None
    error: BaseException | None


def ingest_table(table: TableConfig, stop: threading.Event, *, subscribers: SubscriberResource | None = None,
                 buffers: ChangeBufferResource | None = None) -> IngestResult:
    """One table's ingest loop, until `stop` is set (or a finite source ends).

    The subscriber and the buffer come from the resources the ingest run was given (the Dagster
    job's registered ones), or, for the CLI, from the functions those resources call.
    """
    subscriber = subscribers.open(table) if subscribers is not None else feed_subscriber(table)
    try:
        open_writer = buffers.open_writer if buffers is not None else open_buffer_writer
        buffer = writer_when_free(lambda: open_writer(table, subscriber.ordering), stop,
                                  poll_s=min(WRITER_POLL_S, table.buffer.lease.total_seconds() / 3), name=table.name)
        if buffer is None:
            return IngestResult(durable_position=None)
        with buffer:
            return run_ingest(subscriber, buffer, stop=stop)
    finally:
        subscriber.close()


def run_ingest_service(config: SnapshotterConfig, tables: Sequence[str] = (), *, stop: threading.Event | None = None,
                       ingest: Callable[[TableConfig, threading.Event], IngestResult] = ingest_table,
                       ) -> list[IngestOutcome]:
    """Ingest every configured table (or the named ones) concurrently until stopped."""
    chosen = [config.table(name) for name in tables] if tables else list(config.tables)
    stop = stop or threading.Event()
    outcomes: list[IngestOutcome] = []
    lock = threading.Lock()

    def worker(table: TableConfig) -> None:
        try:
            result, error = ingest(table, stop), None
        except BaseException as e:  # reported per table; the others keep running
            log.exception("ingest of %s failed", table.name)
            result, error = None, e
        with lock:
            outcomes.append(IngestOutcome(table.name, result, error))

    threads = [threading.Thread(target=worker, args=(t,), name=f"ingest-{t.name}") for t in chosen]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except BaseException:  # interrupted (Dagster run termination, Ctrl-C): seal what is complete, then go
        stop.set()
        for t in threads:
            t.join()
        raise
    return outcomes


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop` (resources/stop_signals.py: never from inside the handler)."""
    stop_signals.install(stop, "signal %d: stopping after the current transaction")
