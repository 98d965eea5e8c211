"""The laredo fan-out client: a Subscriber that replicates one table from laredo-server's Sync stream.

`LaredoSubscriber(url, schema, table, protocol="connect")` speaks the Connect protocol over
HTTP/1.1 (what a stock laredo-server serves in plaintext) or gRPC over HTTP/2, and turns the
stream into the project's events. The position rules (boundaries only on real positions, the
sequence fallback, the snapshot's position, resume de-duplication) are in `laredo_sequencer`;
this module owns the connections:

- one reader thread per stream pushes messages into a bounded queue (back-pressure reaches the
  server through TCP when the consumer is slow); the consumer runs in the caller's thread;
- heartbeat silence: a stream that delivers nothing for `heartbeat_timeout` seconds is dead, it is
  closed and the client reconnects (time spent waiting for the consumer does not count);
- reconnect on any transient error and on a clean end, with backoff `backoff_initial` doubling to
  `backoff_max`, reset after a healthy stream (one that delivered data or a heartbeat after its
  handshake — a server that accepts and hangs up at once is not healthy);
- errors: INVALID_ARGUMENT / NOT_FOUND (and the other request-level codes) are permanent and raised
  from `events()` naming the table and the server's message; RESOURCE_EXHAUSTED / UNAVAILABLE and
  connection failures are retried;
- GoAway hand-off: the old stream is consumed until its deadline while a new one is dialed with
  the last resumable position (`last_known_sequence = 0`). The new stream's messages are held
  back until it has caught up — it delivered a position beyond everything the old stream
  delivered, or a heartbeat at or beyond it — or the old stream ends; then the old stream is
  closed and the held messages replayed through the sequencer's de-duplication, so no change is
  applied twice or out of order. Switching early is always correct (de-duplication is by
  position, not timing); waiting only avoids moving to a lagging server. A new stream that
  answers FULL_SNAPSHOT is abandoned (its snapshot would have to be held in memory); the client
  then reconnects normally when the old stream ends.

`acknowledge()` is a no-op: laredo-server keeps no per-client state to release (its journal is
bounded by size and age, not by client progress), and resumption is driven entirely by the
position the client sends, i.e. the buffer's durable position.
"""

from __future__ import annotations

import http.client
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import DEFAULT_MAX_FRAME_BYTES, FramingError, TruncatedStream
from resources.subscribers.errors import (
    KeyMismatch,
    ProtocolError,
    SourceConfigError,
    SourceError,
    SourceUnavailable,
    UnknownTable,
)
from resources.subscribers.events import Column, Event, TableSchema
from resources.subscribers.laredo_sequencer import Sequencer
from resources.subscribers.laredo_transport import SyncStream, Transport, make_transport
from resources.subscribers.replication_filters import Filter, parse_filters
from resources.subscribers.replication_wire import Code, StatusError, schema_from_columns
from resources.subscribers.tls import ClientTls, TlsError
from snapshot_assets.archive.keys import DEFAULT_KEY_FIELDS
from snapshot_assets.archive.positions import parse_lsn

log = logging.getLogger(__name__)

DEFAULT_SEQUENCE_FALLBACK_AFTER = 10_000
#: Messages a new stream may hold back during a hand-off before the client switches anyway.
HANDOFF_BUFFER_LIMIT = 50_000
_QUEUE_DEPTH = 256
_POLL_S = 0.25


@dataclass
class LaredoStats:
    """Counters for operators and tests (read them from another thread; they only grow)."""

    connects: int = 0
    reconnects: int = 0
    handoffs: int = 0
    heartbeat_timeouts: int = 0
    last_error: str | None = None
    sleeps: deque[float] = field(default_factory=lambda: deque(maxlen=100))  # recent backoff delays


# --- one stream and its reader thread -----------------------------------------------------------


class _End:
    """The stream ended cleanly."""


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


_Item = pb.SyncResponse | _End | _Failed


class _Stream:
    """A Sync call read by its own thread into the shared queue; `close()` from any thread."""

    def __init__(self, transport: Transport, request: pb.SyncRequest,
                 out: queue.Queue[tuple[_Stream, _Item]], label: str) -> None:
        self.request = request
        self.label = label
        self._transport = transport
        self._out = out
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._inner: SyncStream | None = None
        self._putting = False
        self.last_rx = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"laredo-{label}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            inner = self._transport.open(self.request)
            with self._lock:
                self._inner = inner
                closed = self._closed.is_set()
            if closed:
                inner.close()
                return
            for message in inner.messages():
                self.last_rx = time.monotonic()
                if not self._put(message):
                    return
            self._put(_End())
        except BaseException as exc:  # handed to the consumer, which decides
            self._put(_Failed(exc))

    def _put(self, item: _Item) -> bool:
        self._putting = True
        try:
            while not self._closed.is_set():
                try:
                    self._out.put((self, item), timeout=_POLL_S)
                except queue.Full:
                    continue
                self.last_rx = time.monotonic()
                return True
            return False
        finally:
            self._putting = False

    def silent_for(self) -> float:
        """Seconds without a message; 0 while the reader waits for the consumer (not the server)."""
        if self._putting:
            return 0.0
        return time.monotonic() - self.last_rx

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            inner = self._inner
        if inner is not None:
            try:
                inner.close()
            except Exception:  # closing a broken connection may fail; it is closed either way
                log.debug("closing %s stream failed", self.label, exc_info=True)


# --- the subscriber -----------------------------------------------------------------------------


class _Run:
    """The streams of one `events()` iteration and the queue their readers fill.

    Kept per iteration so that a generator being finalised (or a second iteration on the same
    subscriber) never closes or reads another iteration's streams.
    """

    def __init__(self, transport: Transport, stats: LaredoStats) -> None:
        self.queue: queue.Queue[tuple[_Stream, _Item]] = queue.Queue(maxsize=_QUEUE_DEPTH)
        self._transport = transport
        self._stats = stats
        self._streams: set[_Stream] = set()
        self._lock = threading.Lock()

    def open(self, request: pb.SyncRequest, label: str) -> _Stream:
        self._stats.connects += 1
        stream = _Stream(self._transport, request, self.queue, label)
        with self._lock:
            self._streams.add(stream)
        return stream

    def drop(self, stream: _Stream) -> None:
        stream.close()
        with self._lock:
            self._streams.discard(stream)

    def close_all(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            self.drop(stream)


@dataclass
class _Successor:
    """The stream dialed after a GoAway, held back until it has caught up."""

    stream: _Stream
    dial_lsn: int
    held: list[pb.SyncResponse] = field(default_factory=list)
    handshaken: bool = False
    max_lsn: int | None = None
    heartbeat: bool = False


@dataclass
class _Outcome:
    healthy: bool
    error: SourceError | None
    goaway: bool = False


class LaredoSubscriber:
    """A Subscriber for one table served by laredo-server (or this project's fan-out server).

    `filters`: column predicates (`{"field": "tenant_id", "equals": 42}`, `prefix`, `in`), applied
    by the server. `key_fields`: the configured key (empty: not configured), checked against the
    key columns the server reports, and assumed when it reports none (`_keyed`).
    `sequence_fallback_after`: positionless entries before the sequence-derived fallback (see
    `laredo_sequencer`). `sequence_resume`: also resume by `last_known_sequence` when no position
    is known — sequences are per server instance, so enable it only when the URL always reaches
    the same instance; it is never used after a GoAway. `tls` (`source.tls`): TLS on either
    transport; a certificate problem is a SourceConfigError, never retried. `sleep` and `clock`
    (unix seconds, for GoAway deadlines) are injectable for tests.
    """

    ordering = "lsn"

    def __init__(
        self,
        url: str,
        schema: str,
        table: str,
        *,
        protocol: str = "connect",
        client_id: str = "",
        filters: Sequence[Filter | Mapping[str, Any]] = (),
        heartbeat_timeout: float = 30.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        sequence_fallback_after: int = DEFAULT_SEQUENCE_FALLBACK_AFTER,
        key_fields: Sequence[str] = (),
        sequence_resume: bool = False,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        tls: ClientTls | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.schema_name = schema
        self.table_name = table
        self.name = f"{schema}.{table}"
        if not schema or not table:
            raise SourceConfigError(self.name or "laredo", "schema and table are required")
        try:
            self.filters = parse_filters(filters)
        except ValueError as exc:
            raise SourceConfigError(self.name, f"bad filter: {exc}") from None
        if heartbeat_timeout <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise SourceConfigError(self.name, "heartbeat_timeout and backoff_initial must be positive and "
                                               "backoff_max at least backoff_initial")
        if sequence_fallback_after < 1:
            raise SourceConfigError(self.name, "sequence_fallback_after must be at least 1")
        try:
            self._transport: Transport = make_transport(url, protocol, max_frame_bytes=max_frame_bytes, tls=tls)
        except (ValueError, TlsError) as exc:
            raise SourceConfigError(self.name, str(exc)) from None
        self.protocol = protocol
        self.client_id = client_id or f"snapshotter-{self.name}"
        self.heartbeat_timeout = heartbeat_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.sequence_fallback_after = sequence_fallback_after
        self.key_fields = tuple(key_fields)
        self.sequence_resume = sequence_resume
        self.stats = LaredoStats()
        self._closed = threading.Event()
        self._sleep: Callable[[float], object] = sleep if sleep is not None else self._closed.wait
        self._clock = clock
        self._runs: set[_Run] = set()
        self._runs_lock = threading.Lock()
        self._schema: TableSchema | None = None

    # --- Subscriber ---------------------------------------------------------------------------

    def events(self, start: str | None) -> Iterator[Event]:
        """Events from `start` (None: initial full load) until `close()` or a permanent error."""
        start = start or None
        if start is not None and parse_lsn(start) is None:
            raise SourceConfigError(self.name, f"start position {start!r} is not a WAL LSN")
        sequencer = Sequencer(self.name, start, fallback_after=self.sequence_fallback_after,
                              check_row_count=not self.filters, schema_of=self.schema_from_columns)
        delay = self.backoff_initial
        after_goaway = False
        run = _Run(self._transport, self.stats)
        with self._runs_lock:
            self._runs.add(run)
        try:
            while not self._closed.is_set():
                request = self._request(sequencer, allow_sequence=not after_goaway)
                outcome = yield from self._session(run, sequencer, request)
                if self._closed.is_set():
                    return
                after_goaway = outcome.goaway
                if outcome.error is not None:
                    self.stats.last_error = str(outcome.error)
                    if not outcome.error.transient:
                        raise outcome.error
                if outcome.healthy:
                    delay = self.backoff_initial
                reason = outcome.error or "the server ended the stream"
                log.warning("laredo %s via %s: %s; reconnecting in %.1fs", self.name, self.url, reason, delay)
                self.stats.reconnects += 1
                self.stats.sleeps.append(delay)
                self._sleep(delay)
                delay = min(delay * 2, self.backoff_max)
        finally:
            run.close_all()
            with self._runs_lock:
                self._runs.discard(run)

    def acknowledge(self, position: str) -> None:
        """No-op: laredo keeps no per-client state to release; resume is by the position sent."""

    def close(self) -> None:
        """Stop every `events()` iteration (they return at their next step) and drop their streams."""
        self._closed.set()
        with self._runs_lock:
            runs = list(self._runs)
        for run in runs:
            run.close_all()
        self._transport.close()

    # --- requests and streams -----------------------------------------------------------------

    def _request(self, sequencer: Sequencer, *, allow_sequence: bool) -> pb.SyncRequest:
        """The Sync request resuming after the sequencer's anchor (or its sequence, same server only)."""
        request = pb.SyncRequest(schema=self.schema_name, table=self.table_name, client_id=self.client_id,
                                 filters=[f.to_proto() for f in self.filters])
        if sequencer.resumable and sequencer.anchor:
            request.last_known_source_position = sequencer.anchor
        elif allow_sequence and self.sequence_resume:
            handle = sequencer.sequence_handle
            if handle is not None:
                request.last_known_sequence = handle
        return request

    # --- one session: a stream, and its successor after a GoAway ------------------------------

    def _session(self, run: _Run, sequencer: Sequencer, request: pb.SyncRequest) -> Generator[Event, None, _Outcome]:
        session = _Session(self, run, sequencer, run.open(request, "stream"))
        try:
            while not self._closed.is_set():
                try:
                    stream, item = run.queue.get(timeout=session.wait_timeout())
                except queue.Empty:
                    stream, item = None, None
                session.check_liveness()
                if stream is not None and item is not None:
                    session.receive(stream, item)
                yield from sequencer.take()
                if session.outcome is not None:
                    return session.outcome
            return _Outcome(healthy=False, error=None, goaway=session.goaway)
        except SourceError as exc:
            yield from sequencer.take()
            return _Outcome(healthy=session.healthy, error=exc, goaway=session.goaway)
        finally:
            session.close()

    def _error(self, exc: BaseException) -> SourceError:
        """A transport failure as a SourceError naming the table, the server and the cause."""
        where = f"laredo server {self.url} ({self.protocol})"
        if isinstance(exc, SourceError):
            return exc
        if isinstance(exc, TlsError):
            return SourceConfigError(self.name, f"{where}: {exc}")
        if isinstance(exc, StatusError):
            cause = f"{where} returned {exc.code.wire_name}: {exc.message}"
            if exc.code is Code.NOT_FOUND:
                return UnknownTable(self.name, cause)
            if not exc.transient:
                return SourceConfigError(self.name, cause)
            return SourceUnavailable(self.name, cause)
        if isinstance(exc, TruncatedStream):
            return SourceUnavailable(self.name, f"connection to {where} lost mid-frame: {exc}")
        if isinstance(exc, FramingError):
            return ProtocolError(self.name, f"malformed frame from {where}: {exc}")
        if isinstance(exc, (OSError, http.client.HTTPException)):
            return SourceUnavailable(self.name, f"{where}: {exc!r}")
        return SourceError(self.name, f"unexpected failure talking to {where}: {exc!r}")

    def schema_from_handshake(self, handshake: pb.SyncHandshake) -> TableSchema:
        """The handshake's columns (kept when non-empty; else the last ones seen), keyed and checked."""
        if handshake.columns:
            return self.schema_from_columns(handshake.columns)
        return self._keyed(self._schema or TableSchema(self.name, ()))

    def schema_from_columns(self, columns: Iterable[pb.ColumnDefinition]) -> TableSchema:
        """The schema of reported columns (a handshake, a schema change), keyed and checked."""
        return self._keyed(schema_from_columns(self.name, columns))

    def _keyed(self, schema: TableSchema) -> TableSchema:
        """`schema` with its key checked against `key_fields`, or assumed when the server reports none.

        When the server reports key columns, they are the table's key and configured `key_fields`
        must equal them (KeyMismatch names both). When it reports none (laredo-server sends no
        columns), the configured `key_fields`, or laredo's default `[id]`, become the key.
        """
        reported = schema.key_fields
        if reported and self.key_fields and reported != self.key_fields:
            raise KeyMismatch(self.name, self.key_fields, reported, "primary key",
                              f"as the laredo server {self.url} reports it")
        if not reported:
            schema = _with_key(schema, self.key_fields or DEFAULT_KEY_FIELDS)
        self._schema = schema
        return schema


def _with_key(schema: TableSchema, key_fields: Sequence[str]) -> TableSchema:
    """`schema` with `key_fields` as its primary key (columns added when the server sent none)."""
    by_name = {c.name: c for c in schema.columns}
    columns = list(schema.columns)
    for i, name in enumerate(key_fields, start=1):
        column = by_name.get(name)
        keyed = Column(name, column.type if column else "", nullable=False, primary_key=True,
                       ordinal=column.ordinal if column else len(columns) + 1, primary_key_ordinal=i)
        if column is None:
            columns.append(keyed)
        else:
            columns[columns.index(column)] = keyed
    return TableSchema(schema.table, tuple(columns))


class _Session:
    """The consumer side of one connection attempt: a primary stream, maybe a successor."""

    def __init__(self, owner: LaredoSubscriber, run: _Run, sequencer: Sequencer, primary: _Stream) -> None:
        self.owner = owner
        self.run = run
        self.sequencer = sequencer
        self.primary = primary
        self.handshaken = False
        self.healthy = False
        self.goaway = False
        self.deadline: float | None = None  # unix seconds
        self.successor: _Successor | None = None
        self.successor_failed = False
        self.outcome: _Outcome | None = None

    # --- timing -------------------------------------------------------------------------------

    def _streams(self) -> list[_Stream]:
        streams = [self.primary]
        if self.successor is not None:
            streams.append(self.successor.stream)
        return streams

    def wait_timeout(self) -> float:
        timeout = _POLL_S
        for stream in self._streams():
            timeout = min(timeout, max(0.0, self.owner.heartbeat_timeout - stream.silent_for()))
        if self.deadline is not None:
            timeout = min(timeout, max(0.0, self.deadline - self.owner._clock()))
        return max(timeout, 0.001)

    def check_liveness(self) -> None:
        limit = self.owner.heartbeat_timeout
        successor = self.successor
        if successor is not None and successor.stream.silent_for() > limit:
            self._successor_failed(f"no message for {limit:g}s")
        if self.primary.silent_for() > limit:
            self.owner.stats.heartbeat_timeouts += 1
            self._primary_ended(SourceUnavailable(self.owner.name, f"no message from laredo server "
                                                                   f"{self.owner.url} for {limit:g}s (no heartbeat)"))
        elif self.deadline is not None and self.owner._clock() >= self.deadline:
            self._primary_ended(None)

    # --- messages -----------------------------------------------------------------------------

    def receive(self, stream: _Stream, item: _Item) -> None:
        if stream is self.primary:
            if isinstance(item, _End):
                self._primary_ended(None)
            elif isinstance(item, _Failed):
                self._primary_ended(self.owner._error(item.error))
            else:
                self._primary_message(item)
        elif self.successor is not None and stream is self.successor.stream:
            if isinstance(item, _End):
                self._successor_failed("ended before the hand-off")
            elif isinstance(item, _Failed):
                self._successor_failed(str(self.owner._error(item.error)))
            else:
                self._successor_message(item)
        # anything else comes from a stream already abandoned

    def _primary_message(self, message: pb.SyncResponse) -> None:
        kind = message.WhichOneof("message")
        if not self.handshaken:
            self._handshake(message, self.primary.request)
            return
        if kind == "go_away":
            self._go_away(message.go_away)
            return
        if kind == "snapshot_begin" and self.successor is not None:
            # The successor resumes from a position this snapshot supersedes: dial again after it.
            self._successor_failed("the old stream started a snapshot")
            self.successor_failed = False
        self.sequencer.message(message)
        if kind in ("journal_entry", "heartbeat", "snapshot_end"):
            self.healthy = True
        self._maybe_dial()
        self._maybe_switch()

    def _handshake(self, message: pb.SyncResponse, request: pb.SyncRequest) -> None:
        if message.WhichOneof("message") != "handshake":
            raise ProtocolError(self.owner.name, f"the stream's first message is "
                                                 f"{message.WhichOneof('message') or 'empty'}, not a handshake")
        handshake = message.handshake
        if handshake.mode == pb.SYNC_MODE_UNSPECIFIED:
            raise ProtocolError(self.owner.name, "the handshake has no sync mode")
        resuming = bool(request.last_known_source_position) or request.last_known_sequence > 0
        if not resuming and handshake.mode in (pb.SYNC_MODE_DELTA, pb.SYNC_MODE_DELTA_FROM_SNAPSHOT):
            raise ProtocolError(self.owner.name, "the server answered a request without a resume position "
                                                 "with a delta: there is no snapshot to apply it to")
        schema = self.owner.schema_from_handshake(handshake)
        self.sequencer.begin_stream(by_position=bool(request.last_known_source_position),
                                    by_sequence=request.last_known_sequence > 0)
        self.sequencer.schema(schema)
        self.handshaken = True

    def _go_away(self, go_away: pb.GoAway) -> None:
        if self.goaway:
            return
        self.goaway = True
        if go_away.drain_deadline_unix_ms > 0:
            self.deadline = go_away.drain_deadline_unix_ms / 1000.0
        log.info("laredo %s: server %s is going away (%s); handing off", self.owner.name, self.owner.url,
                 go_away.reason or "no reason")
        self._maybe_dial()

    # --- hand-off -----------------------------------------------------------------------------

    def _maybe_dial(self) -> None:
        if not self.goaway or self.successor is not None or self.successor_failed:
            return
        anchor = self.sequencer.anchor
        if not self.sequencer.resumable or anchor is None:
            return  # mid-snapshot: nothing to resume from yet; the stream keeps going
        request = self.owner._request(self.sequencer, allow_sequence=False)
        dial_lsn = parse_lsn(anchor)
        assert dial_lsn is not None
        self.successor = _Successor(self.run.open(request, "successor"), dial_lsn)

    def _successor_message(self, message: pb.SyncResponse) -> None:
        successor = self.successor
        assert successor is not None
        kind = message.WhichOneof("message")
        if not successor.handshaken:
            if kind != "handshake":
                self._successor_failed(f"its first message is {kind or 'empty'}, not a handshake")
                return
            if message.handshake.mode == pb.SYNC_MODE_FULL_SNAPSHOT:
                self._successor_failed("it cannot resume from the position (answered with a full snapshot)")
                return
            successor.handshaken = True
        elif kind == "snapshot_begin":
            self._successor_failed("it sent a snapshot")
            return
        elif kind == "heartbeat":
            successor.heartbeat = True
        elif kind == "go_away":
            self._successor_failed("it is going away too")
            return
        elif kind == "journal_entry" and message.journal_entry.source_position:
            lsn = parse_lsn(message.journal_entry.source_position)
            if lsn is not None and (successor.max_lsn is None or lsn > successor.max_lsn):
                successor.max_lsn = lsn
        successor.held.append(message)
        self._maybe_switch()

    def _successor_failed(self, why: str) -> None:
        if self.successor is None:
            return
        log.warning("laredo %s: hand-off stream abandoned: %s", self.owner.name, why)
        self.run.drop(self.successor.stream)
        self.successor = None
        self.successor_failed = True

    def _maybe_switch(self) -> None:
        successor = self.successor
        if successor is None or not successor.handshaken:
            return
        old = max(self.sequencer.seen_lsn or 0, successor.dial_lsn)
        new = max(successor.max_lsn or 0, successor.dial_lsn)
        if (successor.max_lsn is not None and successor.max_lsn > old) or (successor.heartbeat and new >= old) \
                or len(successor.held) >= HANDOFF_BUFFER_LIMIT:
            self._switch()

    def _switch(self) -> None:
        successor = self.successor
        assert successor is not None
        self.run.drop(self.primary)
        self.owner.stats.handoffs += 1
        self.primary = successor.stream
        self.successor = None
        self.successor_failed = False
        self.goaway = False
        self.deadline = None
        self.handshaken = False
        held = successor.held
        log.info("laredo %s: switched to the new stream (%d held messages; resuming after %s, %d change(s) "
                 "already delivered beyond it)", self.owner.name, len(held), self.sequencer.anchor,
                 self.sequencer.after_anchor)
        for message in held:
            self._primary_message(message)

    def _primary_ended(self, error: SourceError | None) -> None:
        if self.outcome is not None:
            return
        if self.successor is not None and (error is None or error.transient):
            self._switch()  # even before its handshake: it will arrive on the promoted stream
            return
        self.outcome = _Outcome(healthy=self.healthy, error=error, goaway=self.goaway)

    def close(self) -> None:
        self.run.drop(self.primary)
        if self.successor is not None:
            self.run.drop(self.successor.stream)
