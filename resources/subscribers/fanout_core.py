"""The fan-out server's logic, independent of the transport: replica, journal, Sync sessions.

`FanoutCore` consumes any Subscriber (in production the PostgreSQL source) and keeps what
laredo's fan-out target keeps:

- an in-memory replica of the table, updated one source transaction at a time (at TxEnd), so a
  snapshot taken for a client is always transaction-consistent;
- a bounded journal of the last `journal_size` changes with per-server sequence numbers and the
  source's own positions;
- the sessions of connected clients (at most `max_clients`).

`sync(request, alive)` is the Sync RPC as a generator of responses; listeners (Connect, gRPC)
only move its messages and turn `StatusError` into their status. It follows the spec:

- resume by `last_known_source_position` when the journal still covers it (DELTA: entries whose
  position is after it), else by `last_known_sequence` when covered (same server), else
  FULL_SNAPSHOT built from the replica; a position ahead of the server is not covered either;
- heartbeats after `heartbeat_interval` seconds of silence;
- GoAway(reason, deadline) once when draining, streaming on until the deadline;
- errors: INVALID_ARGUMENT (no schema/table, bad filter), NOT_FOUND (another table),
  RESOURCE_EXHAUSTED (max clients), UNAVAILABLE (initial load not done, source failed, a client
  fell behind the journal, the source re-synced — the client then resumes and gets a snapshot).

The journal's coverage is exact: `floor` is the position of the newest pruned entry (or of the
last source re-sync); a client at a position ≥ floor and ≤ head has every change after it in
the journal.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.errors import SourceError
from resources.subscribers.events import (
    ChangeEvent,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    Subscriber,
    TableSchema,
    TxEnd,
)
from resources.subscribers.replication_filters import RowFilter, compile_filters
from resources.subscribers.replication_wire import (
    Code,
    StatusError,
    columns_to_proto,
    datetime_to_timestamp,
    row_to_struct,
)
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.gojson import marshal
from snapshot_assets.archive.positions import comparator

log = logging.getLogger(__name__)

_POLL_S = 0.25
_BATCH = 512

Alive = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class _Record:
    sequence: int
    position: str
    action: Action | None  # None: a schema change
    old: Row | None
    new: Row | None
    message: pb.SyncResponse  # built once, shared by every client


class _Journal:
    """Sequence-numbered records, bounded; a list with a moving start keeps slicing O(batch)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._records: list[_Record] = []
        self._start = 0

    def __len__(self) -> int:
        return len(self._records) - self._start

    def append(self, record: _Record) -> _Record | None:
        """Append; return the record pruned to stay within `size`, if any."""
        self._records.append(record)
        if len(self) <= self.size:
            return None
        pruned = self._records[self._start]
        self._start += 1
        if self._start > 1024 and self._start * 2 > len(self._records):
            del self._records[: self._start]
            self._start = 0
        return pruned

    def clear(self) -> None:
        self._records = []
        self._start = 0

    def oldest_sequence(self) -> int:
        return self._records[self._start].sequence if len(self) else 0

    def after(self, sequence: int, limit: int) -> list[_Record]:
        """Records with a sequence above `sequence` (sequences are contiguous)."""
        if not len(self):
            return []
        index = self._start + max(0, sequence - self.oldest_sequence() + 1)
        return self._records[index: index + limit]

    def __iter__(self) -> Iterator[_Record]:
        return itertools.islice(self._records, self._start, None)


@dataclass
class _Session:
    ident: int
    client_id: str
    connected_at: float


class FanoutCore:
    """Serves one table from `subscriber` to Sync clients (see the module docstring)."""

    def __init__(self, subscriber: Subscriber, schema: str, table: str, *, journal_size: int = 10_000,
                 heartbeat_interval: float = 5.0, max_clients: int = 100) -> None:
        if journal_size < 1 or heartbeat_interval <= 0 or max_clients < 1:
            raise ValueError("journal_size and max_clients must be at least 1, heartbeat_interval positive")
        self.schema_name = schema
        self.table_name = table
        self.name = f"{schema}.{table}"
        self.heartbeat_interval = heartbeat_interval
        self.max_clients = max_clients
        self._subscriber = subscriber
        self._cmp = comparator(subscriber.ordering)
        self._cond = threading.Condition()
        self._journal = _Journal(journal_size)
        self._replica: dict[bytes, Row] = {}
        self._schema: TableSchema | None = None
        self._next_sequence = 1
        self._floor: str | None = None  # resume positions >= floor are covered
        self._floor_sequence = 0  # resume sequences >= this are covered
        self._floor_exclusive = False  # after a source re-sync: the floor itself is not covered
        self._head: str | None = None
        self._epoch = 0  # bumped by a source re-sync: live sessions must start over
        self._ready = threading.Event()
        self._failure: str | None = None
        self._draining: tuple[str, float | None] | None = None
        self._stopping = False
        self._sessions: dict[int, _Session] = {}
        self._session_ids = itertools.count(1)
        self.sessions_started = 0
        self.full_snapshots = 0
        # Ingest state (ingest thread only).
        self._resync_rows: dict[bytes, Row] | None = None
        self._tx: list[ChangeEvent] = []
        self._thread = threading.Thread(target=self._ingest, name=f"fanout-ingest-{self.name}", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the initial load is in the replica (False on timeout or failure)."""
        self._ready.wait(timeout)
        return self._ready.is_set() and self._failure is None

    @property
    def failure(self) -> str | None:
        return self._failure

    def go_away(self, reason: str = "admin", deadline_s: float | None = 30.0) -> None:
        """Tell every client (now and later) to hand off; streams end at the deadline (None: never)."""
        deadline = None if deadline_s is None else time.time() + deadline_s
        with self._cond:
            self._draining = (reason, deadline)
            self._cond.notify_all()

    def client_count(self) -> int:
        with self._cond:
            return len(self._sessions)

    def wait_clients_gone(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._cond:
            while self._sessions:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, _POLL_S))
            return True

    def stop(self) -> None:
        """End every stream cleanly and stop ingesting (the subscriber is closed)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._subscriber.close()
        self._ready.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def stats(self) -> dict[str, object]:
        with self._cond:
            return {
                "table": self.name,
                "clients": len(self._sessions),
                "sessions_started": self.sessions_started,
                "full_snapshots": self.full_snapshots,
                "rows": len(self._replica),
                "journal_entries": len(self._journal),
                "current_sequence": self._next_sequence - 1,
                "journal_oldest_sequence": self._journal.oldest_sequence(),
                "head": self._head,
                "floor": self._floor,
                "draining": self._draining is not None,
                "failure": self._failure,
            }

    # --- ingest -------------------------------------------------------------------------------

    def _ingest(self) -> None:
        start: str | None = None
        delay = 1.0
        while not self._stopping:
            try:
                for event in self._subscriber.events(start):
                    if self._stopping:
                        return
                    self._apply(event)
                    delay = 1.0
                if self._stopping:
                    return
                log.info("fan-out %s: the source ended its stream; serving the replica as is", self.name)
                return
            except SourceError as exc:
                if self._stopping:
                    return
                if not exc.transient:
                    self._fail(str(exc))
                    return
                log.warning("fan-out %s: %s; resuming the source in %.0fs", self.name, exc, delay)
            except Exception as exc:
                if self._stopping:
                    return
                log.exception("fan-out %s: the source failed", self.name)
                self._fail(f"{type(exc).__name__}: {exc}")
                return
            self._resync_rows = None
            self._tx = []
            start = self._head
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, timeout=delay)
            delay = min(delay * 2, 30.0)

    def _fail(self, cause: str) -> None:
        log.error("fan-out %s: source failed permanently: %s", self.name, cause)
        with self._cond:
            self._failure = cause
            self._cond.notify_all()
        self._ready.set()

    def _key(self, row: Row | None) -> bytes:
        schema = self._schema
        fields = schema.key_fields if schema is not None else ()
        if row is None:
            return b""
        return marshal([row.get(f) for f in fields]) if fields else marshal(row)

    def _apply(self, event: Event) -> None:
        if isinstance(event, SchemaEvent):
            self._apply_schema(event.schema)
        elif isinstance(event, ResyncBegin):
            self._resync_rows = {}
            self._tx = []
        elif isinstance(event, SnapshotRow):
            if self._resync_rows is None:
                raise SourceError(self.name, "the source sent a snapshot row outside a re-sync")
            self._resync_rows[self._key(event.row)] = event.row
        elif isinstance(event, ResyncEnd):
            self._apply_resync(event.position)
        elif isinstance(event, ChangeEvent):
            if not event.position:
                raise SourceError(self.name, "the source sent a change without a position")
            self._tx.append(event)
        elif isinstance(event, TxEnd):
            self._apply_tx(event.position)

    def _apply_schema(self, schema: TableSchema) -> None:
        with self._cond:
            old = self._schema
            self._schema = schema
            if old is None or old == schema or not self._ready.is_set():
                return
            message = pb.SyncResponse(schema_change=pb.SchemaChangeNotification(
                sequence=self._next_sequence,
                old_columns=columns_to_proto(old.columns),
                new_columns=columns_to_proto(schema.columns),
            ))
            self._append(_Record(self._next_sequence, self._head or "", None, None, None, message))
            self._cond.notify_all()

    def _apply_resync(self, position: str) -> None:
        rows = self._resync_rows
        if rows is None:
            raise SourceError(self.name, "the source ended a re-sync it never began")
        self._resync_rows = None
        with self._cond:
            if self._ready.is_set():
                self._epoch += 1  # live clients reconnect and get a snapshot of the new replica
                log.warning("fan-out %s: the source re-synced at %s; clients start over", self.name, position)
            # After a re-sync the replica may differ from what the journal said at the same
            # position (that is why sources re-sync), so no client position is covered until
            # new changes arrive: everyone gets a snapshot of the new replica.
            self._floor_exclusive = self._ready.is_set()
            self._replica = rows
            self._journal.clear()
            self._floor = self._head = position
            self._floor_sequence = self._next_sequence - 1
            self._cond.notify_all()
        self._ready.set()

    def _apply_tx(self, position: str) -> None:
        changes, self._tx = self._tx, []
        if not position or not changes:
            return
        with self._cond:
            for change in changes:
                self._apply_change(change)
            self._head = position
            self._cond.notify_all()
        self._subscriber.acknowledge(position)  # the replica holds it; a restart reloads anyway

    def _apply_change(self, change: ChangeEvent) -> None:
        action, old, new = change.action, change.old, change.new
        if action is Action.TRUNCATE:
            self._replica.clear()
        elif action is Action.DELETE:
            self._replica.pop(self._key(old), None)
        else:
            if action is Action.UPDATE and old is not None:
                old_key = self._key(old)
                if old_key != self._key(new):
                    self._replica.pop(old_key, None)
            if new is not None:
                self._replica[self._key(new)] = new
        sequence = self._next_sequence
        entry = pb.ReplicationJournalEntry(sequence=sequence, source_position=change.position,
                                           action=action.value)
        if change.commit_time is not None:
            datetime_to_timestamp(entry.timestamp, change.commit_time)
        def describe() -> str:
            return f"change {sequence} of {self.name}"

        if old:
            row_to_struct(entry.old_values, old, describe)
        if new:
            row_to_struct(entry.new_values, new, describe)
        self._append(_Record(sequence, change.position, action, old, new, pb.SyncResponse(journal_entry=entry)))

    def _append(self, record: _Record) -> None:
        self._next_sequence = record.sequence + 1
        pruned = self._journal.append(record)
        if pruned is not None:
            self._floor_exclusive = False
            self._floor_sequence = pruned.sequence
            if pruned.position:
                self._floor = pruned.position

    # --- Sync ---------------------------------------------------------------------------------

    def sync(self, request: pb.SyncRequest, alive: Alive) -> Generator[pb.SyncResponse, None, None]:
        """The Sync RPC: raises StatusError before or during the stream (see the module docstring)."""
        if not request.schema or not request.table:
            raise StatusError(Code.INVALID_ARGUMENT, "schema and table are required")
        if (request.schema, request.table) != (self.schema_name, self.table_name):
            raise StatusError(Code.NOT_FOUND, f"no fan-out target for {request.schema}.{request.table}")
        if self._failure is not None:
            raise StatusError(Code.UNAVAILABLE, f"the source of {self.name} failed: {self._failure}")
        if not self._ready.is_set():
            raise StatusError(Code.UNAVAILABLE, f"{self.name}: initial load in progress")
        with self._cond:
            columns = [c.name for c in self._schema.columns] if self._schema else []
        try:
            row_filter = compile_filters(list(request.filters), columns)
        except ValueError as exc:
            raise StatusError(Code.INVALID_ARGUMENT, str(exc)) from None
        session = self._register(request.client_id)
        try:
            yield from self._stream(request, row_filter, alive)
        finally:
            with self._cond:
                self._sessions.pop(session.ident, None)
                self._cond.notify_all()

    def _register(self, client_id: str) -> _Session:
        with self._cond:
            if len(self._sessions) >= self.max_clients:
                raise StatusError(Code.RESOURCE_EXHAUSTED, f"max clients reached ({self.max_clients})")
            session = _Session(next(self._session_ids), client_id, time.time())
            self._sessions[session.ident] = session
            self.sessions_started += 1
            return session

    def _covers_position(self, position: str) -> bool:
        floor, head = self._floor, self._head
        if floor is None or head is None or self._cmp(position, head) > 0:
            return False
        above = self._cmp(position, floor)
        return above > 0 or (above == 0 and not self._floor_exclusive)

    def _covers_sequence(self, sequence: int, current: int) -> bool:
        lowest = self._floor_sequence + (1 if self._floor_exclusive else 0)
        return lowest <= sequence <= current

    def _resume_sequence_for(self, position: str) -> int:
        sequence = self._floor_sequence
        for record in self._journal:
            if record.position and self._cmp(record.position, position) > 0:
                break
            sequence = record.sequence
        return sequence

    def _stream(self, request: pb.SyncRequest, row_filter: RowFilter, alive: Alive) -> Iterator[pb.SyncResponse]:
        rows: list[Row] | None = None
        with self._cond:
            current = self._next_sequence - 1
            position = request.last_known_source_position
            if position and self._covers_position(position):
                mode, cursor = pb.SYNC_MODE_DELTA, self._resume_sequence_for(position)
            elif request.last_known_sequence > 0 and self._covers_sequence(request.last_known_sequence, current):
                mode, cursor = pb.SYNC_MODE_DELTA, request.last_known_sequence
            else:
                mode, cursor = pb.SYNC_MODE_FULL_SNAPSHOT, current
                rows = list(self._replica.values())
                self.full_snapshots += 1
            epoch = self._epoch
            handshake = pb.SyncHandshake(
                mode=mode, server_current_sequence=current, journal_oldest_sequence=self._journal.oldest_sequence(),
                resume_from_sequence=cursor,
                columns=columns_to_proto(self._schema.columns) if self._schema else [],
            )
        snapshot_id = f"{self.name}@{cursor}"
        if mode == pb.SYNC_MODE_FULL_SNAPSHOT:
            handshake.snapshot_id = snapshot_id
        yield pb.SyncResponse(handshake=handshake)
        if rows is not None:
            yield from self._snapshot(snapshot_id, cursor, rows, row_filter)
        yield from self._live(cursor, epoch, row_filter, alive)

    def _describe_row(self, index: int) -> str:
        return f"snapshot row {index} of {self.name}"

    def _snapshot(self, snapshot_id: str, sequence: int, rows: list[Row],
                  row_filter: RowFilter) -> Iterator[pb.SyncResponse]:
        selected = [row for row in rows if row_filter.matches_row(row)] if row_filter else rows
        yield pb.SyncResponse(snapshot_begin=pb.SnapshotBegin(snapshot_id=snapshot_id, sequence=sequence,
                                                              row_count=len(selected)))
        for i, row in enumerate(selected):
            message = pb.SyncResponse()
            row_to_struct(message.snapshot_row.row, row, functools.partial(self._describe_row, i))
            yield message
        yield pb.SyncResponse(snapshot_end=pb.SnapshotEnd(sequence=sequence, rows_sent=len(selected)))

    def _has_news(self, epoch: int, cursor: int, go_away_sent: bool) -> bool:
        return (self._stopping or self._epoch != epoch or self._next_sequence - 1 > cursor
                or (self._draining is not None and not go_away_sent))

    def _live(self, cursor: int, epoch: int, row_filter: RowFilter, alive: Alive) -> Iterator[pb.SyncResponse]:
        last_sent = time.monotonic()
        go_away_sent = False
        while True:
            with self._cond:
                self._cond.wait_for(
                    functools.partial(self._has_news, epoch, cursor, go_away_sent),
                    timeout=max(0.0, min(_POLL_S, self.heartbeat_interval - (time.monotonic() - last_sent))),
                )
                if self._stopping:
                    return
                if self._epoch != epoch:
                    raise StatusError(Code.UNAVAILABLE, f"the source of {self.name} re-synced; reconnect")
                if self._failure is not None:
                    raise StatusError(Code.UNAVAILABLE, f"the source of {self.name} failed: {self._failure}")
                if cursor < self._floor_sequence:
                    raise StatusError(Code.UNAVAILABLE, f"client fell behind the journal of {self.name}; "
                                                        "reconnect")
                batch = self._journal.after(cursor, _BATCH)
                current = self._next_sequence - 1
                draining = self._draining
            now = time.monotonic()
            if draining is not None and not go_away_sent:
                reason, deadline = draining
                yield pb.SyncResponse(go_away=pb.GoAway(
                    reason=reason, drain_deadline_unix_ms=0 if deadline is None else int(deadline * 1000)))
                go_away_sent, last_sent = True, now
            if draining is not None and draining[1] is not None and time.time() >= draining[1]:
                return
            for record in batch:
                cursor = record.sequence
                if record.action is None or row_filter.matches_change(record.action, record.old, record.new):
                    yield record.message
                    last_sent = time.monotonic()
            if not batch and time.monotonic() - last_sent >= self.heartbeat_interval:
                heartbeat = pb.Heartbeat(current_sequence=current)
                heartbeat.server_time.GetCurrentTime()
                yield pb.SyncResponse(heartbeat=heartbeat)
                last_sent = time.monotonic()
            if not alive():
                return
