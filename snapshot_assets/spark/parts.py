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
the tasks reported from the driver and raises StagingNotShared otherwise. On a cluster the
remaining step is to have each task upload its part to S3 as one part of a multipart upload (the
object then assembles itself, ordered by part number; jsonl/protobuf parts concatenate cleanly)
instead of writing to a local directory; until then, point a cluster run at a shared mount.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pyarrow as pa
from pyspark.sql import DataFrame

from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.formats import Format, get_format
from snapshot_assets.spark.effects import decode_row

Kind = Literal["snapshot", "diff"]
PART_DDL = "format STRING, part BIGINT, path STRING, bytes BIGINT, count BIGINT"
_PART_ARROW = pa.schema([("format", pa.string()), ("part", pa.int64()), ("path", pa.string()),
                         ("bytes", pa.int64()), ("count", pa.int64())])


class StagingNotShared(RuntimeError):
    """Tasks wrote parts the driver cannot see: the staging directory is not shared with executors."""


def part_path(staging_dir: Path | str, fmt: Format, index: int) -> Path:
    return Path(staging_dir) / fmt.format_id / f"part-{index:05d}{fmt.extension}"


class PartSink:
    """One part per format for one task; files are opened at the first item (empty tasks write none)."""

    def __init__(self, staging_dir: Path | str, formats: Sequence[str], index: int, kind: Kind,
                 key_fields: Sequence[str]) -> None:
        self._staging = Path(staging_dir)
        self._formats = [get_format(f) for f in formats]
        self._index = index
        self._kind = kind
        self._key_fields = tuple(key_fields)
        self._open: list[tuple[Format, Path, Path, BinaryIO, Any]] = []
        self.count = 0

    def _start(self) -> None:
        for fmt in self._formats:
            final = part_path(self._staging, fmt, self._index)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
            out = open(tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
            make = fmt.snapshot_writer if self._kind == "snapshot" else fmt.diff_writer
            self._open.append((fmt, final, tmp, out, make(out, self._key_fields)))

    def write(self, item: Row | Change) -> None:
        if not self._open:
            self._start()
        for _fmt, _final, _tmp, _out, writer in self._open:
            writer.write(item)
        self.count += 1

    def close(self) -> list[tuple[str, int, str, int, int]]:
        """Finish every part (rename into place); the (format, index, path, bytes, count) rows."""
        done: list[tuple[str, int, str, int, int]] = []
        try:
            for fmt, final, tmp, out, writer in self._open:
                writer.close()
                out.close()
                os.replace(tmp, final)
                done.append((fmt.format_id, self._index, str(final), final.stat().st_size, self.count))
        except BaseException:
            self.abort()
            raise
        self._open = []
        return done

    def abort(self) -> None:
        for _fmt, _final, tmp, out, _writer in self._open:
            out.close()
            tmp.unlink(missing_ok=True)
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


def write_items(items: Iterable[Row | Change], staging_dir: str, formats: Sequence[str], index: int,
                kind: Kind, key_fields: Sequence[str]) -> Iterator[Any]:
    """Encode `items` into one part per format; yields the one metadata batch."""
    sink = PartSink(staging_dir, formats, index, kind, key_fields)
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


def encode_snapshot_parts(state: DataFrame, staging_dir: Path | str, formats: Sequence[str],
                          key_fields: Sequence[str]) -> list[Any]:
    """Encode a state DataFrame (column `row`) as snapshot parts, one per partition and format;
    returns the collected part rows."""
    func = functools.partial(_snapshot_task, staging_dir=str(staging_dir), formats=tuple(formats),
                             key_fields=tuple(key_fields))
    return list(state.select("row").mapInArrow(func, PART_DDL).collect())


# --- net changes -> diff parts --------------------------------------------------------------------


def _changes(batches: Iterable[Any]) -> Iterator[Change]:
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in ("action", "change_key", "old", "new")]
        for action, key, old, new in zip(*columns, strict=True):
            yield Change(Change.parse_action(action), key, decode_row(old), decode_row(new))


def _diff_task(batches: Iterable[Any], staging_dir: str, formats: tuple[str, ...], key_fields: tuple[str, ...],
               offset: int) -> Iterator[Any]:
    return write_items(_changes(batches), staging_dir, formats, task_index(offset), "diff", key_fields)


def encode_diff_parts(net: DataFrame, staging_dir: Path | str, formats: Sequence[str], key_fields: Sequence[str],
                      *, first_part: int) -> list[Any]:
    """Encode net changes (NET_DDL rows) as diff parts numbered from `first_part`; the collected part rows."""
    func = functools.partial(_diff_task, staging_dir=str(staging_dir), formats=tuple(formats),
                             key_fields=tuple(key_fields), offset=first_part)
    return list(net.select("action", "change_key", "old", "new").mapInArrow(func, PART_DDL).collect())


# --- the driver's view ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reuse:
    """A byte range of an object already in every destination (the previous snapshot), to be copied
    into the new object where it stands: the bytes of the state's untouched buckets."""

    source_key: str
    start: int
    length: int


@dataclass(frozen=True, slots=True)
class StagedFormat:
    """One format of a built artifact: its pieces in artifact order (staged files, or ranges of an
    existing object), and their total size."""

    format_id: str
    parts: tuple[Path | Reuse, ...]
    bytes: int

    def files(self) -> tuple[Path, ...]:
        """The staged files (a folder format's parts); an artifact of reused ranges has others too."""
        return tuple(p for p in self.parts if isinstance(p, Path))


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


def prepare_staging(staging_dir: Path | str, formats: Sequence[str]) -> Path:
    """A clean staging folder per format (parts of an earlier failed attempt are removed)."""
    root = Path(staging_dir)
    for fid in formats:
        get_format(fid)
        shutil.rmtree(root / fid, ignore_errors=True)
        (root / fid).mkdir(parents=True, exist_ok=True)
    return root


def collect_parts(rows: Iterable[Any], formats: Sequence[str]) -> tuple[dict[str, StagedFormat], int]:
    """Group reported parts by format in index order, check them from the driver, and count items.

    Every format received the same items, so their counts must agree; a part the driver cannot
    see, or of another size than the task reported, means the staging directory is not shared.
    """
    by_format: dict[str, list[tuple[int, Path, int, int]]] = {fid: [] for fid in formats}
    for row in rows:
        path = Path(row["path"])
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        if size != row["bytes"]:
            raise StagingNotShared(
                f"a task reported part {path} ({row['bytes']} bytes) but the driver sees "
                f"{'nothing' if size < 0 else f'{size} bytes'} there: the staging directory must be shared "
                "by the driver and the executors (local runtime or a shared mount); see snapshot_assets/spark/parts.py")
        by_format[row["format"]].append((int(row["part"]), path, size, int(row["count"])))
    staged: dict[str, StagedFormat] = {}
    counts: set[int] = set()
    for fid, parts in by_format.items():
        parts.sort()
        staged[fid] = StagedFormat(fid, tuple(p for _, p, _, _ in parts), sum(s for _, _, s, _ in parts))
        counts.add(sum(c for _, _, _, c in parts))
    if len(counts) > 1:
        raise RuntimeError(f"formats disagree on the item count: {sorted(counts)}")
    return staged, counts.pop() if counts else 0
