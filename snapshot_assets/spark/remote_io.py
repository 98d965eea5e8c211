"""Parquet datasets that live in object storage, read and written by Spark tasks, never via the driver.

Why this module: the Spark here has no hadoop-aws (no `s3a://`), and on a cluster the driver and the
executors share no disk. So a dataset on S3 is read and written by the tasks themselves with
Arrow's S3 filesystem, one file per task, a record batch at a time (never a row at a time).
`read_parquet(spark, uri)` / `write_parquet(df, uri)` are the same call for every location: a
local path or `file://` URI goes to Spark's own reader and writer (on a cluster, a mount every host
sees); an `s3://bucket/prefix/` URI is a folder of `part-<n>.parquet` files. The driver only lists
the folder and reads one file's footer. (Single objects assembled from every task's share:
task_objects.py.)

A task reaches S3 with the destination's `S3Connection` (endpoint, region, timeouts, profile
definition: no secret); the credentials are those of the task's own host, or the named profile
assumed there (resources/destinations/s3.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from resources.destinations.s3 import S3Connection

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PART_FILE = "part-{:05d}.parquet"
FILES_DDL = "file STRING, rows BIGINT, bytes BIGINT"
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


def input_file(uri: str, s3: S3Connection | None = None) -> Any:
    """One file to read, a local path or an `s3://` URI (in a task: Arrow's filesystem of its host)."""
    if not is_s3(uri):
        return pafs.LocalFileSystem().open_input_file(uri)
    location = S3Location.parse(uri, s3)
    return arrow_s3(location.connection).open_input_file(f"{location.bucket}/{location.prefix.rstrip('/')}")


def task_partition() -> int:
    """The running task's partition id (stable across its retries, so names and numbers built on it are)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("called outside a Spark task")
    return int(context.partitionId())


# -- datasets -------------------------------------------------------------------------------------------


def conformed(data: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`data` laid out as `schema`: columns by name, cast where the file's type differs (string vs
    large_string), absent ones null (older files of a dataset whose schema grew, as Spark's reader
    treats them)."""
    columns = []
    for field in schema:
        index = data.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        column = data.column(index)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _read_objects(batches: Iterable[pa.RecordBatch], connection: S3Connection, paths: Sequence[str],
                  schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Task: stream the files (Arrow paths `bucket/key`) whose indices arrive in `batches`, a record
    batch at a time, each laid out as `schema`."""
    filesystem = arrow_s3(connection)
    for batch in batches:
        for index in batch.column("id").to_pylist():
            with filesystem.open_input_file(paths[index]) as source:
                file = pq.ParquetFile(source)
                present = [name for name in schema.names if name in file.schema_arrow.names]
                for data in file.iter_batches(batch_size=batch_rows, columns=present):
                    yield conformed(data, schema)


def _files_frame(spark: Any, connection: S3Connection, paths: Sequence[str], schema: pa.Schema,
                 batch_rows: int) -> DataFrame:
    """One task per file, in the order given (partition i reads file i)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    task = functools.partial(_read_objects, connection=connection, paths=tuple(paths), schema=schema,
                             batch_rows=batch_rows)
    frame: DataFrame = spark.range(0, len(paths), 1, len(paths)).mapInArrow(task, from_arrow_schema(schema))
    return frame


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
    return _files_frame(spark, location.connection, [location.path(n) for n in names], schema, batch_rows)


def read_parquet_files(spark: Any, uris: Sequence[str], *, s3: S3Connection | None = None, ddl: str | None = None,
                       batch_rows: int = 8192) -> DataFrame:
    """The parquet files `uris` (all local paths, or all `s3://` URIs) as one DataFrame.

    Local: Spark's reader. S3: one task per file, in the order given (so a single-partition
    consumer sees the files' rows in that order). `ddl` is the schema to read (missing columns are
    null); without it, the first file's.
    """
    if not uris:
        raise RemoteIOError("no parquet files to read")
    remote = [is_s3(u) for u in uris]
    if not any(remote):
        reader = spark.read.schema(ddl) if ddl else spark.read
        local: DataFrame = reader.parquet(*uris)
        return local
    if not all(remote):
        raise RemoteIOError(f"cannot read local files and s3 objects as one dataset: {list(uris)[:4]}")
    locations = [S3Location.parse(u, s3) for u in uris]
    paths = [f"{loc.bucket}/{loc.prefix.rstrip('/')}" for loc in locations]
    connection = locations[0].connection
    schema = arrow_schema_of(spark, ddl) if ddl else pq.read_schema(paths[0], filesystem=arrow_s3(connection))
    return _files_frame(spark, connection, paths, schema, batch_rows)


def arrow_schema_of(spark: Any, ddl: str) -> pa.Schema:
    """The Arrow schema of a Spark DDL string, as Spark itself maps the types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark.createDataFrame([], ddl).schema)


def _write_file(batches: Iterable[pa.RecordBatch], location: S3Location) -> Iterator[pa.RecordBatch]:
    """Task: this partition's rows as one parquet file named by the partition (a retry overwrites it)."""
    name = PART_FILE.format(task_partition())
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


def clear_prefix(location: S3Location) -> None:
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
    clear_prefix(location)
    written = df.mapInArrow(functools.partial(_write_file, location=location), FILES_DDL).collect()
    names = sorted(row["file"] for row in written)
    if not names:
        from pyspark.sql.pandas.types import to_arrow_schema

        names = [PART_FILE.format(0)]
        pq.write_table(to_arrow_schema(df.schema).empty_table(), location.path(names[0]),
                       filesystem=arrow_s3(location.connection))
    return names
