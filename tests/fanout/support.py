"""Test helpers for the laredo client and the fan-out server.

- `ScriptedSource`: an in-memory Subscriber that tests push transactions into; every `events()`
  call is an independent cursor over the same history (two fan-out servers can share one source,
  like two laredo instances replicating one database), and `state_at` / `changes_between` are the
  oracle the client's output is checked against.
- `Collector`: runs a subscriber's `events()` in a thread and records what it yields.
- `check_history`: the exactness check — every committed boundary's changes equal the source's.
- `TcpProxy`: a connection-level balancer whose target can be switched (GoAway hand-off).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.events import (
    ChangeEvent,
    Column,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from resources.subscribers.replication_wire import columns_to_proto, row_to_struct
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.positions import compare_lsn, format_lsn, parse_lsn

TABLE = "public.items"
COLUMNS = (
    Column("id", "bigint", nullable=False, primary_key=True, ordinal=1, primary_key_ordinal=1),
    Column("tenant", "bigint", ordinal=2),
    Column("name", "text", ordinal=3),
)
SCHEMA = TableSchema(TABLE, COLUMNS)

Change = tuple[Action, Row | None, Row | None]


def apply(rows: dict[Any, Row], action: Action, old: Row | None, new: Row | None) -> None:
    if action is Action.TRUNCATE:
        rows.clear()
    elif action is Action.DELETE:
        assert old is not None
        rows.pop(old["id"], None)
    else:
        assert new is not None
        if old is not None and old["id"] != new["id"]:
            rows.pop(old["id"], None)
        rows[new["id"]] = new


@dataclass(frozen=True)
class Tx:
    position: str
    changes: tuple[Change, ...]
    resync: bool = False  # the source re-syncs here (a full snapshot at `position`)


class ScriptedSource:
    """An in-memory source of one table whose transactions the test commits."""

    ordering = "lsn"

    def __init__(self, rows: Sequence[Row] = (), *, start_lsn: int = 0x1_0000, step: int = 0x100) -> None:
        self._cond = threading.Condition()
        self._initial = {r["id"]: dict(r) for r in rows}
        self._initial_position = format_lsn(start_lsn)
        self._next_lsn = start_lsn + step
        self._step = step
        self._txs: list[Tx] = []
        self._closed = False

    # --- writing ---

    def commit(self, *changes: Change) -> str:
        with self._cond:
            position = format_lsn(self._next_lsn)
            self._next_lsn += self._step
            self._txs.append(Tx(position, tuple(changes)))
            self._cond.notify_all()
            return position

    def insert(self, ident: int, tenant: int = 1, name: str | None = None) -> str:
        return self.commit((Action.INSERT, None, {"id": ident, "tenant": tenant, "name": name or f"n{ident}"}))

    def resync(self) -> None:
        """Make every reader re-sync: a full snapshot at the current head, no data change."""
        with self._cond:
            self._txs.append(Tx(self.head_locked(), (), resync=True))
            self._cond.notify_all()

    def head_locked(self) -> str:
        return self._txs[-1].position if self._txs else self._initial_position

    @property
    def head(self) -> str:
        with self._cond:
            return self._txs[-1].position if self._txs else self._initial_position

    # --- oracle ---

    def state_at(self, position: str) -> dict[Any, Row]:
        rows = {k: dict(v) for k, v in self._initial.items()}
        with self._cond:
            txs = list(self._txs)
        for tx in txs:
            if compare_lsn(tx.position, position) > 0:
                break
            for action, old, new in tx.changes:
                apply(rows, action, old, new)
        return rows

    def changes_between(self, after: str, upto: str) -> list[tuple[str, Change]]:
        with self._cond:
            txs = list(self._txs)
        return [(tx.position, change) for tx in txs
                if compare_lsn(tx.position, after) > 0 and compare_lsn(tx.position, upto) <= 0
                for change in tx.changes]

    # --- Subscriber ---

    def events(self, start: str | None) -> Iterator[Event]:
        yield SchemaEvent(SCHEMA)
        with self._cond:
            if start is None:
                done = len(self._txs)
                position = self._txs[-1].position if self._txs else self._initial_position
            else:
                done = sum(1 for tx in self._txs if compare_lsn(tx.position, start) <= 0)
        if start is None:
            yield ResyncBegin("initial load")
            rows = self.state_at(position)
            for row in rows.values():
                yield SnapshotRow(row)
            yield ResyncEnd(position, len(rows))
        while True:
            with self._cond:
                self._cond.wait_for(functools.partial(self._has_more, done), timeout=0.2)
                if self._closed:
                    return
                pending = self._txs[done:]
            for tx in pending:
                if tx.resync:
                    yield ResyncBegin("source re-sync")
                    rows = self.state_at(tx.position)
                    yield from (SnapshotRow(row) for row in rows.values())
                    yield ResyncEnd(tx.position, len(rows))
                    continue
                for action, old, new in tx.changes:
                    yield ChangeEvent(tx.position, action, old, new)
                yield TxEnd(tx.position)
            done += len(pending)

    def _has_more(self, done: int) -> bool:
        return self._closed or len(self._txs) > done

    def acknowledge(self, position: str) -> None:
        pass

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Collector:
    """Consumes `subscriber.events(start)` in a thread; `wait(pred)` for what it has yielded."""

    def __init__(self, subscriber: Any, start: str | None = None) -> None:
        self.subscriber = subscriber
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(start,), daemon=True)
        self._thread.start()

    def _run(self, start: str | None) -> None:
        try:
            for event in self.subscriber.events(start):
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()
            with self._cond:
                self._cond.notify_all()

    def wait(self, predicate: Callable[[list[Event]], bool], timeout: float = 10.0) -> list[Event]:
        end = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.events):
                if self.done.is_set():
                    raise AssertionError(f"subscriber stopped early: {self.error!r}; events: {self.events}")
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out; events so far: {self.events}")
                self._cond.wait(min(remaining, 0.1))
            return list(self.events)

    def wait_error(self, timeout: float = 10.0) -> BaseException:
        assert self.done.wait(timeout), f"subscriber still running; events: {self.events}"
        assert self.error is not None, "subscriber ended without an error"
        return self.error

    def snapshot(self) -> list[Event]:
        with self._cond:
            return list(self.events)

    def stop(self) -> None:
        self.subscriber.close()
        self.done.wait(5.0)


def tx_ends(events: list[Event]) -> list[TxEnd]:
    return [e for e in events if isinstance(e, TxEnd)]


def committed_to(position: str) -> Callable[[list[Event]], bool]:
    """Predicate: a boundary (TxEnd or ResyncEnd) at or beyond `position` was emitted."""
    def predicate(events: list[Event]) -> bool:
        return any(isinstance(e, (TxEnd, ResyncEnd)) and compare_lsn(e.position, position) >= 0 for e in events)
    return predicate


@dataclass
class History:
    resyncs: list[str] = field(default_factory=list)  # ResyncBegin reasons
    boundaries: list[str] = field(default_factory=list)


def check_history(events: list[Event], source: ScriptedSource, *, start: str | None = None,
                  row_filter: Callable[[Action, Row | None, Row | None], bool] | None = None) -> History:
    """Assert the events replay the source exactly: no loss, no duplicate, no reordering.

    Every TxEnd(P) must be preceded (since the previous boundary) by exactly the source's changes in
    (previous boundary, P], each carrying its own position; every ResyncEnd(P) by a snapshot equal
    to the source's table at P; boundaries strictly advance and are never empty.
    """
    history = History()
    accept = row_filter or (lambda action, old, new: True)
    boundary = start
    high = parse_lsn(start) if start else None
    changes: list[tuple[str, Change]] = []
    snapshot: dict[Any, Row] | None = None
    for event in events:
        if isinstance(event, ResyncBegin):
            history.resyncs.append(event.reason)
            snapshot, changes = {}, []
        elif isinstance(event, SnapshotRow):
            assert snapshot is not None, "snapshot row outside a re-sync"
            snapshot[event.row["id"]] = event.row
        elif isinstance(event, ResyncEnd):
            assert snapshot is not None
            assert event.position, "empty snapshot position"
            lsn = parse_lsn(event.position)
            assert lsn is not None and (high is None or lsn >= high), (event.position, high)
            expected = {k: v for k, v in source.state_at(event.position).items()
                        if accept(Action.INSERT, None, v)}
            assert snapshot == expected, f"snapshot at {event.position} differs from the source"
            assert event.row_count == len(snapshot)
            boundary, high, snapshot = event.position, lsn, None
            history.boundaries.append(event.position)
        elif isinstance(event, ChangeEvent):
            assert event.position, "change without a position"
            changes.append((event.position, (event.action, event.old, event.new)))
        elif isinstance(event, TxEnd):
            lsn = parse_lsn(event.position)
            assert event.position and lsn is not None, f"bad boundary {event.position!r}"
            assert high is None or lsn > high, f"boundary {event.position} does not advance past {high}"
            assert all(p == event.position for p, _ in changes), (event.position, changes)
            want = [(p, c) for p, c in source.changes_between(boundary or "", event.position) if accept(*c)]
            if not event.extra:
                assert changes == want, f"changes up to {event.position} differ:\n got {changes}\n want {want}"
            boundary, high, changes = event.position, lsn, []
            history.boundaries.append(event.position)
        else:
            assert isinstance(event, SchemaEvent)
    return history


class TcpProxy:
    """A TCP forwarder whose target can change: new connections go to the current target."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(32)
        self.port = int(self._sock.getsockname()[1])
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        with self._lock:
            for conn in self._conns:
                conn.close()


class Sleeps:
    """An injectable `sleep` that records delays instead of sleeping; `then` runs after call n."""

    def __init__(self, actions: dict[int, Callable[[], object]] | None = None, real: float = 0.0) -> None:
        self.delays: list[float] = []
        self._actions = actions or {}
        self._real = real

    def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        action = self._actions.get(len(self.delays))
        if action is not None:
            action()
        if self._real:
            time.sleep(self._real)


# --- scripted protocol messages (for handlers that play a server's part) ------------------------


def msg_handshake(mode: pb.SyncMode, *, columns: bool = True) -> pb.SyncResponse:
    return pb.SyncResponse(handshake=pb.SyncHandshake(
        mode=mode, columns=columns_to_proto(COLUMNS) if columns else []))


def msg_snapshot(sequence: int, rows: Sequence[Row]) -> list[pb.SyncResponse]:
    out = [pb.SyncResponse(snapshot_begin=pb.SnapshotBegin(snapshot_id="s", sequence=sequence, row_count=len(rows)))]
    for row in rows:
        message = pb.SyncResponse()
        row_to_struct(message.snapshot_row.row, row, lambda: "row")
        out.append(message)
    out.append(pb.SyncResponse(snapshot_end=pb.SnapshotEnd(sequence=sequence, rows_sent=len(rows))))
    return out


def msg_entry(sequence: int, position: str, ident: int, action: Action = Action.INSERT) -> pb.SyncResponse:
    entry = pb.ReplicationJournalEntry(sequence=sequence, source_position=position, action=action.value)
    row = {"id": ident, "tenant": 1, "name": f"e{ident}"}
    if action is Action.DELETE:
        row_to_struct(entry.old_values, {"id": ident}, lambda: "old")
    elif action is not Action.TRUNCATE:
        row_to_struct(entry.new_values, row, lambda: "new")
    return pb.SyncResponse(journal_entry=entry)


def msg_heartbeat() -> pb.SyncResponse:
    return pb.SyncResponse(heartbeat=pb.Heartbeat(current_sequence=0))


def hold_open(alive: Callable[[], bool], timeout: float = 20.0) -> None:
    """Keep a scripted stream open (no messages) until the client goes away."""
    end = time.monotonic() + timeout
    while alive() and time.monotonic() < end:
        time.sleep(0.02)
