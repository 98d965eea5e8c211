"""The capture buffer: per-writer durable logs, the events not yet in a page, and the flush triggers.

`publish` validates a whole request first (nothing is written for a request that fails), assigns
each event its writer's next sequence, appends it to the writer's log and returns only after the
log is fsync'd through it (group commit, log.py). A writer is flushed when it holds `max_events`
events or `page_limit_bytes` payload bytes (at once, in full pages), when its oldest event reaches
`max_age_seconds` (a timer checks every writer, so a quiet writer is not kept waiting for its next
event), when its session disconnects, and at shutdown. One flush runs per writer at a time; pages
are cut by the same rule everywhere, and each page is marked flushed in the log only after the
destination (or the dead-letter directory) holds it and its index record is queued, so recovery
after kill -9 re-flushes exactly the events no stored page was marked for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from resources.capture.flush import PageStore, StoredPage
from resources.capture.index import IndexQueue
from resources.capture.log import Segment, WriterLog, encode_record
from resources.capture.metrics import CaptureMetrics, WriterGauge
from resources.capture.settings import CaptureSettings
from resources.proto.prism.snapshotter.page_pb2 import Event

log = logging.getLogger(__name__)


class PublishRejected(ValueError):
    """A publish request that breaks a rule (empty topic, payload over the limit): nothing was written."""


@dataclass(frozen=True)
class Publication:
    topic: str
    payload: bytes
    attributes: Mapping[str, str]


@dataclass(frozen=True)
class Ack:
    message_id: str
    sequence: int


@dataclass
class _Writer:
    log: WriterLog
    next_sequence: int
    pending: list[Event] = field(default_factory=list)
    pending_bytes: int = 0
    oldest: float | None = None  # monotonic time the oldest pending event arrived
    last_timestamp: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    flush_lock: threading.Lock = field(default_factory=threading.Lock)
    scheduled: bool = False


def message_id(writer_id: str, sequence: int) -> str:
    return f"{writer_id}:{sequence}"


def event_size(event: Event) -> int:
    return len(event.payload) + sum(len(k) + len(v) for k, v in event.attributes.items())


class CaptureBuffer:
    def __init__(self, settings: CaptureSettings, store: PageStore, index: IndexQueue,
                 metrics: CaptureMetrics) -> None:
        self.settings, self.store, self.index, self.metrics = settings, store, index, metrics
        self.root = Path(settings.buffer.path) / "writers"
        self._writers: dict[str, _Writer] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="capture-flush")
        self._timer = threading.Thread(target=self._age_timer, name="capture-age-timer", daemon=True)
        metrics.watch_buffers(self.gauges)

    # ---- lifecycle --------------------------------------------------------------------------------

    def open(self) -> None:
        """Recover every writer's durable unflushed events and schedule their flush; start the age timer.

        The flushes run in the background: a storage outage at startup delays pages, not serving."""
        for writer_id in WriterLog.writers(self.root):
            wlog = WriterLog(self.root, writer_id)
            recovered = wlog.recover()
            w = _Writer(wlog, recovered.next_sequence)
            for event in recovered.events:
                self._add_pending(w, event)
            self._writers[writer_id] = w
            if w.pending:
                log.info("capture: recovered %d unflushed events of writer %s", len(w.pending), writer_id)
                self._schedule(writer_id, force=True)
        self._timer.start()

    def close(self, *, flush: bool = True) -> None:
        """Stop the timer, flush every writer (unless `flush` is False) and close the logs. A writer
        whose flush fails keeps its events in the durable log for the next start."""
        self._stop.set()
        if self._timer.is_alive():
            self._timer.join()
        self._pool.shutdown(wait=True)
        for writer_id, w in list(self._writers.items()):
            try:
                if flush:
                    self.flush(writer_id, force=True)
            except Exception as exc:
                log.warning("capture: writer %s not flushed at shutdown (kept for the next start): %s", writer_id, exc)
            finally:
                w.log.close()

    # ---- publish ----------------------------------------------------------------------------------

    def check(self, pub: Publication) -> None:
        if not pub.topic:
            raise PublishRejected("topic (the writer id) is empty")
        limit = self.settings.buffer.max_payload_bytes
        if len(pub.payload) > limit:
            raise PublishRejected(f"payload of {len(pub.payload)} bytes is over the limit of {limit} bytes "
                                  "(capture.buffer.max_payload_bytes)")

    def publish(self, pubs: Sequence[Publication]) -> list[Ack]:
        """Append `pubs` durably; their acknowledgements, in order. Validates all before writing any."""
        for pub in pubs:
            self.check(pub)
        if self._stop.is_set():
            raise RuntimeError("the capture buffer is shutting down")
        syncs: dict[int, tuple[Segment, int]] = {}
        by_writer: dict[str, list[int]] = {}
        for i, pub in enumerate(pubs):
            by_writer.setdefault(pub.topic, []).append(i)
        results: dict[int, Ack] = {}
        writers = {writer_id: self._writer(writer_id) for writer_id in sorted(by_writer)}
        with ExitStack() as held:  # every writer of the request at once (in id order: no deadlock)
            for w in writers.values():
                held.enter_context(w.lock)
            staged = self._append_all(writers, by_writer, pubs)
            for writer_id, (segment, events) in staged.items():
                w = writers[writer_id]
                w.next_sequence += len(events)
                syncs[id(segment)] = (segment, segment.written)
                for i, event in zip(by_writer[writer_id], events, strict=True):
                    self._add_pending(w, event)
                    results[i] = Ack(message_id(writer_id, event.sequence), event.sequence)
        for segment, offset in syncs.values():
            segment.sync_through(offset)
        acks = [results[i] for i in range(len(pubs))]
        for writer_id in by_writer:
            if self._full(self._writers[writer_id]):
                self._schedule(writer_id)
        return acks

    def _append_all(self, writers: Mapping[str, _Writer], by_writer: Mapping[str, list[int]],
                    pubs: Sequence[Publication]) -> dict[str, tuple[Segment, list[Event]]]:
        """Append each writer's events (caller holds every writer's lock); if one append fails (disk
        full), cut the others back off before raising, so a request is in the log whole or not at all."""
        staged: dict[str, tuple[Segment, list[Event]]] = {}
        done: list[tuple[Segment, int]] = []
        try:
            for writer_id, w in writers.items():
                now = max(time.time_ns() // 1_000_000, w.last_timestamp)  # never goes back within a writer
                events = [Event(event_id=message_id(writer_id, w.next_sequence + k), timestamp=now,
                                payload=pubs[i].payload, attributes=dict(pubs[i].attributes),
                                sequence=w.next_sequence + k) for k, i in enumerate(by_writer[writer_id])]
                data = b"".join(encode_record(e) for e in events)
                segment = w.log.append(data, events[0].sequence)
                done.append((segment, segment.written - len(data)))
                staged[writer_id] = (segment, events)
        except OSError:
            for segment, offset in done:
                segment.truncate(offset)
            raise
        return staged

    def _add_pending(self, w: _Writer, event: Event) -> None:
        if not w.pending:
            w.oldest = time.monotonic()
        w.pending.append(event)
        w.pending_bytes += event_size(event)
        w.last_timestamp = max(w.last_timestamp, event.timestamp)

    def _writer(self, writer_id: str) -> _Writer:
        with self._lock:
            w = self._writers.get(writer_id)
            if w is None:
                w = self._writers[writer_id] = _Writer(WriterLog(self.root, writer_id), 0)
            return w

    # ---- flush ------------------------------------------------------------------------------------

    def _full(self, w: _Writer) -> bool:
        return len(w.pending) >= self.settings.buffer.max_events or w.pending_bytes >= self.settings.page_limit_bytes

    def _cut(self, w: _Writer, force: bool) -> list[Event]:
        """The next page's events (caller holds the writer's lock): a full page, or with `force` what
        there is; pages are cut at `max_events` events or once `page_limit_bytes` is reached."""
        count, size = 0, 0
        for event in w.pending:
            count += 1
            size += event_size(event)
            if count >= self.settings.buffer.max_events or size >= self.settings.page_limit_bytes:
                break
        else:
            if not force or not count:
                return []
        page = w.pending[:count]
        del w.pending[:count]
        w.pending_bytes -= sum(event_size(e) for e in page)
        w.oldest = w.oldest if w.pending else None  # the rest arrived later: an early bound, never a late one
        if not w.pending:
            w.log.rotate()  # everything in the current segment is in this page or an earlier one
        return page

    def _schedule(self, writer_id: str, *, force: bool = False) -> Future[None] | None:
        w = self._writers[writer_id]
        with w.lock:
            if w.scheduled:
                return None
            w.scheduled = True
        try:
            return self._pool.submit(self._flush_scheduled, writer_id, force)
        except RuntimeError:  # the pool is shut down: close() flushes instead
            w.scheduled = False
            return None

    def _flush_scheduled(self, writer_id: str, force: bool) -> None:
        w = self._writers[writer_id]
        with w.lock:
            w.scheduled = False
        try:
            self.flush(writer_id, force=force)
        except Exception:
            log.exception("capture: flushing writer %s failed; its events stay in the durable log", writer_id)

    def flush(self, writer_id: str, *, force: bool) -> list[StoredPage]:
        """Write `writer_id`'s full pages (all its events with `force`); the pages stored, in order."""
        w = self._writers.get(writer_id)
        if w is None:
            return []
        stored: list[StoredPage] = []
        with w.flush_lock:
            while True:
                with w.lock:
                    page = self._cut(w, force)
                    log_end = w.next_sequence
                if not page:
                    return stored
                w.log.sync()  # a page never holds an event its publisher was not told is durable
                try:
                    result = self.store.store(writer_id, page)
                    self.index.enqueue(result)
                except BaseException:
                    with w.lock:  # back in front: the log still has them, the next flush retries
                        w.pending[:0] = page
                        w.pending_bytes += sum(event_size(e) for e in page)
                        w.oldest = w.oldest or time.monotonic()
                    raise
                w.log.mark_flushed(page[-1].sequence + 1, log_end)
                stored.append(result)

    def disconnect(self, writer_ids: Iterable[str]) -> list[StoredPage]:
        """A session ended: flush its writers now, before answering it (RFC-023's disconnect guarantee)."""
        stored: list[StoredPage] = []
        if not self.settings.buffer.flush_on_disconnect:
            return stored
        for writer_id in sorted(set(writer_ids)):
            self.metrics.disconnect()
            stored.extend(self.flush(writer_id, force=True))
        return stored

    def _age_timer(self) -> None:
        max_age = self.settings.buffer.max_age_seconds
        tick = min(1.0, max(max_age / 4, 0.05))
        while not self._stop.wait(tick):
            now = time.monotonic()
            for writer_id, w in list(self._writers.items()):
                if w.oldest is not None and now - w.oldest >= max_age:
                    self._schedule(writer_id, force=True)

    # ---- observation ------------------------------------------------------------------------------

    def gauges(self) -> dict[str, WriterGauge]:
        now = time.monotonic()
        return {writer_id: WriterGauge(w.pending_bytes, len(w.pending), now - w.oldest if w.oldest else 0.0)
                for writer_id, w in list(self._writers.items())}

    def health(self) -> dict[str, float | int]:
        gauges = self.gauges().values()
        max_age = self.settings.buffer.max_age_seconds
        return {"active_writers": sum(1 for g in gauges if g.event_count),
                "total_buffered_events": sum(g.event_count for g in gauges),
                "total_buffer_size_bytes": sum(g.size_bytes for g in gauges),
                "oldest_buffer_age_seconds": max((g.age_seconds for g in gauges), default=0.0),
                "writers_exceeding_age_limit": sum(1 for g in gauges if g.age_seconds > max_age)}
