"""A copy (initial load, re-sync) counted, sampled and encoded by tasks that read its segment themselves.

Why: a copy is the whole table, kept in one buffer segment as column texts (`list<string>` per
row). Read by Spark's parquet reader and handed to a Python task, every row crossed JVM → Python as
nested Arrow; on the benchmark's 1,000,000-row table that crossing cost more than the encoding it
fed (an encode pass of 19.5 s, against 11.3 s when the tasks read the file themselves), and the
census before it (the count, the jsonl size and a key sample) read the whole segment through the
JVM twice more. Here each task opens the segment file (a local path or an S3 object:
`remote_io.input_file`, so a cluster reads it from where it lives), takes its slice of row groups,
and only what the build needs goes to the JVM: normally a few report rows per task, the rows
themselves going to their buckets through sorted runs in scratch (`sorted_runs`); the encoded rows
(ROWS_DDL, `encode_copy`) and a census pass (`census`) only when a row needs the JVM's typing and
the build falls back to Spark's shuffle.

Which rows: the segment's own (`SegmentRef.seq_mask`) that are copies (`action = 'SNAPSHOT'`).
Their versions are `copy_versions`, VERSION_SQL's rule for a copied row.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from resources.buffer.reader import SegmentRef
from resources.buffer.segments import SCHEMA, TYPED_COLUMN
from resources.destinations.s3 import S3Connection
from snapshot_assets.archive import versions
from snapshot_assets.archive.sortkey import sort_keys
from snapshot_assets.spark.effects import ddl_of
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.parquet_artifact import image_type
from snapshot_assets.spark.remote_io import conformed, input_file, task_partition
from snapshot_assets.spark.state import REPORT_DDL, ROWS_DDL, BucketWriter, bucket_of, copy_batches, in_bucket
from snapshot_assets.spark.typed_copies import CopyTyper

#: Rows one task reads and encodes (whole row groups, so a task may take more): a 1,000,000-row
#: copy is 4 tasks, as many as a local runtime's cores; a larger one spreads over a cluster.
TASK_ROWS = 250_000
#: And at most this much of the segment's column data (uncompressed), so a table of wide rows is cut
#: finer: a task holds its slice's encoded rows (about 2-3 times that) while it sorts them.
TASK_BYTES = 128 << 20
#: Keys the census samples for the bucket bounds (every n-th row of the file, so the sample does
#: not depend on how the row groups are split into tasks): about 32 a bucket for 2,000 buckets.
SAMPLE_ROWS = 1 << 16
_BATCH_ROWS = 10_000
_CENSUS_ARROW = pa.schema([("codec", pa.string()), ("n", pa.int64()), ("b", pa.int64()), ("sk", pa.binary())])
_CENSUS_DDL = ddl_of(_CENSUS_ARROW)


@dataclass(frozen=True, slots=True)
class Slice:
    """A task's share of the segment file: row groups [first, stop), whose first row is row `offset` of the file."""

    first: int
    stop: int
    offset: int


@dataclass(frozen=True, slots=True)
class CopyFile:
    """The segment of a copy, as its tasks read it: the file, its rows and their slices."""

    segment: SegmentRef
    s3: S3Connection | None
    rows: int
    slices: tuple[Slice, ...]

    @classmethod
    def open(cls, segment: SegmentRef, s3: S3Connection | None, task_rows: int = TASK_ROWS,
             task_bytes: int = TASK_BYTES) -> CopyFile:
        """The segment's slices, from its file's footer (the one read the driver makes)."""
        with input_file(segment.path, s3) as source:
            meta = pq.ParquetFile(source).metadata
        slices: list[Slice] = []
        first = offset = taken = size = 0
        for group in range(meta.num_row_groups):
            taken += meta.row_group(group).num_rows
            size += meta.row_group(group).total_byte_size
            if taken >= task_rows or size >= task_bytes or group == meta.num_row_groups - 1:
                slices.append(Slice(first, group + 1, offset))
                first, offset, taken, size = group + 1, offset + taken, 0, 0
        return cls(segment, s3, meta.num_rows, tuple(slices))

    def frame(self, spark: SparkSession, task: Any, schema: str | StructType) -> DataFrame:
        """`task(batches of slice ids)` run over one partition per slice."""
        count = max(1, len(self.slices))
        frame: DataFrame = spark.range(0, len(self.slices), 1, count).mapInArrow(task, schema)
        return frame


def copy_versions(batch: pa.RecordBatch) -> pa.Array:
    """The version of each copied row of `batch`: VERSION_SQL for `action = 'SNAPSHOT'`, in Arrow."""
    commit = pc.fill_null(batch.column("commit_time"), "")
    return pc.binary_join_element_wise(batch.column("position"), commit, versions.COPY, versions.SEP)


def _copied_rows(file: CopyFile, slice_ids: Iterable[int], columns: Sequence[str] | None = None
                 ) -> Iterator[tuple[int, pa.RecordBatch, pa.Array]]:
    """Each batch of the slices' rows (laid out as the buffer's SCHEMA, or just `columns`) with the
    file row number of its first row, and which of its rows are the segment's copied rows."""
    names = list(columns) if columns is not None else SCHEMA.names
    layout = pa.schema([SCHEMA.field(name) for name in names])
    with input_file(file.segment.path, file.s3) as source:
        parquet = pq.ParquetFile(source)
        present = [name for name in names if name in parquet.schema_arrow.names]
        for index in slice_ids:
            part = file.slices[index]
            row = part.offset
            for data in parquet.iter_batches(batch_size=_BATCH_ROWS, row_groups=range(part.first, part.stop),
                                             columns=present):
                batch = conformed(data, layout)
                keep = pc.and_(file.segment.seq_mask(batch.column("seq")), pc.equal(batch.column("action"), "SNAPSHOT"))
                yield row, batch, keep
                row += batch.num_rows


def _slice_ids(batches: Iterable[pa.RecordBatch]) -> Iterator[int]:
    for batch in batches:
        yield from batch.column("id").to_pylist()


def _encode_task(batches: Iterable[pa.RecordBatch], file: CopyFile, key_fields: tuple[str, ...], protobuf: bool,
                 typer: CopyTyper | None) -> Iterator[pa.RecordBatch]:
    def copied() -> Iterator[pa.RecordBatch]:
        for _, batch, keep in _copied_rows(file, _slice_ids(batches)):
            rows = batch.filter(keep)
            if rows.num_rows:
                yield rows.append_column("ver", copy_versions(rows))
    yield from copy_batches(copied(), key_fields, protobuf, typer)


def encode_copy(spark: SparkSession, file: CopyFile, key_fields: Sequence[str], formats: Sequence[str],
                typer: CopyTyper | None) -> DataFrame:
    """The copy's rows as ROWS_DDL, each encoded once (`state.copy_batches`: Go-JSON text, protobuf
    record, sort key and, with `typer`, its typed cells as `TYPED_COLUMN`), by tasks that read the
    segment themselves."""
    out = StructType.fromDDL(ROWS_DDL)
    assert isinstance(out, StructType)
    if typer is not None:
        out = out.add(TYPED_COLUMN, image_type(typer.schema))
    task = functools.partial(_encode_task, file=file, key_fields=tuple(key_fields), protobuf="protobuf" in formats,
                             typer=typer)
    return file.frame(spark, task, out)


_CENSUS_COLUMNS = ("seq", "action", "codec", "key", "new", "new_text")


def _census_task(batches: Iterable[pa.RecordBatch], file: CopyFile, step: int) -> Iterator[pa.RecordBatch]:
    """Per codec, the copied rows and the bytes of their texts (a row without a codec: its encoded
    line, newline included); then the sort keys of the copied rows at file rows 0, step, 2 step, ..."""
    totals: dict[str | None, list[int]] = {}
    sampled: list[pa.Array] = []
    for row, batch, keep in _copied_rows(file, _slice_ids(batches), _CENSUS_COLUMNS):
        rows = batch.filter(keep)
        codecs = rows.column("codec")
        for codec in pc.unique(codecs).to_pylist() if rows.num_rows else []:
            mine = rows.filter(pc.is_null(codecs) if codec is None else pc.equal(codecs, codec))
            if codec is None:  # an encoded line: its bytes and the newline
                size = pc.sum(pc.add(pc.binary_length(mine.column("new")), 1)).as_py()
            else:
                size = pc.sum(pc.binary_length(pc.list_flatten(mine.column("new_text")))).as_py()
            total = totals.setdefault(codec, [0, 0])
            total[0] += mine.num_rows
            total[1] += size or 0
        numbers = np.arange(row, row + batch.num_rows)
        chosen = pc.and_(keep, pa.array(numbers % step == 0))
        if pc.any(chosen).as_py():
            sampled.append(sort_keys(batch.column("key").filter(chosen)))
    census = [(codec, n, b, None) for codec, (n, b) in totals.items()]
    yield pa.RecordBatch.from_pylist([dict(zip(_CENSUS_ARROW.names, c, strict=True)) for c in census],
                                     schema=_CENSUS_ARROW)
    for sks in sampled:
        yield pa.RecordBatch.from_arrays([pa.nulls(len(sks), pa.string()), pa.nulls(len(sks), pa.int64()),
                                          pa.nulls(len(sks), pa.int64()), sks], schema=_CENSUS_ARROW)


@dataclass(frozen=True, slots=True)
class CopyCensus:
    """What the census of a copy found: copied rows and text bytes per codec, and the sampled sort keys."""

    groups: dict[str | None, tuple[int, int]]
    samples: list[bytes]


def census(spark: SparkSession, file: CopyFile) -> CopyCensus:
    """One pass over the segment's key and image columns (no row crosses into the JVM)."""
    step = max(1, math.ceil(file.rows / SAMPLE_ROWS))
    rows = file.frame(spark, functools.partial(_census_task, file=file, step=step), _CENSUS_DDL).collect()
    groups: dict[str | None, tuple[int, int]] = {}
    samples: list[bytes] = []
    for r in rows:
        if r["sk"] is not None:
            samples.append(bytes(r["sk"]))
            continue
        n, b = groups.get(r["codec"], (0, 0))
        groups[r["codec"]] = (n + int(r["n"]), b + int(r["b"]))
    return CopyCensus(groups, sorted(samples))


# --- writing the buckets: sorted runs in scratch, merged per bucket ------------------------------------

#: What a run task raises when the typer left a row to the JVM's typing (`typed_columns(given=...)`):
#: the driver then builds the copy through Spark's shuffle, where the JVM types those rows.
NEEDS_JVM_TYPING = "snapshotter-copy-needs-jvm-typing"
_RUNS_ARROW = pa.schema([("uri", pa.string()), ("batch", pa.int32()), ("first", pa.binary()), ("last", pa.binary()),
                         ("rows", pa.int64()), ("bytes", pa.int64()), ("sample", pa.binary())])
_RUNS_DDL = ddl_of(_RUNS_ARROW)
#: A run's record batches hold about this fraction of the rows the run gives each bucket, so a
#: bucket's merge reads at most two batches of each run beyond its own rows (see `_batch_rows`).
_BATCHES_PER_BUCKET = 4
_MIN_BATCH_ROWS, _MAX_BATCH_ROWS = 1024, 65_536


def _batch_rows(run_rows: int, run_bytes: int, file_rows: int, bucket_bytes: int) -> int:
    """The rows of each record batch of a run: the bucket count this run's rows suggest for the whole
    file (its jsonl bytes per row times the file's rows, over `bucket_bytes`) gives the rows of this
    run each bucket gets, and a batch is a `_BATCHES_PER_BUCKET`-th of that."""
    buckets = max(1.0, file_rows * (run_bytes / max(1, run_rows)) / bucket_bytes)
    return int(min(_MAX_BATCH_ROWS, max(_MIN_BATCH_ROWS, run_rows / buckets / _BATCHES_PER_BUCKET)))


def _run_task(batches: Iterable[pa.RecordBatch], file: CopyFile, key_fields: tuple[str, ...], protobuf: bool,
              typer: CopyTyper | None, scratch: Location, step: int, bucket_bytes: int) -> Iterator[pa.RecordBatch]:
    """Encode the slices' rows, sort them by sk and write them to one Arrow IPC file in `scratch`;
    report each record batch (its first and last sk, rows and jsonl bytes) and, with the first, the
    sort keys of the sorted rows 0, step, 2 step, ... (the census: the driver's bucket bounds come
    from them)."""
    encoded = []
    for batch in _encode_task(batches, file, key_fields, protobuf, typer):
        if typer is not None and batch.column(TYPED_COLUMN).null_count:
            raise RuntimeError(NEEDS_JVM_TYPING)
        encoded.append(batch)
    if not encoded:
        return
    rows = _sorted_by_sk(pa.Table.from_batches(encoded))
    sks = rows.column("sk")
    lines = pc.add(pc.binary_length(rows.column("row")), 1)  # a jsonl line and its newline
    size = int(pc.sum(lines).as_py() or 0)
    target = scratch / f"run-{task_partition():05d}.arrow"
    filesystem, folder = scratch.filesystem()
    reports: dict[str, list[Any]] = {name: [] for name in _RUNS_ARROW.names}
    step_rows = _batch_rows(rows.num_rows, size, file.rows, bucket_bytes)
    index = 0
    with filesystem.open_output_stream(f"{folder}/{target.name}") as sink, \
            ipc.new_file(sink, rows.schema, options=ipc.IpcWriteOptions(compression="lz4")) as writer:
        for first in range(0, rows.num_rows, step_rows):
            low = first
            for batch in rows.slice(first, step_rows).to_batches():  # more than one where chunks meet
                if not batch.num_rows:
                    continue
                writer.write_batch(batch)
                count = batch.num_rows
                for name, value in (("uri", target.uri), ("batch", index), ("first", sks[low].as_py()),
                                    ("last", sks[low + count - 1].as_py()), ("rows", count),
                                    ("bytes", pc.sum(lines.slice(low, count)).as_py()), ("sample", None)):
                    reports[name].append(value)
                index += 1
                low += count
    # The sample as one value: a row each would cost the driver's collect more than the sorting.
    reports["sample"][0] = _packed(sks.take(pa.array(np.arange(0, len(sks), step))).combine_chunks())
    yield pa.RecordBatch.from_pydict(reports, schema=_RUNS_ARROW)


def _sorted_by_sk(rows: pa.Table) -> pa.Table:
    """`rows` in sk order. A copy often comes in key order already (a table filled in key order and
    seldom updated keeps its heap in that order): then the rows are neither gathered again nor
    combined into one chunk (each is a copy of the slice's encoded rows into fresh memory: 0.3-0.4 s
    apiece for a 250,000-row slice of the benchmark's table, about a tenth of its task)."""
    order = pc.sort_indices(rows, sort_keys=[("sk", "ascending")])
    if np.array_equal(order.to_numpy(), np.arange(rows.num_rows)):
        return rows
    return rows.take(order)


_SAMPLE_ARROW = pa.schema([("sk", pa.binary())])


def _packed(sks: pa.Array) -> bytes:
    """Sort keys as one binary value (an Arrow IPC stream), for a report row."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, _SAMPLE_ARROW) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays([sks], schema=_SAMPLE_ARROW))
    return bytes(sink.getvalue().to_pybytes())


def _unpacked(blob: bytes) -> list[bytes]:
    return [bytes(sk) for sk in ipc.open_stream(pa.py_buffer(blob)).read_all().column("sk").to_pylist()]


def _merge_task(batches: Iterable[pa.RecordBatch], runs: Mapping[int, Mapping[str, Sequence[int]]],
                bounds: Sequence[bytes], s3: S3Connection | None, write: BucketWriter) -> Iterator[pa.RecordBatch]:
    """Each bucket of this task: the run batches that may hold its rows read back from scratch, its
    rows taken from them (`bounds`: bucket i is [bounds[i-1], bounds[i])) and merged by sk, handed to `write`."""
    def merged() -> Iterator[pa.RecordBatch]:
        for bucket in _slice_ids(batches):
            pieces: list[pa.RecordBatch] = []
            for uri, indexes in runs.get(bucket, {}).items():
                with input_file(uri, s3) as source:
                    reader = ipc.open_file(source)
                    pieces.extend(reader.get_batch(i) for i in indexes)
            if not pieces:
                continue
            rows = pa.Table.from_batches(pieces)
            rows = rows.filter(in_bucket(rows.column("sk"), bounds, bucket)).sort_by("sk").combine_chunks()
            if not rows.num_rows:
                continue
            rows = rows.add_column(0, "bucket", pa.array(np.full(rows.num_rows, bucket, dtype=np.int32)))
            yield from rows.to_batches(max_chunksize=_MAX_BATCH_ROWS)
    yield from write(merged())


@dataclass(frozen=True, slots=True)
class RunBatch:
    """One record batch of a sorted run in scratch: where it is and the sort keys it spans."""

    uri: str
    index: int
    first: bytes
    last: bytes

    def buckets(self, bounds: Sequence[bytes]) -> range:
        """The buckets some of its rows may fall in: those of its first and last sort key and any
        between (`state.bucket_of`, the one rule)."""
        return range(bucket_of(bounds, self.first), bucket_of(bounds, self.last) + 1)


@dataclass(frozen=True, slots=True)
class SortedRuns:
    """A copy encoded by one task per slice into sorted runs in scratch, and what they hold: the
    census a full build buckets by (rows, exact jsonl bytes, sampled sort keys) for free."""

    batches: tuple[RunBatch, ...]
    rows: int
    jsonl_bytes: int
    samples: list[bytes]
    s3: S3Connection | None

    def write(self, spark: SparkSession, bounds: Sequence[bytes], write: BucketWriter) -> list[Any]:
        """One task per bucket (`len(bounds) + 1`): it reads the run batches that meet its key range,
        keeps its rows, merges them by sk and hands them to `write` (state.bucket_writer); the
        tasks' reports (REPORT_DDL)."""
        runs: dict[int, dict[str, list[int]]] = {}
        for b in self.batches:
            for i in b.buckets(bounds):
                runs.setdefault(i, {}).setdefault(b.uri, []).append(b.index)
        count = len(bounds) + 1  # task i merges bucket i (one without rows writes nothing)
        merge = functools.partial(_merge_task, runs=runs, bounds=tuple(bounds), s3=self.s3, write=write)
        return list(spark.range(0, count, 1, count).mapInArrow(merge, REPORT_DDL).collect())


@contextlib.contextmanager
def sorted_runs(spark: SparkSession, file: CopyFile, key_fields: Sequence[str], formats: Sequence[str],
                typer: CopyTyper | None, scratch: Location, bucket_bytes: int) -> Iterator[SortedRuns | None]:
    """The copy's rows encoded once and sorted into runs in a folder of `scratch` (deleted on leaving),
    or None when a copied row needs the JVM's typing (the caller builds through Spark's shuffle, as
    `BufferSnapshotBase.encoded` plans it).

    Why: through Spark's shuffle every encoded row crossed Python → JVM, was shuffled, and crossed
    back for the bucket writes; that cost more task time than the encoding (1,000,000 rows: two
    thirds of the build). Here the rows stay Arrow from the encoding to the bucket files, and the
    runs' own reports are the census (a separate census pass read the segment once more: 2.4 s of
    a 10.6 s build of 1,000,000 rows)."""
    folder = (scratch / f"copy-{uuid.uuid4().hex[:12]}").make()
    try:
        step = max(1, math.ceil(file.rows / SAMPLE_ROWS))
        task = functools.partial(_run_task, file=file, key_fields=tuple(key_fields), protobuf="protobuf" in formats,
                                 typer=typer, scratch=folder, step=step, bucket_bytes=bucket_bytes)
        try:
            reported = file.frame(spark, task, _RUNS_DDL).collect()
        except Exception as exc:  # only the marker of a row left to the JVM is ours; the rest propagates
            if NEEDS_JVM_TYPING in str(exc):
                yield None
                return
            raise
        batches = tuple(RunBatch(r["uri"], int(r["batch"]), bytes(r["first"]), bytes(r["last"])) for r in reported)
        samples = sorted(itertools.chain.from_iterable(_unpacked(r["sample"]) for r in reported if r["sample"]))
        yield SortedRuns(batches, sum(int(r["rows"]) for r in reported), sum(int(r["bytes"]) for r in reported),
                         samples, folder.s3)
    finally:
        folder.clear()
