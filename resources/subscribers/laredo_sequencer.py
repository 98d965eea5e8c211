"""Turns laredo Sync messages into Subscriber events with honest positions and boundaries.

This is the laredo client's state machine without any I/O: the subscriber feeds it the messages
of whichever stream is current and forwards the events it produces. Everything about positions
lives here.

Positions (ordering `lsn`)
    A journal entry's `source_position` is a WAL LSN (`%X/%08X`). Changes of one LSN are one
    transaction. laredo leaves the position empty for some entries; such an entry belongs to the
    *next* entry that carries a real position (it gets that position), so a boundary never falls
    on an empty or repeated position. `0/0` (PostgreSQL's invalid LSN) counts as empty.

Boundaries (TxEnd)
    laredo sends no transaction end. The group at position P is closed (TxEnd(P)) when an entry
    with a different real position arrives or a heartbeat arrives (the server had nothing more to
    send for a while). A stream that ends does not close the open group: a server cut off in the
    middle of a transaction would otherwise commit half of it. Changes are emitted as soon as
    their position is known, so a huge transaction is never held in memory; only entries that are
    still waiting for a position are.

Sequence fallback
    A server may send no positions at all for a long stretch (laredo without a position-aware
    source). After `fallback_after` positionless entries the waiting entries are committed at a
    sequence-derived position: previous boundary LSN + number of entries in the group (the
    journal-sequence distance; with no previous boundary it starts from 0/0, so a server that never
    sends positions gets `format_lsn(sequence)`), and the TxEnd carries
    `extra={"position_source": "sequence"}` so the manifest can say the boundary is not a source
    transaction boundary. Further positionless entries are committed the same way on every
    heartbeat or `fallback_after` entries, until a real position greater than the last committed
    one arrives. A real position that is not greater (it lies below a sequence-derived one) is
    treated as empty rather than moving the head backwards.

Snapshot position
    Snapshot rows carry no position, and the server's sequence is meaningless to the archive.
    The snapshot is gapless with the journal entries after `SnapshotEnd.sequence`, so when the
    first of them carries real position Q the snapshot is exactly the table at Q - 1 (LSN
    arithmetic: after every change it contains, before every change that follows, because commit
    LSNs of distinct transactions are distinct). ResyncEnd is therefore emitted lazily, at Q - 1,
    just before Q's changes. If a heartbeat (or the sequence fallback) comes first, the table is
    quiet and the position is sequence-derived: last emitted LSN + 1, or `format_lsn(snapshot
    sequence)` when nothing was ever emitted. Caveat of that quiet case: the snapshot's content
    may be newer than the source at that one position (the server never says which LSN it is
    at); every later boundary is exact again, because the changes after the snapshot are exactly
    the journal entries after it. ResyncEnd has no `extra` to mark this the way TxEnd is marked.
    A server whose snapshot lies behind what was already committed is a transient error (another
    instance, or the same one later, will be ahead).

Resume and de-duplication
    The resume handle is an *anchor*: the last position the server can resume after exactly (a
    real TxEnd, a Q - 1 snapshot position, or the start position), plus the number of changes
    already emitted after it. A new stream resumed by the anchor re-sends those changes (the
    open transaction, sequence-derived groups); the first `after_anchor` of them are skipped, and
    re-sent entries at or before the anchor are dropped. Both servers replicate the same source,
    so the changes after the anchor come in the same order on any instance. Resuming by sequence
    (same server only) skips entries whose sequence was already emitted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.errors import PositionRegression, ProtocolError, SourceUnavailable
from resources.subscribers.events import (
    ChangeEvent,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from resources.subscribers.replication_wire import (
    entry_images,
    parse_action,
    schema_from_columns,
    struct_to_row,
    timestamp_to_datetime,
)
from snapshot_assets.archive.positions import format_lsn, parse_lsn

SEQUENCE_SOURCE = {"position_source": "sequence"}


@dataclass(frozen=True, slots=True)
class _Change:
    sequence: int
    position: str  # "" when the entry has no usable position
    lsn: int | None
    event: ChangeEvent  # with an empty position, filled in when the group's position is known


_Item = _Change | SchemaEvent


@dataclass(slots=True)
class _Snapshot:
    sequence: int = 0
    rows: int = 0
    ended: bool = False


class Sequencer:
    """The laredo client's position state machine (see the module docstring)."""

    def __init__(self, table: str, start: str | None, *, fallback_after: int, check_row_count: bool = True,
                 schema_of: Callable[[Iterable[pb.ColumnDefinition]], TableSchema] | None = None) -> None:
        if fallback_after < 1:
            raise ValueError("fallback_after must be at least 1")
        self.table = table
        # How a schema change's columns become the table's schema (the subscriber checks its key).
        self._schema_of = schema_of or functools.partial(schema_from_columns, table)
        self._fallback_after = fallback_after
        self._check_rows = check_row_count
        self._out: list[Event] = []
        start_lsn = self._parse(start, "start position") if start else None
        # What has been emitted.
        self._high: int | None = start_lsn  # highest LSN of any emitted event
        self._real_boundary: int | None = start_lsn  # last boundary at a real (resumable) position
        self._open: str | None = None  # real position with emitted changes and no TxEnd yet
        self._open_lsn: int | None = None
        self._pending: list[_Item] = []  # positionless entries waiting for their position
        self._fallback = False  # this positionless stretch already used the sequence fallback
        self._schema: TableSchema | None = None
        # Resume handles.
        self._anchor: str | None = start or None
        self._after_anchor = 0
        self._last_sequence = 0  # server sequence of the last change (or snapshot) emitted
        # Per stream.
        self._last_real: int | None = start_lsn
        self._drop_le: int | None = None
        self._skip = 0
        self._skip_ceiling: int | None = None
        self._drop_sequence_le: int | None = None
        self._snapshot: _Snapshot | None = None
        self._after_snapshot = False  # no real position seen yet since this stream's snapshot

    # --- handles for the subscriber -----------------------------------------------------------

    @property
    def anchor(self) -> str | None:
        """The position a server can resume after exactly, or None (a full snapshot is needed)."""
        return self._anchor

    @property
    def after_anchor(self) -> int:
        """Changes emitted after the anchor (the open transaction, sequence-derived groups)."""
        return self._after_anchor

    @property
    def last_sequence(self) -> int:
        """The server sequence of the last change or snapshot emitted (same-server resume only)."""
        return self._last_sequence

    @property
    def sequence_handle(self) -> int | None:
        """The server sequence to resume after when no anchor exists (same server only), or None."""
        if self._anchor is not None or self._last_sequence <= 0:
            return None
        if self._snapshot is not None and not self._snapshot.ended:
            return None
        return self._last_sequence

    @property
    def seen_lsn(self) -> int | None:
        """Highest real LSN seen on the current stream (emitted or waiting), for hand-off."""
        return self._last_real

    @property
    def resumable(self) -> bool:
        """True when a resume by position is possible (no snapshot in flight)."""
        return self._anchor is not None and self._snapshot is None

    def take(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    # --- stream lifecycle ---------------------------------------------------------------------

    def begin_stream(self, *, by_position: bool, by_sequence: bool) -> None:
        """A new stream's handshake arrived: drop what was waiting and arm de-duplication.

        `by_position`: the request carried the anchor; `by_sequence`: it carried
        `last_sequence`. Entries waiting for a position are discarded: they come after the
        anchor, so the new stream sends them again.
        """
        self._pending.clear()  # `_fallback` survives: a server without positions stays one
        self._drop_le = self._skip_ceiling = self._drop_sequence_le = None
        self._skip = 0
        if self._snapshot is not None and not self._snapshot.ended:
            self._snapshot = None  # cut off mid-snapshot: the new stream must send a whole one
        self._after_snapshot = self._snapshot is not None  # ended, still waiting for its position
        anchor_lsn = parse_lsn(self._anchor) if self._anchor else None
        self._last_real = anchor_lsn
        if by_position and anchor_lsn is not None:
            self._drop_le = anchor_lsn
            self._skip = self._after_anchor
            self._skip_ceiling = self._high
        elif by_sequence:
            self._drop_sequence_le = self._last_sequence

    def schema(self, schema: TableSchema) -> None:
        """A schema (handshake columns, schema change), emitted in stream order if it changed."""
        if self._pending:
            self._pending.append(SchemaEvent(schema))
        else:
            self._emit_schema(SchemaEvent(schema))

    def message(self, message: pb.SyncResponse) -> None:
        """Process one message after the handshake (GoAway is the subscriber's business)."""
        kind = message.WhichOneof("message")
        if kind == "snapshot_begin":
            self._snapshot_begin(message.snapshot_begin)
        elif kind == "snapshot_row":
            self._snapshot_row(message.snapshot_row)
        elif kind == "snapshot_end":
            self._snapshot_end(message.snapshot_end)
        elif kind == "journal_entry":
            self._entry(message.journal_entry)
        elif kind == "schema_change":
            if message.schema_change.new_columns:
                self.schema(self._schema_of(message.schema_change.new_columns))
        elif kind == "heartbeat":
            self.heartbeat()
        elif kind == "handshake":
            raise ProtocolError(self.table, "server sent a second handshake on one stream")
        elif kind is None:
            raise ProtocolError(self.table, "server sent an empty SyncResponse (no message set)")

    def heartbeat(self) -> None:
        """The server had nothing more to send: close what can be closed."""
        if self._snapshot is not None and self._snapshot.ended:
            self._end_snapshot(self._snapshot_fallback_lsn(), synthetic=True)
        self._close_open()
        if self._pending and self._fallback:
            self._resolve_sequence()

    # --- snapshot -----------------------------------------------------------------------------

    def _snapshot_begin(self, begin: pb.SnapshotBegin) -> None:
        if self._snapshot is not None and not self._snapshot.ended:
            raise ProtocolError(self.table, "snapshot_begin inside a snapshot")
        reason = ("initial load" if self._high is None
                  else f"server sent a full snapshot (resume from {self._anchor or format_lsn(self._high)})")
        self._pending.clear()
        self._open = None  # its emitted changes are superseded by the snapshot
        self._open_lsn = None
        self._fallback = False
        self._drop_le = self._skip_ceiling = self._drop_sequence_le = None
        self._skip = 0
        self._anchor = None
        self._after_anchor = 0
        self._last_real = None
        self._snapshot = _Snapshot(sequence=begin.sequence)
        self._after_snapshot = True
        self._push(ResyncBegin(reason))

    def _snapshot_row(self, row: pb.SnapshotRow) -> None:
        if self._snapshot is None or self._snapshot.ended:
            raise ProtocolError(self.table, "snapshot_row outside a snapshot")
        if not row.HasField("row"):
            raise ProtocolError(self.table, f"snapshot row {self._snapshot.rows + 1} is not an object "
                                            "(SnapshotRow.row is missing or not a Struct)")
        self._snapshot.rows += 1
        self._push(SnapshotRow(struct_to_row(row.row)))

    def _snapshot_end(self, end: pb.SnapshotEnd) -> None:
        snapshot = self._snapshot
        if snapshot is None or snapshot.ended:
            raise ProtocolError(self.table, "snapshot_end without snapshot_begin")
        if self._check_rows and end.rows_sent != snapshot.rows:
            raise ProtocolError(self.table, f"snapshot_end says {end.rows_sent} rows were sent, "
                                            f"{snapshot.rows} arrived")
        snapshot.ended = True
        snapshot.sequence = end.sequence
        self._last_sequence = end.sequence

    def _snapshot_fallback_lsn(self) -> int:
        assert self._snapshot is not None
        if self._high is None:
            return max(1, self._snapshot.sequence)
        return self._high + 1

    def _end_snapshot(self, lsn: int, *, synthetic: bool) -> None:
        snapshot = self._snapshot
        assert snapshot is not None and snapshot.ended
        if self._high is not None and lsn < self._high:
            raise SourceUnavailable(self.table, f"the server's snapshot lies at {format_lsn(lsn)}, behind "
                                                f"{format_lsn(self._high)} already delivered; retrying "
                                                "until a server has caught up")
        position = format_lsn(lsn)
        self._snapshot = None
        self._high = lsn
        if not synthetic:
            self._anchor = position
            self._after_anchor = 0
            self._real_boundary = lsn
        self._push(ResyncEnd(position, snapshot.rows))

    # --- journal ------------------------------------------------------------------------------

    def _parse(self, position: str, what: str) -> int:
        lsn = parse_lsn(position)
        if lsn is None:
            raise ProtocolError(self.table, f"{what} {position!r} is not a WAL LSN (HI/LO hex)")
        return lsn

    def _decode(self, entry: pb.ReplicationJournalEntry) -> _Change:
        try:
            action = parse_action(entry.action)
            old, new = entry_images(entry, action)
            commit_time = timestamp_to_datetime(entry.timestamp) if entry.HasField("timestamp") else None
        except ValueError as exc:
            raise ProtocolError(self.table, f"journal entry {entry.sequence}: {exc}") from None
        position = entry.source_position
        lsn = self._parse(position, f"journal entry {entry.sequence} source_position") if position else None
        if lsn == 0:
            position, lsn = "", None
        event = ChangeEvent("", action, old, new, commit_time, entry.sequence)
        return _Change(entry.sequence, position, lsn, event)

    def _entry(self, entry: pb.ReplicationJournalEntry) -> None:
        if self._snapshot is not None and not self._snapshot.ended:
            raise ProtocolError(self.table, f"journal entry {entry.sequence} inside a snapshot")
        if self._drop_sequence_le is not None and 0 < entry.sequence <= self._drop_sequence_le:
            return  # already delivered by this server before the reconnect
        change = self._decode(entry)
        if change.lsn is None:
            self._pending.append(change)
            if self._waiting() >= self._fallback_after:
                self._resolve_sequence()
            return
        lsn = change.lsn
        if (self._drop_le is not None and lsn <= self._drop_le
                and (self._last_real is None or self._last_real <= self._drop_le)):
            self._pending.clear()  # a group the anchor already covers, re-sent by the server
            return
        if self._last_real is not None and lsn < self._last_real:
            raise PositionRegression(self.table, f"journal entry {entry.sequence} at {change.position} "
                                                 f"goes back from {format_lsn(self._last_real)}")
        self._last_real = lsn
        group = self._skip_resent([*self._pending, change])
        self._pending = []
        if not group:
            return
        self._place(group, change.position, lsn)

    def _waiting(self) -> int:
        changes = sum(1 for item in self._pending if isinstance(item, _Change))
        return changes - self._skip

    def _skip_resent(self, group: list[_Item]) -> list[_Item]:
        """Drop the first changes of `group` that were emitted before the reconnect."""
        if self._skip <= 0:
            return group
        kept: list[_Item] = []
        for item in group:
            if self._skip > 0 and isinstance(item, _Change):
                if item.lsn is not None and self._skip_ceiling is not None and item.lsn > self._skip_ceiling:
                    raise ProtocolError(
                        self.table,
                        f"the resumed stream does not repeat the {self._skip} change(s) already delivered "
                        f"after {self._anchor}: entry {item.sequence} at {item.position} is beyond "
                        f"{format_lsn(self._skip_ceiling)}",
                        transient=True,
                    )
                self._skip -= 1
                continue
            kept.append(item)
        return kept

    def _place(self, group: list[_Item], position: str, lsn: int) -> None:
        """Emit a group whose real position is known, or park it when the position is unusable."""
        if self._open_lsn == lsn:
            self._emit_group(group, position)
            return
        if self._after_snapshot:
            # The first real position after this stream's snapshot.
            self._after_snapshot = False
            if self._real_boundary is not None and lsn <= self._real_boundary:
                raise SourceUnavailable(self.table, f"the server's snapshot is followed by {position}, behind "
                                                    f"{format_lsn(self._real_boundary)} already committed; "
                                                    "retrying until a server has caught up")
            if self._snapshot is not None and self._snapshot.ended:
                self._end_snapshot(lsn - 1, synthetic=False)
        if self._high is None or lsn > self._high:
            self._close_open()
            self._fallback = False
            self._emit_group(group, position)
            self._open, self._open_lsn = position, lsn
            return
        if self._real_boundary is not None and lsn <= self._real_boundary:
            raise PositionRegression(self.table, f"change at {position} arrived after the boundary at "
                                                 f"{format_lsn(self._real_boundary)} was committed "
                                                 "(a heartbeat inside a transaction?)")
        # Below a sequence-derived boundary: usable only as an empty position.
        self._pending = [self._strip(item) for item in group]
        if self._waiting() >= self._fallback_after:
            self._resolve_sequence()

    @staticmethod
    def _strip(item: _Item) -> _Item:
        if isinstance(item, _Change):
            return _Change(item.sequence, "", None, item.event)
        return item

    def _resolve_sequence(self) -> None:
        """Commit the waiting entries at a sequence-derived position (see the module docstring)."""
        group = self._skip_resent(self._pending)
        self._pending = []
        changes = sum(1 for item in group if isinstance(item, _Change))
        if changes == 0:
            self._pending = group  # only schema events: they wait for the next change
            return
        if self._snapshot is not None and self._snapshot.ended:
            self._end_snapshot(self._snapshot_fallback_lsn(), synthetic=True)
        self._after_snapshot = False
        self._close_open()
        lsn = (self._high or 0) + changes
        position = format_lsn(lsn)
        self._emit_group(group, position)
        self._high = lsn
        self._fallback = True
        self._push(TxEnd(position, dict(SEQUENCE_SOURCE)))

    def _close_open(self) -> None:
        if self._open is None or self._open_lsn is None:
            return
        position, lsn = self._open, self._open_lsn
        self._open = self._open_lsn = None
        self._anchor = position
        self._after_anchor = 0
        self._real_boundary = lsn
        self._push(TxEnd(position))

    # --- emission -----------------------------------------------------------------------------

    def _emit_group(self, group: list[_Item], position: str) -> None:
        lsn = parse_lsn(position)
        for item in group:
            if isinstance(item, SchemaEvent):
                self._emit_schema(item)
                continue
            event = item.event
            self._push(ChangeEvent(position, event.action, event.old, event.new, event.commit_time, event.sequence))
            self._after_anchor += 1
            if item.sequence > 0:
                self._last_sequence = item.sequence
        if lsn is not None and (self._high is None or lsn > self._high):
            self._high = lsn

    def _emit_schema(self, event: SchemaEvent) -> None:
        if event.schema != self._schema:
            self._schema = event.schema
            self._push(event)

    def _push(self, event: Event) -> None:
        self._out.append(event)

