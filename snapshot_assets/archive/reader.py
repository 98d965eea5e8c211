"""Reading an archive back: plans (which artifacts bring a consumer where) and reconstruction.

Semantics follow laredo's Reader (spec §8) so both projects' readers answer alike, with the fixes
this project owes its users:
  * a cycle guard: chains are walked once, in manifest (commit) order, so a laredo diff with
    `from == to` is applied once instead of looping forever;
  * typed keys: rows are identified by their key values (exact integers, also beyond 2^53), never
    by the `%v` key string, which laredo computes differently for snapshots and diffs;
  * a TRUNCATE inside a diff applies before every other change of that diff, because laredo wrote
    diff lines in map order and a TRUNCATE could land after the inserts it must not wipe.
Small archives fold here in Python; the Spark reader folds large ones with the same rules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from resources.destinations.base import DestinationError, ReadableDestination
from snapshot_assets.archive import keys
from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.errors import (
    CorruptArtifact,
    ManifestNotFound,
    MissingArtifact,
    MissingKeyField,
    PositionError,
    UnknownFormat,
)
from snapshot_assets.archive.fold import FoldState, fold_diff
from snapshot_assets.archive.formats import FORMATS, Format, get_format
from snapshot_assets.archive.manifest import Artifact, Manifest, loads
from snapshot_assets.archive.positions import Comparator, compare_lsn, parse_lsn

_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """The artifacts that bring a consumer to `head_position`.

    With `snapshot` set, apply it first and then `diffs`; with `snapshot=None` the consumer
    already holds the state at the requested position and only needs `diffs`.
    """

    snapshot: Artifact | None
    diffs: tuple[Artifact, ...]
    head_position: str


@dataclass(frozen=True, slots=True)
class Reconstruction:
    position: str
    rows: list[Row]


def artifact_key(key_prefix: str, art: Artifact, fmt: Format) -> str:
    """The object key laredo's readers would compute for `art` in `fmt` (the stored URI is ignored)."""
    if art.is_snapshot:
        return keys.snapshot_key(key_prefix, art.epoch, art.to_position, fmt.extension)
    return keys.diff_key(key_prefix, art.epoch, art.from_position or "", art.to_position, fmt.extension)


def _chain(m: Manifest, start_index: int, position: str, bound: str | None, cmp: Comparator) -> list[Artifact]:
    """Diffs after `start_index`, in commit order, each continuing from where the last one ended.

    Walking the list once is the cycle guard. With `bound`, the chain stops before the first diff
    whose `to_position` passes it (a diff straddling the bound cannot be partially applied).
    """
    chain: list[Artifact] = []
    current = position
    for art in m.artifacts[start_index:]:
        if art.is_snapshot or art.from_position != current:
            continue
        if bound is not None and cmp(art.to_position, bound) > 0:
            break
        chain.append(art)
        current = art.to_position
    return chain


def plan(m: Manifest, from_position: str, cmp: Comparator = compare_lsn) -> ReplayPlan | None:
    """Forward resume from `from_position` to the head; None when the archive has no base snapshot.

    Diff-only when an unbroken chain starts exactly at `from_position` and reaches the head;
    a consumer already at the head gets an empty diff-only plan (laredo hands it a full snapshot).
    Otherwise the newest snapshot plus the chain after it.
    """
    if not m.artifacts:
        return None
    if from_position and from_position == m.head_position:
        return ReplayPlan(None, (), m.head_position)
    if from_position:
        diffs = _chain(m, 0, from_position, None, cmp)
        if diffs and cmp(diffs[-1].to_position, m.head_position) >= 0:
            return ReplayPlan(None, tuple(diffs), diffs[-1].to_position)
    snap = m.latest_snapshot()
    if snap is None:
        return None
    start = m.artifacts.index(snap)
    diffs = _chain(m, start + 1, snap.to_position, None, cmp)
    return ReplayPlan(snap, tuple(diffs), diffs[-1].to_position if diffs else snap.to_position)


def plan_as_of(m: Manifest, position: str, cmp: Comparator = compare_lsn) -> ReplayPlan | None:
    """The plan for the table as of `position`: the snapshot with the greatest `to_position <= position`,
    then chained diffs while `to_position <= position`. None when `position` predates every snapshot.

    The effective position (`head_position`) is the last boundary included; beyond the head it
    clamps to the head.
    """
    best_index: int | None = None
    for i, art in enumerate(m.artifacts):
        if not art.is_snapshot or cmp(art.to_position, position) > 0:
            continue
        if best_index is None or cmp(art.to_position, m.artifacts[best_index].to_position) >= 0:
            best_index = i
    if best_index is None:
        return None
    snap = m.artifacts[best_index]
    diffs = _chain(m, best_index + 1, snap.to_position, position, cmp)
    return ReplayPlan(snap, tuple(diffs), diffs[-1].to_position if diffs else snap.to_position)


class ArchiveReader:
    """Reads one table's archive on one destination.

    `formats` is the preference order for decoding; None means "the first the manifest offers
    that this build can decode". `cmp` orders the source's positions (LSNs by default).
    """

    def __init__(
        self,
        dest: ReadableDestination,
        key_prefix: str = "",
        *,
        formats: Sequence[str] | None = None,
        key_fields: Sequence[str] = keys.DEFAULT_KEY_FIELDS,
        cmp: Comparator = compare_lsn,
    ) -> None:
        if formats is not None:
            for fid in formats:
                get_format(fid)  # fail fast on an unknown --format
        self.dest = dest
        self.key_prefix = key_prefix
        self.formats = tuple(formats) if formats is not None else None
        self.key_fields = tuple(key_fields)
        self.cmp = cmp

    # ---- manifest ----------------------------------------------------------------------------

    def load_manifest(self) -> Manifest:
        key = keys.manifest_key(self.key_prefix)
        got = self.dest.get(key)
        if got is None:
            raise ManifestNotFound(f"no manifest at {self.dest.uri(key)}")
        return loads(got.data, source=self.dest.uri(key))

    # ---- artifacts ---------------------------------------------------------------------------

    def format_for(self, art: Artifact) -> Format:
        """The format used to decode `art`: the first preferred one it carries."""
        wanted = self.formats if self.formats is not None else tuple(art.formats)
        for fid in wanted:
            if fid in art.formats and fid in FORMATS:
                return FORMATS[fid]
        raise UnknownFormat(
            f"{art.describe()} is stored as {', '.join(art.formats) or 'nothing'}; "
            f"cannot decode it with {', '.join(wanted) or 'no format'}"
        )

    @contextlib.contextmanager
    def _open(self, art: Artifact, fmt: Format) -> Iterator[Iterator[BinaryIO]]:
        """The artifact's object(s): one object, or the part files of a folder (parquet written by Spark)."""
        key = artifact_key(self.key_prefix, art, fmt)
        with contextlib.ExitStack() as stack:
            try:
                single = stack.enter_context(self.dest.open_read(key))
            except FileNotFoundError:
                parts = [o.key for o in self.dest.list(key + "/") if not _is_marker(o.key)]
                if not parts:
                    raise MissingArtifact(f"{art.describe()}: object missing: {self.dest.uri(key)}") from None
                yield (stack.enter_context(self.dest.open_read(p)) for p in parts)
                return
            yield iter((single,))

    def iter_snapshot(self, art: Artifact) -> Iterator[Row]:
        fmt = self.format_for(art)
        with self._open(art, fmt) as streams:
            for stream in streams:
                yield from _guard(fmt.read_snapshot(stream), art)

    def iter_diff(self, art: Artifact) -> Iterator[Change]:
        fmt = self.format_for(art)
        with self._open(art, fmt) as streams:
            for stream in streams:
                yield from _guard(fmt.read_diff(stream), art)

    # ---- reconstruction ----------------------------------------------------------------------

    def fold(self, p: ReplayPlan, state: FoldState | None = None) -> FoldState:
        """Apply a plan to `state` (a fresh one when the plan has a snapshot)."""
        if p.snapshot is not None:
            state = FoldState(self.key_fields)
            with _naming(p.snapshot):
                for row in self.iter_snapshot(p.snapshot):
                    state.put(row)
        if state is None:
            raise ValueError("a diff-only plan needs the consumer's current state")
        for art in p.diffs:
            with _naming(art):
                fold_diff(state, self.iter_diff(art))
        return state

    def reconstruct_as_of(self, position: str | None = None, m: Manifest | None = None) -> Reconstruction | None:
        """The table as of `position` (head when None); None when the position predates the archive."""
        m = m or self.load_manifest()
        at = m.head_position if position is None else position
        if position is not None and self.cmp is compare_lsn and parse_lsn(position) is None:
            raise PositionError(f"{position!r} is not a PostgreSQL LSN (expected HI/LO in hex, e.g. 0/16B3748)")
        p = plan_as_of(m, at, self.cmp)
        if p is None:
            return None
        state = self.fold(p)
        return Reconstruction(position=p.head_position, rows=list(state.rows()))


def _is_marker(key: str) -> bool:
    """Spark's bookkeeping files inside a parquet folder (`_SUCCESS`, `.crc`) are not data."""
    name = key.rsplit("/", 1)[-1]
    return name.startswith(("_", ".")) or name.endswith(".crc")


@contextlib.contextmanager
def _naming(art: Artifact) -> Iterator[None]:
    """Name the artifact whose row lacks a key field (wrong key fields for this archive, most often)."""
    try:
        yield
    except MissingKeyField as e:
        raise e.at(f"a row of {art.describe()}") from None


def _guard(items: Iterator[_Item], art: Artifact) -> Iterator[_Item]:
    """Name the artifact in decode errors, and turn destination failures into archive errors."""
    try:
        yield from items
    except CorruptArtifact as e:
        raise CorruptArtifact(f"{art.describe()}: {e}") from e
    except DestinationError as e:
        raise MissingArtifact(f"{art.describe()}: {e}") from e
