"""The open (not yet durable) part of the buffer: at most one row group of each stage in memory.

Change rows move through three stages:

    tail       the current, unfinished transaction (memory)
    committed  complete transactions waiting for the next row group (memory)
    writer     row groups already streamed into the segment's temporary file

A TxEnd moves the tail to `committed`; a full `committed` becomes a row group. A seal can therefore
always cut at the last TxEnd: everything before it is committed, the tail carries over to the next
segment. The one exception is a transaction bigger than a row group: its tail *spills* into the
temporary file of a segment of its own (the committed rows before it are sealed first), and until
its TxEnd that segment cannot be sealed. Either way a sealed segment never holds a partial
transaction, and memory never holds more than ~2 row groups, whatever the transaction or re-sync
size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from resources.buffer.hll import HyperLogLog
from resources.buffer.segments import (
    ResyncInfo,
    RowTuple,
    SegmentMeta,
    SegmentWriter,
    SnapshotStaging,
    encode_snapshot_row,
    encode_text_snapshot_batch,
    encode_text_snapshot_row,
)
from resources.buffer.storage import BufferStorage
from resources.subscribers.events import SnapshotBatch, SnapshotRow, TableSchema
from resources.subscribers.text_rows import TextSnapshotRow


@dataclass(frozen=True, slots=True)
class SealTarget:
    """Where a sealed segment goes and what it belongs to (decided by the buffer)."""

    number: int
    from_position: str | None
    table: str
    schema: TableSchema | None


class OpenBatch:
    """The open change segment. Seqs are assigned on arrival and rolled back if the tail is dropped."""

    def __init__(self, storage: BufferStorage, first_seq: int, row_group_rows: int) -> None:
        self._storage = storage
        self._row_group_rows = row_group_rows
        self._writer: SegmentWriter | None = None
        self._committed: list[RowTuple] = []
        self._tail: list[RowTuple] = []
        self._tail_keys: list[str] = []
        self._tail_arrival: float | None = None
        self._hll = HyperLogLog()
        self.spilled = False
        self.committed_rows = 0
        self.first_seq = first_seq
        self.next_seq = first_seq
        self.first_position: str | None = None
        self.first_arrival: float | None = None
        self.to_position: str | None = None  # the last TxEnd in this batch

    @property
    def tail_full(self) -> bool:
        return len(self._tail) >= self._row_group_rows

    @property
    def has_tail(self) -> bool:
        return bool(self._tail) or self.spilled

    def add(self, row: RowTuple, keys: list[str]) -> None:
        """One change of the current transaction (its seq must be `next_seq`)."""
        if not self.has_tail:
            self._tail_arrival = time.time()
        self._tail.append(row)
        self._tail_keys.extend(keys)
        self.next_seq += 1

    def _writer_open(self) -> SegmentWriter:
        if self._writer is None:
            self._writer = SegmentWriter(self._storage, "changes")
        return self._writer

    def _absorb_tail(self) -> list[RowTuple]:
        """Account the tail's rows to the segment (sketch, first row); returns them and clears it."""
        rows = self._tail
        if rows and self.first_position is None:
            self.first_position = rows[0][1]
            self.first_arrival = self._tail_arrival
        self._hll.update(self._tail_keys)
        self._tail, self._tail_keys = [], []
        return rows

    def spill_tail(self) -> None:
        """Stream the (oversized) tail into the temp file. Precondition: nothing committed is open."""
        if self.committed_rows:
            raise RuntimeError("seal the committed rows before spilling a transaction")
        self._writer_open().write(self._absorb_tail())
        self.spilled = True

    def commit(self, position: str) -> None:
        """A TxEnd: the current transaction is complete."""
        tail_rows = self.next_seq - self.first_seq - self.committed_rows
        rows = self._absorb_tail()
        if self.spilled:
            self._writer_open().write(rows)
            self.spilled = False
        else:
            self._committed.extend(rows)
            if len(self._committed) >= self._row_group_rows:
                self._writer_open().write(self._committed)
                self._committed = []
        self.committed_rows += tail_rows
        self.to_position = position

    def seal(self, target: SealTarget) -> SegmentMeta:
        """Seal the committed rows (through `to_position`) as one segment; the tail carries over."""
        if self.spilled or not self.committed_rows or self.to_position is None:
            raise RuntimeError("nothing sealable: no complete transaction, or one still spilling")
        writer = self._writer_open()
        writer.write(self._committed)
        meta = SegmentMeta(
            number=target.number, kind="changes", from_position=target.from_position,
            to_position=self.to_position, first_position=self.first_position, first_seq=self.first_seq,
            last_seq=self.first_seq + self.committed_rows - 1, changes=self.committed_rows,
            hll=self._hll.to_text(), first_arrival=self.first_arrival, sealed_at=time.time(),
        )
        sealed = writer.seal(meta, target.table, target.schema)
        self._writer, self._committed, self._hll = None, [], HyperLogLog()
        self.first_seq = meta.last_seq + 1
        self.committed_rows = 0
        self.first_position = self.first_arrival = self.to_position = None
        return sealed

    def discard(self) -> None:
        """Forget everything not sealed (the source re-sends it from the durable position)."""
        if self._writer is not None:
            self._writer.discard()
        self._writer, self._committed, self._hll = None, [], HyperLogLog()
        self._tail, self._tail_keys = [], []
        self.spilled = False
        self.next_seq = self.first_seq
        self.committed_rows = 0
        self.first_position = self.first_arrival = self.to_position = None


class OpenResync:
    """A re-sync in progress: rows stream into local staging until ResyncEnd names their position.

    Its segment's HyperLogLog sketch is left empty: a copy holds each key once (`changes` is its
    distinct count), and the churn rule merges the sketches of change segments only
    (`BufferReader.stats`), so hashing every key of the table would cost Python per row for nothing.
    """

    def __init__(self, first_seq: int, row_group_rows: int, begin_position: str | None, reason: str) -> None:
        self._staging = SnapshotStaging(row_group_rows)
        self._pending: list[RowTuple] = []
        self._row_group_rows = row_group_rows
        self.first_seq = first_seq
        self.rows = 0
        self.begin_position = begin_position
        self.reason = reason
        self.started_at = time.time()

    @property
    def next_seq(self) -> int:
        return self.first_seq + self.rows

    def add(self, event: SnapshotRow, key_fields: tuple[str, ...]) -> None:
        if isinstance(event, TextSnapshotRow) and event.codec.key == key_fields:
            encoded = encode_text_snapshot_row(event, self.next_seq, "", self._where)
        else:
            encoded = encode_snapshot_row(event.row, self.next_seq, key_fields, "", self._where())
        self._pending.append(encoded)
        self.rows += 1
        if len(self._pending) >= self._row_group_rows:
            self._staging.write(self._pending)
            self._pending = []

    def add_batch(self, event: SnapshotBatch, key_fields: tuple[str, ...]) -> None:
        """A batch of copied rows: encoded with Arrow kernels when their keys allow
        (`encode_text_snapshot_batch`), else row by row, exactly as `add` does."""
        encoded = encode_text_snapshot_batch(event.codec, event.texts, self.next_seq) \
            if event.codec.key == key_fields else None
        if encoded is None:
            for row in event.rows():
                self.add(row, key_fields)
            return
        self._staging.write(self._pending)  # the rows before it, in order
        self._pending = []
        self._staging.write_batch(encoded)
        self.rows += encoded.num_rows

    def _where(self) -> str:
        return f"re-sync row {self.rows + 1} ({self.reason}, after {self.begin_position or 'the start'})"

    def seal(self, storage: BufferStorage, target: SealTarget, position: str) -> SegmentMeta:
        """Write the snapshot segment, every row stamped with the re-sync's end `position`."""
        self._staging.write(self._pending)
        self._pending = []
        writer = SegmentWriter(storage, "snapshot")
        try:
            self._staging.copy_to(writer, position)
            meta = SegmentMeta(
                number=target.number, kind="snapshot", from_position=target.from_position,
                to_position=position, first_position=position if self.rows else None,
                first_seq=self.first_seq, last_seq=self.first_seq + self.rows - 1, changes=self.rows,
                hll=HyperLogLog().to_text(), first_arrival=self.started_at, sealed_at=time.time(),
                resync=ResyncInfo(self.reason, self.begin_position, self.rows),
            )
            return writer.seal(meta, target.table, target.schema)
        except BaseException:
            writer.discard()
            raise

    def discard(self) -> None:
        self._staging.discard()
