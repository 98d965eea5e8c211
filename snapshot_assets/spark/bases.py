"""Where a snapshot starts from: the table state at some earlier position, as a (key, row) DataFrame.

Sources, fastest first:
  * `LayeredBase`: the STATE dataset of the epoch's snapshot plus the `DeltaSet` of every committed
    diff after it: the table at the head, at every committed position, not only at snapshots. A
    diff writes only the keys it touched (its net changes), so keeping the state current costs
    what the diff costs; the next diff completes its row images from it and the next snapshot
    starts from it.
  * `StateBase`: this project's internal STATE dataset, written by the previous snapshot run
    (Parquet, columns key = canonical JSON of the typed key, row = Go-JSON text). A plain columnar
    scan: no decoding, no re-keying.
  * `ArtifactBase`: the previous snapshot artifact. jsonl is read as text by Spark (split across
    tasks) and keyed in tasks; other formats (a protobuf object, a parquet folder) are read file by
    file in tasks with the project's format readers.
  * `BufferSnapshotBase`: a SNAPSHOT segment of the change buffer: the source's initial load or a
    later re-sync, which resets the base (its rows already carry the canonical key).
  * `EmptyBase`: nothing (a table that starts empty).
  * `FrameBase`: a table computed in this run (a base advanced by buffer changes, `window.advance`).
`choose_base` picks one for a snapshot at `to_position` and the buffer segments that follow it.
The state, its deltas and the buffer's segments are local folders or S3 locations (locations.py:
on a cluster the tasks read them from S3 themselves); an artifact base is read from local paths,
`file://` URIs, or `s3://` objects that the tasks read themselves.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import shutil
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.buffer.reader import BufferView, SegmentRef
from resources.buffer.segments import TYPED_COLUMN
from resources.destinations.s3 import S3Connection
from resources.subscribers.text_rows import RowCodec
from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Row
from snapshot_assets.archive.errors import CorruptArtifact
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.keys import key_json, typed_key
from snapshot_assets.archive.positions import Comparator, compare_lsn
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.spark.copy_tasks import CopyFile, SortedRuns, encode_copy
from snapshot_assets.spark.copy_tasks import census as copy_census
from snapshot_assets.spark.copy_tasks import sorted_runs as copy_runs
from snapshot_assets.spark.diff_records import RECORD_COLUMNS, encode_net, record_formats
from snapshot_assets.spark.effects import (
    NET_COLUMNS,
    NET_DDL,
    STATE_ARROW,
    STATE_DDL,
    VERSION_SQL,
    encode_row,
    read_window,
)
from snapshot_assets.spark.locations import Location, read_dataset, write_dataset
from snapshot_assets.spark.parquet_artifact import (
    PARQUET_FORMAT,
    image_type,
    refusing_misfits,
    typed_columns,
)
from snapshot_assets.spark.remote_io import input_file, is_s3
from snapshot_assets.spark.state import StateBase, bounds_of, sample_bounds
from snapshot_assets.spark.typed_copies import CopyTyper

__all__ = ["ArtifactBase", "Base", "BufferSnapshotBase", "DeltaSet", "EmptyBase", "FrameBase", "LayeredBase",
           "StateBase", "choose_base", "latest_images", "rows_for", "with_cells", "write_delta"]

DELTA_MARKER = "_snapshotter_delta.json"


class Base(Protocol):
    """A table state at `position` (None: before anything)."""

    @property
    def position(self) -> str | None: ...

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        """The rows as STATE_DDL (key, row, ver, pb)."""
        ...

    def describe(self) -> str: ...


def local_path(path_or_uri: str) -> str:
    """A filesystem path from a path or a `file://` URI (what a local destination's `uri` returns)."""
    parsed = urllib.parse.urlparse(path_or_uri)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    if parsed.scheme:
        raise ValueError(f"{path_or_uri!r}: only local paths and file:// URIs can be read by this job "
                         "(S3 artifacts need hadoop-aws, which this project does not ship)")
    return path_or_uri


def _state_batch(rows: Sequence[tuple[str, str]]) -> Any:
    keys, texts = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [])
    # a snapshot artifact keeps no versions: its rows' are unknown (null)
    return pa.RecordBatch.from_arrays([pa.array(keys, pa.string()), pa.array(texts, pa.string()),
                                       pa.nulls(len(keys), pa.string()), pa.nulls(len(keys), pa.binary())],
                                      schema=STATE_ARROW)


def keyed(row: Row, key_fields: Sequence[str], text: str | None = None) -> tuple[str, str]:
    """(canonical key, Go-JSON text) of a snapshot row."""
    return key_json(typed_key(row, key_fields)), text if text is not None else encode_row(row, key_fields)


# --- the bases --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmptyBase:
    position: str | None = None

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        return spark.createDataFrame([], STATE_DDL)

    def describe(self) -> str:
        return "an empty table"


@dataclass(frozen=True, slots=True)
class DeltaSet:
    """One diff's step of the state: its net changes (NET_DDL; `new` null for a delete) on the
    table at `from_position`, giving the table at `to_position`; `truncated`: the diff's TRUNCATE
    wiped everything before it. Written by the diff job, read back by the next builds."""

    path: str
    from_position: str
    to_position: str
    truncated: bool
    encoded: tuple[str, ...] = ()
    s3: S3Connection | None = None  # signs the requests when the delta is in S3
    #: The row schema the new images' typed columns (TYPED_COLUMN) were made for, when the diff made
    #: them (the state has parquet): the next snapshot merges those cells instead of typing the rows.
    schema: RowSchema | None = None
    #: The diff formats whose record of each change the delta holds (`diff_records.RECORD_COLUMNS`).
    records: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: Path | str | Location, s3: S3Connection | None = None) -> DeltaSet | None:
        """The delta at `path` (a local folder or an s3 URI signed by `s3`) if it is complete (its
        marker is written last), else None."""
        where = Location.of(path, s3)
        try:
            meta = where.read_json(DELTA_MARKER)
            if meta is None:
                return None
            typed = meta.get("schema")
            return cls(where.uri, str(meta["from_position"]), str(meta["to_position"]), bool(meta["truncated"]),
                       tuple(meta.get("encoded", ())), where.s3, RowSchema.from_json(typed) if typed else None,
                       tuple(meta.get("records", ())))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def frame(self, spark: SparkSession) -> DataFrame:
        """The net changes (NET_DDL; `ver` null in a delta written before versions were kept)."""
        return read_dataset(spark, Location.of(self.path, self.s3), NET_DDL)

    def record_frame(self, spark: SparkSession, formats: Sequence[str]) -> DataFrame:
        """(key, ver, then each of `formats`' record column): what the diff's pieces are made of."""
        missing = [f for f in formats if f not in self.records]
        if missing:
            raise ValueError(f"the delta at {self.path} holds no {', '.join(missing)} records of its changes")
        return read_dataset(spark, Location.of(self.path, self.s3)).select(
            "key", "ver", *(RECORD_COLUMNS[f] for f in formats))

    def images(self, spark: SparkSession) -> DataFrame:
        """Each touched key's new image as a state layer (STATE_DDL; row null: deleted)."""
        return self.frame(spark).selectExpr("key", "new AS row", "ver", "CAST(NULL AS BINARY) AS pb")

    def typed_frame(self, spark: SparkSession, schema: RowSchema) -> DataFrame | None:
        """The net changes (NET_DDL) with the typed columns of their new images (TYPED_COLUMN),
        when the diff made them for `schema`; else None."""
        if self.schema is None or self.schema != schema:
            return None
        return read_dataset(spark, Location.of(self.path, self.s3)).select(*NET_COLUMNS, TYPED_COLUMN)

    def rows(self, spark: SparkSession, formats: Sequence[str], schema: RowSchema | None = None) -> DataFrame | None:
        """The new images as state rows (ROWS_DDL; row null: deleted), encoded when the diff wrote
        them; None when the diff did not encode for all of `formats`. With `schema` (the state's,
        for parquet), also their typed columns (TYPED_COLUMN): the diff's, when it made them for
        that schema, else null (typed when the snapshot merges them)."""
        if not self.encoded or ("protobuf" in formats and "protobuf" not in self.encoded):
            return None
        frame = read_dataset(spark, Location.of(self.path, self.s3)).selectExpr("key", "sk", "new AS row", "pb", "ver",
                                                                               *self._cells(schema))
        return frame if schema is None or self.schema == schema else with_cells(frame, schema)

    def _cells(self, schema: RowSchema | None) -> tuple[str, ...]:
        return (TYPED_COLUMN,) if schema is not None and self.schema == schema else ()


def _publish(frame: DataFrame, target: Path) -> None:
    """Write `frame` as Parquet at `target` (replacing it) through a sibling temporary folder renamed
    into place. Callers write their marker after this, so a crash never leaves a dataset whose
    marker says complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    frame.write.mode("overwrite").parquet(str(tmp))
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def write_delta(net: DataFrame, delta_dir: Path | str | Location, from_position: str, to_position: str,
                truncated: bool, key_fields: Sequence[str], formats: Sequence[str] = (),
                schema: RowSchema | None = None, diff_formats: Sequence[str] = ()) -> DeltaSet:
    """Write a diff's net changes as the state's step from `from_position` to `to_position`, with
    their new images encoded for the state's `formats` and each change's record in the diff's
    record formats of `diff_formats` (`diff_records.encode_net`, one pass) when any are given, and
    typed for `schema` (TYPED_COLUMN: the rows enter the archive here, so they are typed here once,
    for the parquet diff and the next snapshot alike; a misfit raises SchemaMisfit) when given.
    `delta_dir` is a local folder or an S3 location (written by the tasks, the marker by the driver)."""
    target = Location.of(delta_dir)
    encoded, records = tuple(formats), record_formats(diff_formats)
    frame = encode_net(net, key_fields, encoded, records) if encoded or records else net
    if schema is not None:
        frame = typed_columns(frame, schema, text="new")
    with refusing_misfits():
        if target.remote:
            write_dataset(frame, target)  # replaces the folder: the old marker goes first
        else:
            _publish(frame, target.path)
    marker = {"from_position": from_position, "to_position": to_position, "truncated": truncated,
              "key_fields": list(key_fields), "encoded": list(encoded), "records": list(records), "version": 1,
              "schema": schema.to_json() if schema is not None else None}
    target.write_json(DELTA_MARKER, marker)
    return DeltaSet(target.uri, from_position, to_position, truncated, encoded, target.s3, schema, records)


def with_cells(frame: DataFrame, schema: RowSchema | None) -> DataFrame:
    """`frame` with a null typed-columns column (TYPED_COLUMN) for `schema`'s rows, when it needs
    one (`schema` given): rows whose cells are typed when a snapshot merges them."""
    if schema is None:
        return frame
    return frame.withColumn(TYPED_COLUMN, F.lit(None).cast(image_type(schema)))


def latest_images(layers: Sequence[DataFrame], ddl: str = STATE_DDL, extra: Sequence[str] = ()) -> DataFrame:
    """Layers of `ddl` rows (key first; STATE_DDL or the state's ROWS_DDL) and the `extra` columns,
    in order -> each key's row in the last layer that has the key (row null: the key was deleted).
    Only the layers are grouped: they hold changed keys, not the table. Each layer holds a key once
    (a diff's net changes, a window's), so one layer is its own latest images: returned as it is.
    """
    columns = [*(c.split()[0] for c in ddl.split(",")), *extra]
    if len(layers) == 1:
        return layers[0].select(*columns)
    rest = ", ".join(columns[1:])
    steps = [layer.selectExpr("key", f"struct({i} AS layer, {rest}) AS s") for i, layer in enumerate(layers)]
    stacked = functools.reduce(lambda a, b: a.unionByName(b), steps)
    return stacked.groupBy("key").agg({"s": "max"}).selectExpr("key", *(f"`max(s)`.{c} AS {c}" for c in columns[1:]))


@dataclass(frozen=True, slots=True)
class LayeredBase:
    """A snapshot's STATE dataset plus the deltas of the diffs after it, in chain order."""

    state: StateBase
    deltas: tuple[DeltaSet, ...]

    @property
    def position(self) -> str:
        return self.deltas[-1].to_position if self.deltas else self.state.position

    @property
    def snapshot_position(self) -> str:
        return self.state.position

    @property
    def truncated(self) -> bool:
        """Whether a diff after the snapshot wiped the table (its TRUNCATE)."""
        return any(d.truncated for d in self.deltas)

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        """The state's rows where no delta touched the key, plus each touched key's latest image.

        Only the deltas are grouped (they are as small as the diffs); the state is anti-joined
        with their keys. A truncating delta drops the state and every delta before it.
        """
        if not self.deltas:
            return self.state.frame(spark, key_fields)
        cut = max((i for i, d in enumerate(self.deltas) if d.truncated), default=-1)
        latest = latest_images([d.images(spark) for d in self.deltas[max(cut, 0):]])
        start = self.state.frame(spark, key_fields) if cut < 0 else spark.createDataFrame([], STATE_DDL)
        return start.join(latest.select("key"), "key", "left_anti").unionByName(latest.filter("row IS NOT NULL"))

    def describe(self) -> str:
        return f"{self.state.describe()} + {len(self.deltas)} diff delta(s) to {self.position}"


def rows_for(base: Base, spark: SparkSession, key_fields: Sequence[str], keys: DataFrame) -> DataFrame:
    """The base's rows (STATE_DDL) of the given keys (a `key` column). A bucketed state (with its
    deltas) reads only the buckets the keys fall in; other bases are scanned and semi-joined."""
    if isinstance(base, StateBase):
        return base.rows_for(spark, key_fields, keys)
    if isinstance(base, LayeredBase) and not base.truncated:
        if not base.deltas:
            return base.state.rows_for(spark, key_fields, keys)
        latest = latest_images([d.images(spark) for d in base.deltas]) \
            .join(keys.select("key"), "key", "left_semi")
        untouched = base.state.rows_for(spark, key_fields, keys).join(latest.select("key"), "key", "left_anti")
        return untouched.unionByName(latest.filter("row IS NOT NULL"))
    return base.frame(spark, key_fields).join(keys.select("key"), "key", "left_semi")


@dataclass(frozen=True, slots=True)
class FrameBase:
    """A table state computed in this run (e.g. a base advanced to a diff's `from`)."""

    table: DataFrame
    position: str
    origin: str

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        return self.table

    def describe(self) -> str:
        return f"{self.origin} advanced to {self.position}"


def _keyed_lines(lines: Iterable[str | None], key_fields: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, text) of each jsonl snapshot line, the line's own text kept as the row's bytes."""
    rows: list[tuple[str, str]] = []
    for line in lines:
        text = line.rstrip("\r\n") if line else line
        if not text:
            continue
        row = gojson.loads(text)
        if not isinstance(row, dict):
            raise CorruptArtifact(f"snapshot line is not a JSON object: {text[:80]!r}")
        rows.append(keyed(row, key_fields, text))
    return rows


def _jsonl_lines(batches: Iterable[Any], key_fields: tuple[str, ...]) -> Iterator[Any]:
    for batch in batches:
        yield _state_batch(_keyed_lines(batch.column("value").to_pylist(), key_fields))


def open_file(path: str, s3: S3Connection | None) -> Any:
    """A file of an artifact: a local path, or an object a task reads from S3 itself (a raw Arrow
    stream: wrap it in `io.BufferedReader` to read lines)."""
    return input_file(path, s3) if is_s3(path) else open(path, "rb")


def _snapshot_files(batches: Iterable[Any], format_id: str, key_fields: tuple[str, ...],
                    s3: S3Connection | None = None) -> Iterator[Any]:
    fmt = get_format(format_id)
    for batch in batches:
        for path in batch.column("path").to_pylist():
            with open_file(path, s3) as src:
                if format_id == "jsonl":  # an object in S3: its lines, streamed
                    lines = io.TextIOWrapper(io.BufferedReader(src), encoding="utf-8")
                    while chunk := list(itertools.islice(lines, 4096)):
                        yield _state_batch(_keyed_lines(chunk, key_fields))
                    continue
                rows: list[tuple[str, str]] = []
                for row in fmt.read_snapshot(src):
                    rows.append(keyed(row, key_fields))
                    if len(rows) >= 4096:
                        yield _state_batch(rows)
                        rows = []
                yield _state_batch(rows)


def files_frame(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """One row per file, spread so each task reads its own files."""
    frame = spark.createDataFrame([(p,) for p in paths], "path STRING")
    return frame.repartition(max(1, len(paths)))


@dataclass(frozen=True, slots=True)
class ArtifactBase:
    """A snapshot artifact's object(s): one file, or the part files of a parquet folder."""

    paths: tuple[str, ...]
    format_id: str
    position: str
    s3: S3Connection | None = None  # signs the reads of objects in S3 (`s3://` paths, read by the tasks)

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        fields = tuple(key_fields)
        paths = [p if is_s3(p) else local_path(p) for p in self.paths]
        if self.format_id == "jsonl" and not any(is_s3(p) for p in paths):
            func = functools.partial(_jsonl_lines, key_fields=fields)
            return spark.read.text(paths).mapInArrow(func, STATE_DDL)
        func = functools.partial(_snapshot_files, format_id=self.format_id, key_fields=fields, s3=self.s3)
        return files_frame(spark, paths).mapInArrow(func, STATE_DDL)

    def describe(self) -> str:
        return f"{self.format_id} snapshot at {self.position} ({len(self.paths)} file(s))"


_UNQUOTED_SPECS = frozenset({"int", "float", "bool", "json"})  # a value JSON does not quote (mostly)


def line_overhead(codec: RowCodec) -> int:
    """What a copied row's jsonl line adds to its columns' texts: braces, names, colons, commas, the
    newline and the quotes of string values (an estimate of `Census.jsonl_bytes`, not a rule)."""
    names = sum(len(gojson.quote(name).encode("utf-8")) + 2 for name in codec.names)
    quotes = 2 * sum(spec not in _UNQUOTED_SPECS for spec in codec.specs)
    return names + quotes + 2


@dataclass(frozen=True, slots=True)
class Census:
    """A table's rows as a full build needs them counted before it encodes them: how many, about how
    many jsonl bytes (which sets the bucket count, a target only), and their keys: a `key` column
    the bucket bounds are sampled from, or the sorted sort keys of a sample taken already."""

    rows: int
    jsonl_bytes: int
    keys: DataFrame | None = None
    samples: Sequence[bytes] | None = None

    def bounds(self, buckets: int) -> list[bytes]:
        """The lower bounds of `buckets` buckets of these rows (`state.bounds_of`)."""
        if self.samples is not None:
            return bounds_of(self.samples, buckets)
        assert self.keys is not None, "a census has its keys or a sample of them"
        return sample_bounds(self.keys, buckets, self.rows)


@dataclass(frozen=True, slots=True)
class BufferSnapshotBase:
    """A buffer SNAPSHOT segment (initial load or re-sync), complete as of its `to_position`."""

    segment: SegmentRef
    s3: S3Connection | None = None  # signs the read when the buffer is in S3
    records: bool = True  # encode the copied rows' protobuf records as they are read (`read_window`)

    @property
    def position(self) -> str | None:
        return self.segment.to_position

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        rows = read_window(spark, [self._snapshot_segment()], self.s3, records=self.records)
        record = "pb" if self.records else "CAST(NULL AS BINARY) AS pb"
        return rows.filter("action = 'SNAPSHOT'").selectExpr("key", "new AS row", f"{VERSION_SQL} AS ver", record)

    def encoded(self, spark: SparkSession, key_fields: Sequence[str], formats: Sequence[str],
                schema: RowSchema | None) -> DataFrame:
        """`frame`'s rows as a full build buckets them (ROWS_DDL, and with parquet in `formats` the
        typed `columns` of `schema`), encoded in one pass over the segment (`state.encode_copy`):
        the copied rows' typed cells come from the values that encoded them (`typed_copies`); the
        JVM types only the rows those kernels leave (`typed_columns(given=...)`)."""
        file = CopyFile.open(self._snapshot_segment(), self.s3)
        encoded = encode_copy(spark, file, key_fields, formats, self._typer(formats, schema))
        if PARQUET_FORMAT not in formats:
            return encoded
        assert schema is not None
        return typed_columns(encoded, schema, given=TYPED_COLUMN)

    def sorted_runs(self, spark: SparkSession, key_fields: Sequence[str], formats: Sequence[str],
                    schema: RowSchema | None, scratch: Location, bucket_bytes: int
                    ) -> contextlib.AbstractContextManager[SortedRuns | None]:
        """The copy encoded into sorted runs in `scratch`, ready to be merged into buckets without
        Spark's shuffle (`copy_tasks.sorted_runs`), or None when a row needs the JVM's typing (then
        count it with `census` and build from `encoded`)."""
        file = CopyFile.open(self._snapshot_segment(), self.s3)
        return copy_runs(spark, file, key_fields, formats, self._typer(formats, schema), scratch, bucket_bytes)

    def _typer(self, formats: Sequence[str], schema: RowSchema | None) -> CopyTyper | None:
        if PARQUET_FORMAT not in formats:
            return None
        if schema is None:
            raise ValueError("typing a copy's rows for parquet needs the table's schema")
        return CopyTyper.of(schema)

    def census(self, spark: SparkSession) -> Census:
        """What a full build must know before it buckets the rows (`Census`), in one pass of tasks
        over the segment's key and image columns (`copy_tasks.census`): the count, a sample of the
        keys, and the jsonl size estimated from the copied texts' bytes plus each line's
        punctuation and names (`line_overhead`; an encoded row's line where the buffer holds one).
        The estimate only sets the bucket count; `encoded`'s pass encodes each row once."""
        found = copy_census(spark, CopyFile.open(self._snapshot_segment(), self.s3))
        rows = sum(n for n, _ in found.groups.values())
        size = sum(b + (n * line_overhead(RowCodec.from_text(codec)) if codec else 0)
                   for codec, (n, b) in found.groups.items())
        return Census(rows, size, samples=found.samples)

    def _snapshot_segment(self) -> SegmentRef:
        if self.segment.kind != "snapshot":
            raise ValueError(f"{self.segment.name} is a {self.segment.kind} segment, not a snapshot segment")
        return self.segment

    def describe(self) -> str:
        return f"buffer re-sync {self.segment.name} at {self.segment.to_position}"


# --- choosing -----------------------------------------------------------------------------------


def choose_base(buffer: BufferView, to_position: str, *, state: StateBase | LayeredBase | None = None,
                artifact: ArtifactBase | None = None, cmp: Comparator = compare_lsn,
                buffer_s3: S3Connection | None = None, records: bool = True) -> tuple[Base, list[SegmentRef]]:
    """The base of a build that must reach `to_position`, and the change segments after it
    (`buffer_s3` signs the reads of a buffer that lives in S3; `records`: a re-sync base encodes
    its rows' protobuf records as it reads them, for a build that writes protobuf).

    A re-sync newer than the previous snapshot resets the base (the first snapshot always comes
    from the initial load). Otherwise the previous snapshot: its STATE dataset (with the deltas
    of the diffs after it, a `LayeredBase`) when it belongs to the artifact's snapshot (or there
    is no artifact), else the artifact itself.
    """
    previous: StateBase | LayeredBase | ArtifactBase | None = artifact
    if state is not None and (artifact is None or state.snapshot_position == artifact.position):
        previous = state
    resync = buffer.latest_resync()
    base: Base
    if resync is not None and (previous is None or cmp(resync.end_position, previous.position) > 0):
        if cmp(resync.end_position, to_position) > 0:
            raise ValueError(f"a re-sync ended at {resync.end_position}, after the requested snapshot position "
                             f"{to_position}; snapshot at or after it")
        if resync.segment is None:
            raise ValueError(f"the re-sync at {resync.end_position} is no longer in the buffer")
        base = BufferSnapshotBase(buffer.segment_ref(resync.segment), buffer_s3, records)
    elif previous is not None:
        base = previous
    else:
        raise ValueError("no base for a snapshot: no previous snapshot and no re-sync in the buffer")
    start = base.position
    assert start is not None
    if cmp(start, to_position) > 0:
        raise ValueError(f"the base ({base.describe()}) is after the snapshot position {to_position}")
    return base, (buffer.segments(start, to_position) if cmp(start, to_position) < 0 else [])
