"""Part files: how tasks encode their share of an artifact with the project's format writers.

Each task writes its rows (or net changes) once into one part per format,
`<staging>/<format>/part-<index:05d><ext>`, with the same `Format.snapshot_writer` /
`diff_writer` the Python writer uses, so the bytes of every row or change are exactly what the
single-process path produces. A part is written to a temporary name and renamed, so a retried or
speculative task attempt never leaves a torn part under the final name. Tasks report
(format, index, path, bytes, count) rows; the driver collects only those (never the data) and
orders the parts by index, which is the order the artifact's object concatenates them in.

Staging must be a directory that the tasks and the driver both see: true for a local runtime
(classic local or the local Connect server on this machine). `collect_parts` verifies every part
the tasks reported from the driver and raises StagingNotShared otherwise. On a cluster the build is
given the artifact's `Uploads` instead (pieces.py): each task then sends its part straight into
every destination as pieces of one multipart upload per format, and the driver completes them.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import DataFrame

from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.formats import Format, get_format
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.spark.effects import decode_row
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.pieces import PieceWriter, Sent, Uploads

Kind = Literal["snapshot", "diff"]
PART_DDL = "format STRING, part BIGINT, path STRING, bytes BIGINT, count BIGINT"
_PART_ARROW = pa.schema([("format", pa.string()), ("part", pa.int64()), ("path", pa.string()),
                         ("bytes", pa.int64()), ("count", pa.int64())])


class StagingNotShared(RuntimeError):
    """Tasks wrote parts the driver cannot see: the staging directory is not shared with executors."""


def part_path(staging_dir: Path | str, format_id: str, extension: str, index: int) -> Path:
    """Where a task stages its piece `index` of one format (or of a sidecar such as versions)."""
    return Path(staging_dir) / format_id / f"part-{index:05d}{extension}"


class PartSink:
    """One part per format for one task: staged files, or pieces sent into `uploads`; opened at the
    first item (empty tasks write none)."""

    def __init__(self, staging_dir: Path | str | None, formats: Sequence[str], index: int, kind: Kind,
                 key_fields: Sequence[str], uploads: Uploads | None = None) -> None:
        self._staging = None if staging_dir is None else Path(staging_dir)
        self._uploads = uploads
        self._formats = [get_format(f) for f in formats]
        self._index = index
        self._kind = kind
        self._key_fields = tuple(key_fields)
        self._open: list[tuple[Format, PieceWriter, Any]] = []
        self.count = 0

    def _start(self) -> None:
        for fmt in self._formats:
            staged = None if self._staging is None else \
                part_path(self._staging, fmt.format_id, fmt.extension, self._index)
            piece = PieceWriter(fmt.format_id, self._index, staged=staged, uploads=self._uploads)
            make = fmt.snapshot_writer if self._kind == "snapshot" else fmt.diff_writer
            self._open.append((fmt, piece, make(piece.stream, self._key_fields)))

    def write(self, item: Row | Change) -> None:
        """Encode one row or change in every format."""
        if not self._open:
            self._start()
        for _fmt, _piece, writer in self._open:
            writer.write(item)
        self.count += 1

    def close(self) -> list[tuple[str, int, str, int, int]]:
        """Finish every part; the (format, index, where, bytes, count) rows (`where`: the staged
        file's path, or what the uploads received, see pieces.py)."""
        done: list[tuple[str, int, str, int, int]] = []
        try:
            for fmt, piece, writer in self._open:
                writer.close()
                where, size = piece.close()
                done.append((fmt.format_id, self._index, where, size, self.count))
        except BaseException:
            self.abort()
            raise
        self._open = []
        return done

    def abort(self) -> None:
        for _fmt, piece, _writer in self._open:
            piece.abort()
        self._open = []


def part_batch(rows: Sequence[tuple[str, int, str, int, int]]) -> Any:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(_PART_ARROW)
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, _PART_ARROW, strict=True)],
                                      schema=_PART_ARROW)


def task_index(offset: int = 0) -> int:
    """This task's partition id (+ offset): stable across retries, so a retry rewrites its own part."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("task_index() called outside a Spark task")
    return context.partitionId() + offset


def write_items(items: Iterable[Row | Change], staging_dir: str | None, formats: Sequence[str], index: int,
                kind: Kind, key_fields: Sequence[str], uploads: Uploads | None = None) -> Iterator[Any]:
    """Encode `items` into one part per format; yields the one metadata batch."""
    sink = PartSink(staging_dir, formats, index, kind, key_fields, uploads)
    try:
        for item in items:
            sink.write(item)
    except BaseException:
        sink.abort()
        raise
    yield part_batch(sink.close())


# --- snapshot rows -> parts -----------------------------------------------------------------------


def _rows(batches: Iterable[Any]) -> Iterator[Row]:
    for batch in batches:
        for text in batch.column("row").to_pylist():
            row = decode_row(text)
            if row is not None:
                yield row


def _snapshot_task(batches: Iterable[Any], staging_dir: str, formats: tuple[str, ...],
                   key_fields: tuple[str, ...]) -> Iterator[Any]:
    return write_items(_rows(batches), staging_dir, formats, task_index(), "snapshot", key_fields)


def encode_snapshot_parts(state: DataFrame, staging_dir: Path | str | Location, formats: Sequence[str],
                          key_fields: Sequence[str]) -> list[Any]:
    """Encode a state DataFrame (column `row`) as snapshot parts, one per partition and format, in a
    local staging folder; returns the collected part rows."""
    func = functools.partial(_snapshot_task, staging_dir=str(staging_dir), formats=tuple(formats),
                             key_fields=tuple(key_fields))
    return list(state.select("row").mapInArrow(func, PART_DDL).collect())


# --- net changes -> diff parts --------------------------------------------------------------------


# --- the driver's view ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reuse:
    """A byte range of an object already in every destination (the previous snapshot), to be copied
    into the new object where it stands: the bytes of the state's untouched buckets (`piece`: the
    first of them, whose part numbers the copy takes when the tasks send the other pieces)."""

    source_key: str
    start: int
    length: int
    piece: int = 0


@dataclass(frozen=True, slots=True)
class StagedFormat:
    """One format of a built artifact: its pieces in artifact order (staged files, or ranges of an
    existing object), and their total size."""

    format_id: str
    parts: tuple[Path | Reuse | Sent, ...]
    bytes: int

    def files(self) -> tuple[Path, ...]:
        """The staged files (a folder format's parts); an artifact of reused ranges has others too."""
        return tuple(p for p in self.parts if isinstance(p, Path))


def bucket_pieces(where: str, sizes: Sequence[int], fresh: Mapping[int, Path | Sent],
                  starts: Sequence[int | None], previous_key: str | None,
                  piece_of: Callable[[int], int] = int) -> list[Path | Reuse | Sent]:
    """An object's pieces bucket by bucket (`sizes`: each bucket's bytes in it): the bucket's `fresh`
    piece when this build wrote one, else the range of the previous object (`previous_key`, where the
    bucket's bytes start at `starts[i]`; None: the bucket is not in it) that holds them; neighbouring
    ranges become one copy.
    `piece_of` numbers a bucket's piece among the object's (`where` names the object in an error)."""
    pieces: list[Path | Reuse | Sent] = []
    for i, size in enumerate(sizes):
        if size == 0:
            continue
        blob = fresh.get(i)
        if blob is not None:
            pieces.append(blob)
            continue
        start = starts[i] if i < len(starts) else None
        if previous_key is None or start is None:
            raise RuntimeError(f"bucket {i} of {where} has neither a fresh piece nor a previous object")
        last = pieces[-1] if pieces else None
        if isinstance(last, Reuse) and last.start + last.length == start:
            pieces[-1] = Reuse(previous_key, last.start, last.length + size, last.piece)
        else:
            pieces.append(Reuse(previous_key, start, size, piece_of(i)))
    return pieces


@dataclass(frozen=True, slots=True)
class BuiltArtifact:
    """What a Spark job staged: per format, the ordered parts; `count` is rows (snapshot) or net
    changes including a leading TRUNCATE (diff), as the manifest records them."""

    kind: Kind
    from_position: str | None
    to_position: str
    count: int
    formats: Mapping[str, StagedFormat]
    truncated: bool = False
    seconds: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)
    uploads: Uploads | None = None  # where the tasks sent the pieces (`Sent` parts), to be completed
    #: objects written beside the artifact, not formats of it (the versions object: archive/versions.py)
    sidecars: Mapping[str, StagedFormat] = field(default_factory=dict)


def prepare_staging(staging_dir: Path | str | Location, formats: Sequence[str]) -> Location:
    """A clean staging location: locally, a folder per format (parts of an earlier failed attempt
    are removed); in S3 (a cluster: pieces go to the destinations, staging keeps scratch only),
    emptied."""
    for fid in formats:
        get_format(fid)
    root = Location.of(staging_dir)
    if root.remote:
        root.clear()
        return root
    for fid in (*formats, VERSIONS):
        shutil.rmtree(root.path / fid, ignore_errors=True)
        (root.path / fid).mkdir(parents=True, exist_ok=True)
    return root


def collect_parts(rows: Iterable[Any], formats: Sequence[str], *,
                  sent: bool = False) -> tuple[dict[str, StagedFormat], int]:
    """Group reported parts by format in index order, check them from the driver, and count items.

    Every format received the same items, so their counts must agree. Staged parts (`sent` False):
    a part the driver cannot see, or of another size than the task reported, means the staging
    directory is not shared. Sent parts are checked when their uploads complete.
    """
    by_format: dict[str, list[tuple[int, Path | Sent, int, int]]] = {fid: [] for fid in formats}
    for row in rows:
        index, count = int(row["part"]), int(row["count"])
        if sent:
            by_format[row["format"]].append((index, Sent.parse(index, int(row["bytes"]), row["path"]),
                                             int(row["bytes"]), count))
            continue
        path = Path(row["path"])
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        if size != row["bytes"]:
            raise StagingNotShared(
                f"a task reported part {path} ({row['bytes']} bytes) but the driver sees "
                f"{'nothing' if size < 0 else f'{size} bytes'} there: the staging directory must be shared "
                "by the driver and the executors (a local runtime); on a cluster give the build its Targets "
                "(see snapshot_assets/spark/pieces.py)")
        by_format[row["format"]].append((index, path, size, count))
    staged: dict[str, StagedFormat] = {}
    counts: set[int] = set()
    for fid, parts in by_format.items():
        parts.sort(key=lambda part: part[0])
        staged[fid] = StagedFormat(fid, tuple(p for _, p, _, _ in parts), sum(s for _, _, s, _ in parts))
        counts.add(sum(c for _, _, _, c in parts))
    if len(counts) > 1:
        raise RuntimeError(f"formats disagree on the item count: {sorted(counts)}")
    return staged, counts.pop() if counts else 0
