"""A copy (initial load, re-sync) counted, sampled and encoded by tasks that read its segment themselves.

Why: a copy is the whole table, kept in one buffer segment as column texts (`list<string>` per
row). Read by Spark's parquet reader and handed to a Python task, every row crossed JVM → Python as
nested Arrow; on the benchmark's 1,000,000-row table that crossing cost more than the encoding it
fed (an encode pass of 19.5 s, against 11.3 s when the tasks read the file themselves), and the
census before it (the count, the jsonl size and a key sample) read the whole segment through the
JVM twice more. Here each task opens the segment file (a local path or an S3 object:
`remote_io.input_file`, so a cluster reads it from where it lives), takes its slice of row groups,
and only what the build needs goes to the JVM: the encoded rows (ROWS_DDL, for the shuffle into
buckets) or a few census rows.

Which rows: the segment's own (`SegmentRef.seq_mask`) that are copies (`action = 'SNAPSHOT'`).
Their versions are `copy_versions`, VERSION_SQL's rule for a copied row.
"""

from __future__ import annotations

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
from snapshot_assets.spark.state import REPORT_DDL, ROWS_DDL, BucketWriter, copy_batches
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
_RUNS_ARROW = pa.schema([("bucket", pa.int32()), ("uri", pa.string()), ("first", pa.int32()), ("stop", pa.int32())])
_RUNS_DDL = ddl_of(_RUNS_ARROW)
_RUN_BATCH_ROWS = 65_536


def _cuts(sks: pa.Array, bounds: Sequence[bytes]) -> list[int]:
    """Where each bucket's rows begin in the sorted sort keys `sks` (binary search: a few dozen
    comparisons per bound), and their end."""
    cuts = [0]
    for bound in bounds:
        low, high = cuts[-1], len(sks)
        while low < high:
            middle = (low + high) // 2
            if sks[middle].as_py() < bound:
                low = middle + 1
            else:
                high = middle
        cuts.append(low)
    return [*cuts, len(sks)]


def _run_task(batches: Iterable[pa.RecordBatch], file: CopyFile, key_fields: tuple[str, ...], protobuf: bool,
              typer: CopyTyper | None, bounds: tuple[bytes, ...], scratch: Location) -> Iterator[pa.RecordBatch]:
    """Encode the slices' rows, sort them by sk and write them to one Arrow IPC file in `scratch`,
    bucket by bucket; report each bucket's run (its record batches [first, stop) in the file)."""
    encoded = []
    for batch in _encode_task(batches, file, key_fields, protobuf, typer):
        if typer is not None and batch.column(TYPED_COLUMN).null_count:
            raise RuntimeError(NEEDS_JVM_TYPING)
        encoded.append(batch)
    if not encoded:
        return
    rows = pa.Table.from_batches(encoded).sort_by("sk").combine_chunks()
    cuts = _cuts(rows.column("sk").chunk(0), bounds)
    target = scratch / f"run-{task_partition():05d}.arrow"
    filesystem, folder = scratch.filesystem()
    runs: list[dict[str, Any]] = []
    written = 0
    options = ipc.IpcWriteOptions(compression="lz4")
    with filesystem.open_output_stream(f"{folder}/{target.name}") as sink, \
            ipc.new_file(sink, rows.schema, options=options) as writer:
        for bucket, (low, high) in enumerate(itertools.pairwise(cuts)):
            if high == low:
                continue
            first = written
            for batch in rows.slice(low, high - low).to_batches(max_chunksize=_RUN_BATCH_ROWS):
                writer.write_batch(batch)
                written += 1
            runs.append({"bucket": bucket, "uri": target.uri, "first": first, "stop": written})
    yield pa.RecordBatch.from_pylist(runs, schema=_RUNS_ARROW)


def _merge_task(batches: Iterable[pa.RecordBatch], runs: Mapping[int, Sequence[tuple[str, int, int]]],
                s3: S3Connection | None, write: BucketWriter) -> Iterator[pa.RecordBatch]:
    """Each bucket of this task: its runs read back from scratch and merged by sk, handed to `write`."""
    def merged() -> Iterator[pa.RecordBatch]:
        for bucket in _slice_ids(batches):
            pieces: list[pa.RecordBatch] = []
            for uri, first, stop in runs.get(bucket, ()):
                with input_file(uri, s3) as source:
                    reader = ipc.open_file(source)
                    pieces.extend(reader.get_batch(i) for i in range(first, stop))
            if not pieces:
                continue
            rows = pa.Table.from_batches(pieces).sort_by("sk").combine_chunks()
            rows = rows.add_column(0, "bucket", pa.array(np.full(rows.num_rows, bucket, dtype=np.int32)))
            yield from rows.to_batches(max_chunksize=_RUN_BATCH_ROWS)
    yield from write(merged())


def write_buckets(spark: SparkSession, file: CopyFile, key_fields: Sequence[str], formats: Sequence[str],
                  typer: CopyTyper | None, bounds: Sequence[bytes], scratch: Location,
                  write: BucketWriter) -> list[Any] | None:
    """The copy's buckets written by `write` (state.bucket_writer), without Spark's shuffle: one task
    per slice encodes its rows, sorts them by sk and writes them to scratch as one Arrow IPC file of
    per-bucket runs; then one task per bucket reads its runs (local or S3: ranged reads) and merges
    them. Returns the bucket tasks' reports (REPORT_DDL), or None when a copied row needs the JVM's
    typing (the caller builds through Spark's shuffle, as `BufferSnapshotBase.encoded` plans it).

    Why: through Spark's shuffle every encoded row crossed Python → JVM, was shuffled, and crossed
    back for the bucket writes; that cost more task time than the encoding (1,000,000 rows: two
    thirds of the build). Here the rows stay Arrow from the encoding to the bucket files."""
    folder = (scratch / f"copy-{uuid.uuid4().hex[:12]}").make()
    try:
        task = functools.partial(_run_task, file=file, key_fields=tuple(key_fields), protobuf="protobuf" in formats,
                                 typer=typer, bounds=tuple(bounds), scratch=folder)
        try:
            reported = file.frame(spark, task, _RUNS_DDL).collect()
        except Exception as exc:  # only the marker of a row left to the JVM is ours; the rest propagates
            if NEEDS_JVM_TYPING in str(exc):
                return None
            raise
        runs: dict[int, list[tuple[str, int, int]]] = {}
        for r in reported:
            runs.setdefault(int(r["bucket"]), []).append((r["uri"], int(r["first"]), int(r["stop"])))
        count = len(bounds) + 1  # task i merges bucket i (one without rows writes nothing)
        merge = functools.partial(_merge_task, runs=runs, s3=folder.s3, write=write)
        return list(spark.range(0, count, 1, count).mapInArrow(merge, REPORT_DDL).collect())
    finally:
        folder.clear()
