"""Read-only questions about a table's buffer: what is durable, what changed since P, what Spark reads.

`BufferView` answers from an `IndexState`: the writer (`ChangeBuffer`) from its in-memory index,
`BufferReader` (sensors, Spark jobs, other processes) from the index file, reconciled with the
segments present but without touching anything. Both answer the same way because they share this
code.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from resources.buffer.errors import RangeNotAvailable, ResyncInWindow
from resources.buffer.hll import HyperLogLog
from resources.buffer.index import IndexState, ResyncMarker, load_index, releasable, request_release
from resources.buffer.segments import SegmentKind, SegmentMeta, read_meta, seq_through
from resources.buffer.storage import BufferStorage, local_table_storage
from resources.subscribers.events import TableSchema
from snapshot_assets.archive.positions import comparator


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment Spark must read, and which of its rows: `seq_from_exclusive < seq <= seq_to_inclusive`.

    The filter is on `seq`, never on `position`: position strings do not sort as strings (LSNs are
    `%X/%08X`, variable width), while seq is an int64 with Parquet min/max statistics, so Spark
    prunes row groups with it. For a segment wholly inside the range the filter keeps every row.
    """

    path: str
    name: str
    kind: SegmentKind
    from_position: str | None
    to_position: str
    first_seq: int
    last_seq: int
    seq_from_exclusive: int
    seq_to_inclusive: int
    changes: int
    bytes: int

    @property
    def whole(self) -> bool:
        return self.seq_from_exclusive < self.first_seq and self.seq_to_inclusive >= self.last_seq

    @property
    def filter_sql(self) -> str:
        """The row filter as a Spark SQL predicate."""
        return f"seq > {self.seq_from_exclusive} AND seq <= {self.seq_to_inclusive}"

    def seq_mask(self, seq: pa.Array) -> pa.Array:
        """The same filter over a column of seqs read by a task (true: the row is the segment's)."""
        return pc.and_(pc.greater(seq, self.seq_from_exclusive), pc.less_equal(seq, self.seq_to_inclusive))


@dataclass(frozen=True, slots=True)
class BufferStats:
    """What the buffer holds after `since_position` (None: everything it holds).

    Counts are per whole segment: a `since` strictly inside a segment counts all of it (an upper
    bound; artifact boundaries normally fall on segment ends). `distinct_keys_estimate` is the
    merged HyperLogLog of those segments (±~2%). `resync_pending` means the next artifact must be a
    snapshot: a re-sync ended after `since`, or one is in progress. `oldest_change_age_s` is the
    wall-clock age of the oldest change after `since` since it reached the buffer.
    `resync_reason` is the reason of the newest such re-sync ("" when none is pending).
    """

    since_position: str | None
    durable_position: str | None
    low_water: str | None
    segments: int
    changes: int
    bytes: int
    distinct_keys_estimate: int
    resync_pending: bool
    first_position: str | None
    last_position: str | None
    oldest_change_age_s: float | None
    last_seal_latency_s: float | None
    avg_seal_latency_s: float | None
    seals: int
    resync_reason: str = ""


class BufferView(ABC):
    """The read API shared by the writer and the readers."""

    def __init__(self, table: str, ordering: str, storage: BufferStorage) -> None:
        self.table = table
        self.ordering = ordering
        self._cmp = comparator(ordering)
        self._storage = storage

    @abstractmethod
    def _state(self) -> IndexState: ...

    def writer_holder(self) -> str | None:
        """Who writes this buffer now (a pid, a lease owner), or None: liveness without a local lock."""
        return self._storage.writer_alive()

    def durable_position(self) -> str | None:
        """The position through which every change is durable (None: nothing yet, initial load next)."""
        return self._state().durable_position

    def durable_schema(self) -> TableSchema | None:
        """The table schema of the rows held through the durable position, whose key names the rows
        (None: never announced)."""
        return self._state().schema

    def schema_at(self, position: str) -> TableSchema | None:
        """The schema the source announced for the rows through `position`: that of the newest
        segment ending at or before it, from the segment's own footer (one small read). None when
        no such segment is held (released, or none was ever written)."""
        cmp = self._cmp
        held = [m for m in self._state().segments if cmp(m.to_position, position) <= 0]
        if not held:
            return None
        try:
            return read_meta(self._storage, held[-1].name)[2]
        except FileNotFoundError:  # released by the writer since the index was read
            return None

    def latest_resync(self) -> ResyncMarker | None:
        """The most recent completed re-sync (its snapshot segment, if still held, via `segment_ref`)."""
        resyncs = self._state().resyncs
        return resyncs[-1] if resyncs else None

    def all_segments(self) -> list[SegmentRef]:
        """Every segment held, snapshots included, in seq order (whole-segment filters)."""
        return [self._ref(m, m.first_seq - 1, m.last_seq) for m in self._state().segments]

    def segment_ref(self, name: str) -> SegmentRef:
        """A whole-segment reference (e.g. a re-sync's snapshot segment)."""
        for meta in self._state().segments:
            if meta.name == name:
                return self._ref(meta, meta.first_seq - 1, meta.last_seq)
        raise RangeNotAvailable(f"table {self.table}: the buffer holds no segment {name}")

    def segments(self, from_exclusive: str, to_inclusive: str) -> list[SegmentRef]:
        """The change segments holding exactly the changes with `from < position <= to`, with filters.

        Refuses a range the buffer cannot answer: beyond the durable position, below what
        `truncate_below` removed, or containing a re-sync (only a snapshot covers that).
        """
        state = self._state()
        cmp = self._cmp
        where = f"table {self.table}: changes ({from_exclusive}, {to_inclusive}]"
        if cmp(from_exclusive, to_inclusive) > 0:
            raise ValueError(f"{where}: the range runs backwards")
        if state.durable_position is None or cmp(to_inclusive, state.durable_position) > 0:
            raise RangeNotAvailable(f"{where} are not durable yet (durable position "
                                    f"{state.durable_position})")
        if state.low_water is not None and cmp(from_exclusive, state.low_water) < 0:
            raise RangeNotAvailable(f"{where}: changes up to {state.low_water} were truncated")
        for resync in state.resyncs:
            if cmp(resync.end_position, from_exclusive) > 0 and cmp(resync.end_position, to_inclusive) <= 0:
                raise ResyncInWindow(f"{where}: a re-sync ({resync.reason}) ended at {resync.end_position}; "
                                     "the range needs a snapshot, not a diff")
        refs: list[SegmentRef] = []
        for meta in state.segments:
            if meta.kind != "changes" or cmp(meta.to_position, from_exclusive) <= 0:
                continue
            if meta.from_position is not None and cmp(meta.from_position, to_inclusive) >= 0:
                break
            starts_inside = meta.from_position is not None and cmp(from_exclusive, meta.from_position) > 0
            low = seq_through(self._storage, meta, from_exclusive, cmp) if starts_inside else meta.first_seq - 1
            ends_inside = cmp(to_inclusive, meta.to_position) < 0
            high = seq_through(self._storage, meta, to_inclusive, cmp) if ends_inside else meta.last_seq
            if high > low:
                refs.append(self._ref(meta, low, high))
        return refs

    def _ref(self, meta: SegmentMeta, low: int, high: int) -> SegmentRef:
        return SegmentRef(self._storage.uri(meta.name), meta.name, meta.kind, meta.from_position,
                          meta.to_position, meta.first_seq, meta.last_seq, low, high, meta.changes, meta.bytes)

    def stats(self, since_position: str | None = None) -> BufferStats:
        """Statistics of the changes after `since_position`, from the index alone (milliseconds)."""
        state = self._state()
        cmp = self._cmp

        def after(position: str) -> bool:
            return since_position is None or cmp(position, since_position) > 0

        changes = [m for m in state.segments if m.kind == "changes" and after(m.to_position)]
        sketch = HyperLogLog()
        for meta in changes:
            sketch.merge_text(meta.hll)
        arrivals = [m.first_arrival for m in changes if m.first_arrival is not None]
        reasons = [r.reason for r in state.resyncs if after(r.end_position)]
        if state.resync_in_progress is not None:
            reasons.append(state.resync_in_progress.reason)
        metrics = state.metrics
        return BufferStats(
            since_position=since_position,
            durable_position=state.durable_position,
            low_water=state.low_water,
            segments=len(changes),
            changes=sum(m.changes for m in changes),
            bytes=sum(m.bytes for m in changes),
            distinct_keys_estimate=sketch.estimate(),
            resync_pending=bool(reasons),
            first_position=changes[0].first_position if changes else None,
            last_position=changes[-1].to_position if changes else None,
            oldest_change_age_s=time.time() - min(arrivals) if arrivals else None,
            last_seal_latency_s=metrics.last_latency_s,
            avg_seal_latency_s=metrics.avg_latency_s,
            seals=metrics.seals,
            resync_reason=reasons[-1] if reasons else "",
        )


class BufferReader(BufferView):
    """Another process's read-only view; every call re-reads the index (one small file)."""

    def __init__(self, root: str | Path, table: str, *, ordering: str = "lsn",
                 storage: BufferStorage | None = None) -> None:
        super().__init__(table, ordering, storage or local_table_storage(root, table))

    def _state(self) -> IndexState:
        return load_index(self._storage, self.table, self.ordering, repair=False)[0]

    def release_below(self, committed_position: str) -> int:
        """Ask the writer to delete the segments a committed artifact at `committed_position` covers.

        Only the writer deletes (it owns the index; a reader deleting files under it would make
        the index name missing segments). The request is a small file the writer honours with
        `truncate_below` after its next seal (or when it next opens); requests never move
        backwards. Returns how many segments the request covers now.
        """
        request_release(self._storage, committed_position, self._cmp)
        return len(releasable(self._state(), committed_position, self._cmp))
