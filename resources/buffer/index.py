"""The buffer index: one small JSON file a sensor reads in milliseconds, and its crash recovery.

The index lists every sealed segment (kind, position range, seq range, change count, bytes, HLL
sketch), the re-sync markers, the durable position, the schema and the seal-latency metrics. It is
rewritten atomically (temp + fsync + rename + directory fsync) after each seal.

Why it can always be trusted after a crash — the write order is the argument:
1. a segment is published (fsynced, atomically renamed into place) *before* the index names it,
   so the index never names a segment that is not durable;
2. a crash between those two steps leaves a sealed segment the index does not know; because every
   segment carries its own index entry in its Parquet footer, recovery *adopts* it (its number is
   beyond the index's `next_segment`), so nothing durable is ever forgotten;
3. `truncate_below` rewrites the index *before* deleting files, so an unreferenced segment numbered
   below the index's range is a leftover of a truncation and is deleted, never re-adopted;
4. temporaries of interrupted writes are deleted; a segment the index names but the storage lacks,
   a seq gap or an overlapping range is damage, reported as BufferCorrupt and never papered over.
The index can also be rebuilt from scratch from the segments (delete it and reopen).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from typing import Any

from resources.buffer.errors import BufferCorrupt
from resources.buffer.segments import SEGMENT_FOLDER, SegmentMeta, read_meta, schema_from_json, schema_to_json
from resources.buffer.storage import BufferStorage
from resources.subscribers.events import TableSchema
from snapshot_assets.archive.positions import Comparator, comparator

INDEX_NAME = "index.json"
RELEASE_NAME = "release.json"
FORMAT_VERSION = 1
_READ_ATTEMPTS = 3
_SEGMENT_NAME = re.compile(rf"{SEGMENT_FOLDER}/(\d{{12}})-(changes|snapshot)\.parquet")


@dataclass(frozen=True, slots=True)
class ResyncMarker:
    """A re-sync that began at `begin_position` (None: empty buffer) and ended at `end_position`.

    `segment` names its snapshot segment; None once `truncate_below` removed it.
    """

    begin_position: str | None
    end_position: str
    reason: str
    rows: int
    segment: str | None
    sealed_at: float


@dataclass(frozen=True, slots=True)
class ResyncInProgress:
    """A re-sync has begun and not yet ended (its rows are being staged); cleared by recovery."""

    begin_position: str | None
    reason: str
    started_at: float


@dataclass(slots=True)
class SealMetrics:
    """Latency from a change arriving to it being durable, per seal of a non-empty segment.

    `last_latency_s` is measured from the arrival of the segment's *first* row (its oldest), so it
    is the worst case of that seal; `last_duration_s` is the seal's own cost (footer, fsync, rename,
    index rewrite).
    """

    seals: int = 0
    latency_sum_s: float = 0.0
    last_latency_s: float | None = None
    last_duration_s: float | None = None

    @property
    def avg_latency_s(self) -> float | None:
        return self.latency_sum_s / self.seals if self.seals else None

    def record(self, latency_s: float, duration_s: float) -> None:
        self.seals += 1
        self.latency_sum_s += latency_s
        self.last_latency_s = latency_s
        self.last_duration_s = duration_s


@dataclass(slots=True)
class IndexState:
    """Everything the index file holds. Segments are in seal order (= seq order)."""

    table: str
    ordering: str
    durable_position: str | None = None
    next_seq: int = 1
    next_segment: int = 1
    low_water: str | None = None
    schema: TableSchema | None = None
    segments: list[SegmentMeta] = field(default_factory=list)
    resyncs: list[ResyncMarker] = field(default_factory=list)
    resync_in_progress: ResyncInProgress | None = None
    metrics: SealMetrics = field(default_factory=SealMetrics)

    def to_bytes(self) -> bytes:
        data = {
            "format": FORMAT_VERSION,
            "table": self.table,
            "ordering": self.ordering,
            "durable_position": self.durable_position,
            "next_seq": self.next_seq,
            "next_segment": self.next_segment,
            "low_water": self.low_water,
            "schema": None if self.schema is None else schema_to_json(self.schema),
            "resync_in_progress": None if self.resync_in_progress is None else asdict(self.resync_in_progress),
            "metrics": {"seals": self.metrics.seals, "latency_sum_s": self.metrics.latency_sum_s,
                        "last_latency_s": self.metrics.last_latency_s,
                        "last_duration_s": self.metrics.last_duration_s},
            "resyncs": [asdict(r) for r in self.resyncs],
            "segments": [s.to_json() for s in self.segments],
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> IndexState:
        data: dict[str, Any] = json.loads(raw)
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"index format {data.get('format')!r} is not {FORMAT_VERSION}")
        progress = data["resync_in_progress"]
        return cls(
            table=data["table"], ordering=data["ordering"], durable_position=data["durable_position"],
            next_seq=data["next_seq"], next_segment=data["next_segment"], low_water=data["low_water"],
            schema=None if data["schema"] is None else schema_from_json(data["schema"]),
            segments=[SegmentMeta.from_json(s) for s in data["segments"]],
            resyncs=[ResyncMarker(**r) for r in data["resyncs"]],
            resync_in_progress=None if progress is None else ResyncInProgress(**progress),
            metrics=SealMetrics(**data["metrics"]),
        )

    def write(self, storage: BufferStorage) -> None:
        storage.write_atomic(INDEX_NAME, self.to_bytes())

    def last_segment(self) -> SegmentMeta | None:
        return self.segments[-1] if self.segments else None

    def add_segment(self, meta: SegmentMeta, cmp: Comparator) -> None:
        """Account for a newly sealed (or adopted) segment: seqs, numbers, durable position."""
        self.segments.append(meta)
        self.next_seq = max(self.next_seq, meta.last_seq + 1)
        self.next_segment = max(self.next_segment, meta.number + 1)
        if self.durable_position is None or cmp(meta.to_position, self.durable_position) > 0:
            self.durable_position = meta.to_position
        if meta.resync is not None:
            self.resyncs.append(ResyncMarker(meta.resync.begin_position, meta.to_position, meta.resync.reason,
                                             meta.resync.rows, meta.name, meta.sealed_at))


@dataclass(frozen=True, slots=True)
class Recovery:
    """What opening the buffer had to repair (all empty after a clean shutdown)."""

    removed_temporaries: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
    deleted_leftovers: tuple[str, ...] = ()
    rebuilt: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.adopted or self.deleted_leftovers or self.rebuilt)


def _parse(raw: bytes | None) -> IndexState | None:
    """The index, or None when absent or unreadable.

    An atomic rewrite cannot tear the file, so an unreadable index is outside damage; the segments
    hold every entry, so it is rebuilt rather than the buffer refusing to start.
    """
    if raw is None:
        return None
    try:
        return IndexState.from_bytes(raw)
    except (ValueError, KeyError, TypeError):
        return None


def _snapshot(storage: BufferStorage, table: str, ordering: str) -> tuple[IndexState, bool, dict[str, int]]:
    """The index (a fresh one when absent: `rebuilt`) and the segment files present, by number."""
    state = _parse(storage.read(INDEX_NAME))
    rebuilt = state is None
    if state is None:
        state = IndexState(table=table, ordering=ordering)
    if state.table != table:
        raise BufferCorrupt(f"the buffer index in {storage.uri(INDEX_NAME)} is for table {state.table!r}, "
                            f"not {table!r}")
    if state.ordering != ordering:
        raise BufferCorrupt(f"table {table}: the buffer was written with position ordering "
                            f"{state.ordering!r}, not {ordering!r}")
    names = storage.list_names(SEGMENT_FOLDER)
    present = {m.group(0): int(m.group(1)) for m in map(_SEGMENT_NAME.fullmatch, names) if m is not None}
    return state, rebuilt, present


def load_index(storage: BufferStorage, table: str, ordering: str, *, repair: bool) -> tuple[IndexState, Recovery]:
    """Read the index and reconcile it with the segments actually present (see the module doc).

    With `repair` (the writer, holding the writer lock) temporaries and truncation leftovers are
    deleted and a changed index is written back; without it (a sensor, a Spark job) the same
    reconciliation happens in memory only and nothing is touched.
    """
    cmp = comparator(ordering)
    removed = tuple(storage.remove_temporaries(SEGMENT_FOLDER)) if repair else ()
    # A reader can race the writer's truncate_below (index rewritten, then files deleted): it read
    # the old index and then listed the new directory. Reading both again settles it.
    for _attempt in range(1 if repair else _READ_ATTEMPTS):
        state, rebuilt, present = _snapshot(storage, table, ordering)
        missing = sorted({s.name for s in state.segments} - present.keys())
        if not missing:
            break
    else:
        raise BufferCorrupt(f"table {table}: the buffer index names segments that are gone: {missing}")
    rebuilt = rebuilt and bool(present)  # a brand-new buffer has nothing to rebuild
    known = {s.name for s in state.segments}
    adopted: list[str] = []
    leftovers: list[str] = []
    for name in sorted(present.keys() - known, key=present.__getitem__):
        if present[name] >= state.next_segment:
            meta, seg_table, schema = read_meta(storage, name)
            if seg_table != table:
                raise BufferCorrupt(f"segment {storage.uri(name)} belongs to table {seg_table!r}, not {table!r}")
            state.add_segment(meta, cmp)
            if schema is not None:
                state.schema = schema
            adopted.append(name)
        else:
            leftovers.append(name)
            if repair:
                storage.delete(name)
    if rebuilt and state.segments:
        state.low_water = state.segments[0].from_position
    abandoned_resync = repair and state.resync_in_progress is not None
    if abandoned_resync:
        state.resync_in_progress = None  # a crash abandoned it; the source re-sends what it needs
    verify_contiguous(state, cmp)
    recovery = Recovery(removed, tuple(adopted), tuple(leftovers), rebuilt)
    if repair and (recovery.changed or abandoned_resync):
        state.write(storage)
    return state, recovery


def verify_contiguous(state: IndexState, cmp: Comparator) -> None:
    """Seqs run without gaps across segments and position ranges never overlap or run backwards."""
    where = f"table {state.table}: buffer segments"
    for seg in state.segments:
        if seg.from_position is not None and cmp(seg.to_position, seg.from_position) < 0:
            raise BufferCorrupt(f"{where}: {seg.name} ends ({seg.to_position}) before it starts "
                                f"({seg.from_position})")
    for prev, seg in pairwise(state.segments):
        if seg.first_seq != prev.last_seq + 1:
            raise BufferCorrupt(f"{where}: seq gap between {prev.name} (last {prev.last_seq}) and {seg.name} "
                                f"(first {seg.first_seq})")
        if seg.from_position is None or cmp(seg.from_position, prev.to_position) < 0:
            raise BufferCorrupt(f"{where}: {seg.name} starts at {seg.from_position} inside {prev.name} "
                                f"(which ends at {prev.to_position})")


def without_segments(state: IndexState, names: set[str]) -> IndexState:
    """A copy of `state` without the named segments.

    Re-sync markers of removed snapshot segments are dropped, except the latest one (kept with
    `segment=None`), so `latest_resync` still answers and the marker list stays bounded.
    """
    resyncs = [r for r in state.resyncs if r.segment not in names]
    if state.resyncs and state.resyncs[-1].segment in names:
        resyncs.append(replace(state.resyncs[-1], segment=None))
    return replace(state, segments=[s for s in state.segments if s.name not in names], resyncs=resyncs)


def read_release(storage: BufferStorage) -> str | None:
    """The position below which another process asked the writer to release segments, if any."""
    raw = storage.read(RELEASE_NAME)
    if raw is None:
        return None
    try:
        below = json.loads(raw)["below"]
    except (ValueError, KeyError, TypeError):
        return None
    return below if isinstance(below, str) and below else None


def request_release(storage: BufferStorage, position: str, cmp: Comparator) -> None:
    """Record (atomically, never moving it backwards) that segments up to `position` may go."""
    current = read_release(storage)
    if current is not None and cmp(position, current) <= 0:
        return
    storage.write_atomic(RELEASE_NAME, json.dumps({"below": position}).encode())


def releasable(state: IndexState, committed_position: str, cmp: Comparator) -> list[str]:
    """Segments wholly at or below `committed_position`, except the newest one (the durable anchor)."""
    return [m.name for m in state.segments[:-1] if cmp(m.to_position, committed_position) <= 0]
