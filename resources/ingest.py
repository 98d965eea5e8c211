"""The ingest loop: a subscriber's events into the change buffer, acknowledging only what is durable.

Why restarting is always safe: the loop starts every (re)connection at `buffer.durable_position()`
and acknowledges to the source only positions the buffer reports durable after a seal. Whatever
was appended but not sealed when the process dies (or the source fails) is re-sent by the source
from that position, and the buffer assigns it the same seqs again; whatever was sealed is never
re-sent. So kill -9 at any instant loses nothing and duplicates nothing, and no restart needs a new
snapshot (None — nothing durable yet — is the only case that starts with the initial load).
A source that cannot tell by itself which table shape the buffer's rows have
(`ResumesWithSchema`: PostgreSQL after an ALTER TABLE) is told the buffer's durable schema before
each (re)connection.

Threads: the source is read on a producer thread into a small bounded queue (so a quiet source
cannot delay a due seal, and `stop` is honoured within a tick even while the source blocks); the
buffer is only touched by the calling thread. `subscriber.acknowledge` is therefore called from the
calling thread while `events()` runs on the producer thread: implementations record the position
and report it from their own loop (as PostgreSQL's standby status update does).

Errors: an exception with `transient = True` (the flag `resources.subscribers.errors` sets; any
exception carrying it counts) is retried: seal what is complete, drop the rest, wait (1 s doubling
to `max_backoff`, reset once a seal succeeds after reconnecting), resume from the durable
position. Anything else (a refused event, a non-transient source error) seals what is complete and
is raised. A finite source (the generator with `changes=N`) ending is a clean finish.

Also a command for tests and demos: `python -m resources.ingest --generator-seed S --buffer DIR`.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from resources import stop_signals
from resources.buffer import ChangeBuffer, WriterLockHeld
from resources.buffer.lease import DEFAULT_LEASE_S
from resources.buffer.object_storage import table_storage
from resources.subscribers.events import (
    Event,
    ResumesWithSchema,
    ResyncBegin,
    ResyncEnd,
    SnapshotBatch,
    Subscriber,
    TxEnd,
)

log = logging.getLogger(__name__)
WRITER_POLL_S = 2.0  # how often a standing-by ingest asks for the buffer's writer role

_CHUNK_EVENTS = 1024  # events per queue item at most; a chunk also ends at every boundary
_QUEUE_CHUNKS = 64
_PUT_TIMEOUT_S = 0.1
_JOIN_TIMEOUT_S = 5.0


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: those flagged `transient = True` by the source."""
    return getattr(exc, "transient", False) is True


@dataclass(slots=True)
class IngestResult:
    """How a `run_ingest` call ended."""

    durable_position: str | None
    events: int = 0
    seals: int = 0
    reconnects: int = 0
    finished: bool = False  # the source ended by itself (a finite source)


class _End:
    """The source's stream ended cleanly."""


@dataclass(frozen=True, slots=True)
class _Failure:
    error: Exception


_Item = list[Event] | _End | _Failure


class _Producer:
    """Reads `subscriber.events(start)` on a thread into a bounded queue, in boundary-ended chunks.

    Chunks end at every TxEnd/ResyncBegin/ResyncEnd (the only places a seal can happen, so chunking
    never delays durability; a ResyncBegin may be followed by a long wait for the source's copy to
    start) or after `_CHUNK_EVENTS` events.
    """

    def __init__(self, subscriber: Subscriber, start: str | None) -> None:
        self.queue: queue.Queue[_Item] = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._subscriber = subscriber
        self._start = start
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-source", daemon=True)
        self._thread.start()

    def _put(self, item: _Item) -> bool:
        while not self._halt.is_set():
            try:
                self.queue.put(item, timeout=_PUT_TIMEOUT_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        chunk: list[Event] = []
        try:
            for event in self._subscriber.events(self._start):
                chunk.append(event)
                # A batch of copied rows is a chunk of its own: the queue holds at most that many batches.
                if isinstance(event, TxEnd | ResyncBegin | ResyncEnd | SnapshotBatch) or len(chunk) >= _CHUNK_EVENTS:
                    if not self._put(chunk):
                        return
                    chunk = []
            if chunk and not self._put(chunk):
                return
            self._put(_End())
        except Exception as exc:  # handed to the consumer, which decides
            if chunk and not self._put(chunk):
                return
            self._put(_Failure(exc))

    def halt(self, subscriber_close: bool) -> None:
        """Stop reading: unblock the queue, optionally close the source, wait for the thread."""
        self._halt.set()
        if subscriber_close:
            self._subscriber.close()
        while True:  # drain so a blocked put returns promptly
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=_JOIN_TIMEOUT_S)


def run_ingest(
    subscriber: Subscriber,
    buffer: ChangeBuffer,
    *,
    stop: threading.Event,
    on_error: Callable[[Exception, float], None] | None = None,
    max_backoff: float = 30.0,
    initial_backoff: float = 1.0,
) -> IngestResult:
    """Feed `subscriber` into `buffer` until `stop` is set or the source ends; see the module doc.

    `on_error(exc, delay_s)` is told about each transient error before the retry wait (default:
    a warning in the log). Returns with the buffer sealed through the last complete transaction;
    the caller closes the buffer and the subscriber.
    """
    result = IngestResult(buffer.durable_position())
    report = on_error or (lambda exc, delay: log.warning("table %s: source error, retrying in %.1fs: %s",
                                                         buffer.table, delay, exc))
    tick = max(0.01, min(buffer.seal_interval / 4, 0.25))
    backoff = initial_backoff
    reconnected = False

    def acknowledge() -> None:
        result.seals += 1
        durable = buffer.durable_position()
        result.durable_position = durable
        if durable is not None:
            subscriber.acknowledge(durable)

    while not stop.is_set():
        if isinstance(subscriber, ResumesWithSchema):
            subscriber.resume_schema(buffer.durable_schema())
        producer = _Producer(subscriber, buffer.durable_position())
        failure: Exception | None = None
        try:
            while not stop.is_set():
                try:
                    item = producer.queue.get(timeout=tick)
                except queue.Empty:
                    if buffer.seal_if_due():
                        acknowledge()
                    continue
                if isinstance(item, _End):
                    result.finished = True
                    break
                if isinstance(item, _Failure):
                    failure = item.error
                    break
                for event in item:
                    result.events += 1
                    if buffer.append(event):
                        acknowledge()
                        if reconnected:
                            backoff, reconnected = initial_backoff, False
        except BaseException:
            _settle(buffer, producer, acknowledge, close=True)
            raise
        _settle(buffer, producer, acknowledge, close=failure is None)
        if failure is None:
            break
        if not is_transient(failure):
            raise failure
        report(failure, backoff)
        result.reconnects += 1
        reconnected = True
        if stop.wait(backoff):
            break
        backoff = min(backoff * 2, max_backoff)
    result.durable_position = buffer.durable_position()
    return result


def _settle(buffer: ChangeBuffer, producer: _Producer, acknowledge: Callable[[], None], *, close: bool) -> None:
    """Stop the source, seal every complete transaction, acknowledge it, forget the rest.

    The source is stopped first so nothing more arrives; the partial transaction dropped by
    `rollback` is re-sent from the durable position by the next `events()` call.
    """
    producer.halt(subscriber_close=close)
    try:
        if buffer.seal():
            acknowledge()
    finally:
        buffer.rollback()


def writer_when_free(open_writer: Callable[[], ChangeBuffer], stop: threading.Event, *,
                     poll_s: float = WRITER_POLL_S, name: str = "") -> ChangeBuffer | None:
    """The buffer's writer, waiting while another process (maybe on another host) holds it.

    One writer per table: a second ingest stands by and takes over when the first stops, or when
    its lease runs out after it died (S3 buffers; a local buffer's lock goes with the process).
    None when stopped while waiting. Open the subscriber lazily (nothing connects before its
    events are read), so standing by holds no replication slot.
    """
    announced = ""
    while not stop.is_set():
        try:
            return open_writer()
        except WriterLockHeld as held:
            if str(held) != announced:
                log.info("%s: standing by: %s", name or "ingest", held)
                announced = str(held)
        stop.wait(poll_s)
    return None


# --- command line (tests, demos) ----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m resources.ingest",
                                description="Run the ingest loop from the generator source into a buffer.")
    p.add_argument("--buffer", required=True, help="buffer root: a directory or s3://bucket/prefix "
                   "(endpoint and credentials from the AWS environment, e.g. AWS_ENDPOINT_URL_S3)")
    p.add_argument("--lease", type=float, default=DEFAULT_LEASE_S, help="writer lease seconds (S3 roots)")
    p.add_argument("--generator-seed", type=int, required=True)
    p.add_argument("--table", default="public.users")
    p.add_argument("--rows", type=int, default=1000, help="rows in the initial load")
    p.add_argument("--changes", type=int, default=None, help="stop after N changes (default: endless)")
    p.add_argument("--rate", type=float, default=None, help="changes per second (default: unpaced)")
    p.add_argument("--truncate", type=float, default=0.0, help="truncate weight in the mix (default 0)")
    p.add_argument("--resync-every", type=int, default=0, help="re-sync after every N transactions")
    p.add_argument("--seal-interval", type=float, default=1.0)
    p.add_argument("--seal-changes", type=int, default=100_000)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT or the end of a finite stream; prints the result as one JSON line."""
    from resources.subscribers.generator import DEFAULT_MIX, GeneratorSubscriber

    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()

    stop_signals.install(stop)
    subscriber = GeneratorSubscriber(args.table, seed=args.generator_seed, rows=args.rows, changes=args.changes,
                                     rate=args.rate, mix={**DEFAULT_MIX, "truncate": args.truncate},
                                     resync_every=args.resync_every)
    started = time.monotonic()
    from resources.work_storage import WorkRoot

    storage = table_storage(WorkRoot.open(args.buffer), args.table, lease_seconds=args.lease)
    buffer = writer_when_free(lambda: ChangeBuffer(args.buffer, args.table, ordering=subscriber.ordering,
                                                   seal_interval=args.seal_interval, seal_changes=args.seal_changes,
                                                   storage=storage), stop, poll_s=min(WRITER_POLL_S, args.lease / 3))
    if buffer is None:
        return 1
    with buffer:
        try:
            result = run_ingest(subscriber, buffer, stop=stop)
        finally:
            subscriber.close()
    print(json.dumps({**asdict(result), "elapsed_s": round(time.monotonic() - started, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
