"""Data that lives in object storage, read and written by Spark tasks, never through a disk the driver shares.

Why this module: the Spark here has no hadoop-aws (no `s3a://`), and on a cluster the driver and the
executors share no disk. So a dataset or an object on S3 is read and written by the tasks
themselves, with Arrow's S3 filesystem (datasets) or the multipart seam (objects), one file or one
part per task, never a row at a time and never via the driver:

* `read_parquet(spark, uri)` / `write_parquet(df, uri)`: the same call for every location. A local
  path or `file://` URI goes to Spark's own reader and writer (on a cluster that must be a mount
  every host sees); an `s3://bucket/prefix/` URI is a folder of `part-<n>.parquet` files that each
  task reads or writes on its own. The driver only lists the folder and reads one file's footer.
* `assemble_object(df, dest, key, encode)`: one object made of every partition's encoded bytes, in
  partition order: each task sends its share into a multipart upload from its own temp space
  (S3 UploadPart; a local destination's staging), the driver completes it. Partitions of any size
  work: a share under S3's 5 MiB floor is staged beside the upload and merged by the driver.

A task reaches S3 with the destination's `S3Connection` (endpoint, region, timeouts, profile
definition: no secret); the credentials are those of the task's own host, or the named profile
assumed there (resources/destinations/s3.py).
"""

from __future__ import annotations

import functools
import io
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from resources.destinations.base import Destination, PutResult
from resources.destinations.multipart import (
    MAX_PARTS,
    MIN_PART_SIZE,
    Assembling,
    CopyRange,
    MiB,
    MultipartError,
    MultipartUpload,
    PlannedPart,
    begin,
    plan_parts,
    split_evenly,
    write_planned,
)
from resources.destinations.s3 import S3Connection

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PART_FILE = "part-{:05d}.parquet"
FILES_DDL = "file STRING, rows BIGINT, bytes BIGINT"
_SPOOL_IN_MEMORY = 16 * MiB  # a task's part beyond this spills to its own temp dir (SPARK_LOCAL_DIRS/TMPDIR)
_DELETE_BATCH = 1000  # DeleteObjects' ceiling


class RemoteIOError(RuntimeError):
    """A dataset location cannot be read or written as asked (the message names the location)."""


@dataclass(frozen=True, slots=True)
class S3Location:
    """`s3://bucket/prefix/`: a folder of parquet files, reached through `connection`."""

    bucket: str
    prefix: str
    connection: S3Connection

    @classmethod
    def parse(cls, uri: str, connection: S3Connection | None) -> S3Location:
        parts = urlsplit(uri)
        if not parts.netloc:
            raise RemoteIOError(f"{uri!r}: an s3 URI needs a bucket (s3://bucket/prefix/)")
        prefix = parts.path.lstrip("/")
        return cls(parts.netloc, prefix if not prefix or prefix.endswith("/") else prefix + "/",
                   connection or S3Connection())

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def path(self, name: str) -> str:
        """The Arrow filesystem path (bucket/key) of file `name` in this folder."""
        return f"{self.bucket}/{self.prefix}{name}"


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def arrow_s3(connection: S3Connection) -> pafs.S3FileSystem:
    """Arrow's S3 filesystem signed like `connection` (built where it is used: in the task, on its host)."""
    credentials = connection.frozen_credentials()
    options: dict[str, Any] = {}
    if credentials is not None:
        options.update(access_key=credentials.access_key, secret_key=credentials.secret_key,
                       session_token=credentials.token or None)
    if connection.endpoint_url:
        endpoint = urlsplit(connection.endpoint_url)
        options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme or "https")
    import boto3

    region = connection.region or boto3.session.Session().region_name or "us-east-1"
    return pafs.S3FileSystem(region=region, connect_timeout=connection.connect_timeout,
                             request_timeout=connection.read_timeout,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=connection.max_attempts),
                             force_virtual_addressing=not connection.path_style and not connection.endpoint_url,
                             **options)


def _list_files(location: S3Location) -> list[str]:
    """The folder's data files (names), sorted; `_`/`.`-prefixed names (markers, temp files) are not data."""
    client = location.connection.client(f"dataset {location.uri}")
    names = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=location.prefix):
        for item in page.get("Contents", []):
            name = item["Key"][len(location.prefix):]
            if "/" not in name and not name.startswith(("_", ".")) and name.endswith(".parquet"):
                names.append(name)
    return sorted(names)


def _task_partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("called outside a Spark task")
    return int(context.partitionId())


# -- datasets -------------------------------------------------------------------------------------------


def _read_files(batches: Iterable[pa.RecordBatch], location: S3Location, names: Sequence[str],
                schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Task: stream the files whose indices arrive in `batches`, a record batch at a time."""
    filesystem = arrow_s3(location.connection)
    for batch in batches:
        for index in batch.column("id").to_pylist():
            with filesystem.open_input_file(location.path(names[index])) as source:
                for data in pq.ParquetFile(source).iter_batches(batch_size=batch_rows):
                    yield pa.RecordBatch.from_arrays(data.columns, schema=schema)


def read_parquet(spark: Any, uri: str, *, s3: S3Connection | None = None, schema: pa.Schema | None = None,
                 batch_rows: int = 8192) -> DataFrame:
    """The parquet dataset at `uri` as a DataFrame: Spark's reader for a local path, tasks for `s3://`.

    On S3 each file is read by one task (at most as many tasks as files); the schema is the first
    file's unless `schema` (Arrow) is given; every file must have it.
    """
    if not is_s3(uri):
        local: DataFrame = spark.read.parquet(uri)
        return local
    location = S3Location.parse(uri, s3)
    names = _list_files(location)
    if not names:
        raise RemoteIOError(f"{location.uri}: no parquet files there")
    if schema is None:
        schema = pq.read_schema(location.path(names[0]), filesystem=arrow_s3(location.connection))
    from pyspark.sql.pandas.types import from_arrow_schema

    task = functools.partial(_read_files, location=location, names=tuple(names), schema=schema,
                             batch_rows=batch_rows)
    remote: DataFrame = spark.range(0, len(names), 1, len(names)).mapInArrow(task, from_arrow_schema(schema))
    return remote


def _write_file(batches: Iterable[pa.RecordBatch], location: S3Location) -> Iterator[pa.RecordBatch]:
    """Task: this partition's rows as one parquet file named by the partition (a retry overwrites it)."""
    name = PART_FILE.format(_task_partition())
    rows = 0
    writer: pq.ParquetWriter | None = None
    stream: Any = None
    try:
        for batch in batches:
            if writer is None:
                stream = arrow_s3(location.connection).open_output_stream(location.path(name))
                writer = pq.ParquetWriter(stream, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
        if stream is not None:
            stream.close()
    if writer is not None:
        info = arrow_s3(location.connection).get_file_info(location.path(name))
        yield pa.RecordBatch.from_pydict({"file": [name], "rows": [rows], "bytes": [info.size]},
                                         schema=pa.schema([("file", pa.string()), ("rows", pa.int64()),
                                                           ("bytes", pa.int64())]))


def _clear(location: S3Location) -> None:
    """Delete what a previous write left in the folder (data files, markers), so the folder is only this write."""
    client = location.connection.client(f"dataset {location.uri}")
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=location.bucket, Prefix=location.prefix) for item in page.get("Contents", [])]
    for start in range(0, len(keys), _DELETE_BATCH):
        chunk = keys[start:start + _DELETE_BATCH]
        client.delete_objects(Bucket=location.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})


def write_parquet(df: DataFrame, uri: str, *, s3: S3Connection | None = None) -> list[str]:
    """Replace the dataset at `uri` with `df`: Spark's writer for a local path, one file per task on S3.

    Returns the files written (S3: `part-<partition>.parquet` names; empty partitions write none,
    and a dataset with no rows at all still gets one empty file carrying the schema). Local paths
    return [] (Spark names its own files).
    """
    if not is_s3(uri):
        df.write.mode("overwrite").parquet(uri)
        return []
    location = S3Location.parse(uri, s3)
    _clear(location)
    written = df.mapInArrow(functools.partial(_write_file, location=location), FILES_DDL).collect()
    names = sorted(row["file"] for row in written)
    if not names:
        from pyspark.sql.pandas.types import to_arrow_schema

        names = [PART_FILE.format(0)]
        pq.write_table(to_arrow_schema(df.schema).empty_table(), location.path(names[0]),
                       filesystem=arrow_s3(location.connection))
    return names


# -- one object from every task's share ----------------------------------------------------------------

Encoder = Callable[[Iterator[pa.RecordBatch]], Iterable[bytes]]
PARTS_PER_TASK = 16  # part numbers per partition: 625 partitions fit S3's 10,000
BODY_PART_SIZE = 64 * MiB  # a task's body parts (more when 15 of them would not hold the partition)
PIECE_DDL = "piece INT, bytes BIGINT, staged STRING, staged_bytes BIGINT, parts ARRAY<INT>"
_PIECE_ARROW = pa.schema([("piece", pa.int32()), ("bytes", pa.int64()), ("staged", pa.string()),
                          ("staged_bytes", pa.int64()), ("parts", pa.list_(pa.int32()))])


class _Limited(io.RawIOBase):
    """The next `length` bytes of `source` as a stream of their own (one body part of a spooled share)."""

    def __init__(self, source: BinaryIO, length: int) -> None:
        super().__init__()
        self._source, self._left = source, length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[: self._left]
        count = self._source.readinto(view)  # type: ignore[attr-defined]
        self._left -= count
        return int(count)


def _write_piece(batches: Iterator[pa.RecordBatch], upload: MultipartUpload, encode: Encoder,
                 parts_per_task: int) -> Iterator[pa.RecordBatch]:
    """Task: encode this partition (spooled in the task's own temp space), then send it.

    Its head (the first MIN_PART_SIZE bytes; all of it when under 2 * MIN_PART_SIZE) is staged beside
    the upload; the rest, the body, goes straight in as parts `base + 2 ...`, each at least
    MIN_PART_SIZE. The driver decides where the heads go: a head alone is a server-side copy, and
    small shares between big ones are merged into the head that follows them.
    """
    piece = _task_partition()
    base = piece * parts_per_task
    if base + parts_per_task > MAX_PARTS:
        raise MultipartError(f"{upload.uri()}: partition {piece} is beyond the {MAX_PARTS // parts_per_task} "
                             f"an object can take at {parts_per_task} parts each; coalesce the DataFrame")
    numbers: list[int] = []
    staged, head_size = "", 0
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY) as spool:
        for chunk in encode(batches):
            spool.write(chunk)
        size = spool.tell()
        spool.seek(0)
        if size:
            head_size = size if size < 2 * MIN_PART_SIZE else MIN_PART_SIZE
            staged = upload.stage(f"piece-{piece:05d}", spool.read(head_size)).key
        body = size - head_size
        if body:
            target = max(BODY_PART_SIZE, -(-body // (parts_per_task - 1)))
            for number, length in enumerate(split_evenly(body, target), start=base + 2):
                upload.write_part(number, _Limited(spool, length))  # type: ignore[arg-type]
                numbers.append(number)
    yield pa.RecordBatch.from_pydict({"piece": [piece], "bytes": [size], "staged": [staged],
                                      "staged_bytes": [head_size], "parts": [numbers]}, schema=_PIECE_ARROW)


def _final_parts(pieces: Sequence[Any], parts_per_task: int) -> tuple[list[PlannedPart], list[int]]:
    """The parts the driver still writes (staged heads and small shares, planned per run) and the body
    parts the tasks wrote; a run of staged pieces takes numbers from its first piece's block on, which
    stay below the body that follows (a run has no more parts than pieces)."""
    planned: list[PlannedPart] = []
    written: list[int] = []
    run: list[CopyRange] = []
    run_first = 0
    for piece in sorted(pieces, key=lambda p: int(p["piece"])):
        if not piece["bytes"]:
            continue
        if not run:
            run_first = int(piece["piece"]) * parts_per_task + 1
        run.append(CopyRange(str(piece["staged"]), 0, int(piece["staged_bytes"])))
        if piece["parts"]:
            planned.extend(plan_parts(run, first_number=run_first))
            written.extend(int(n) for n in piece["parts"])
            run = []
    if run:
        planned.extend(plan_parts(run, first_number=run_first))
    return planned, written


def assemble_object(df: DataFrame, dest: Destination, key: str, encode: Encoder, *,
                    parts_per_task: int = PARTS_PER_TASK, threads: int = 8) -> PutResult:
    """The object `key` on `dest`: every partition's `encode`d bytes, in partition order.

    Tasks write their bodies as parts and stage their heads; the driver then copies or merges the
    heads (`threads` at a time) and completes the upload, or aborts it if anything fails (no part
    or staged piece lingers). Partitions may have any size; bytes pass through the driver only where
    shares smaller than S3's 5 MiB floor are merged (at most 10 MiB per merged part).
    """
    upload = begin(dest, key)
    with Assembling(upload) as job:
        task = functools.partial(_write_piece, upload=upload, encode=encode, parts_per_task=parts_per_task)
        planned, written = _final_parts(df.mapInArrow(task, PIECE_DDL).collect(), parts_per_task)
        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="assemble") as pool:
            list(pool.map(lambda part: write_planned(upload, part), planned))
        return job.complete(sorted([*written, *(part.number for part in planned)]))
