"""remote_io: datasets and objects on S3 (moto_server) written and read by Spark tasks.

The local tests run on the suite's classic local[2] session; the cluster tests on a standalone
cluster (tests/spark/cluster.py) whose processes share no disk with the driver or each other, only
the S3 endpoint: there the object the workers' tasks assemble must equal, byte for byte, what the
local runtime produces, and the datasets they write must read back whole.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import cloudpickle

from resources.destinations.local import LocalDestination
from resources.destinations.s3 import MiB, S3Destination
from snapshot_assets.spark.remote_io import (
    RemoteIOError,
    arrow_s3,
    assemble_object,
    read_parquet,
    write_parquet,
)
from tests.aws.conftest import Moto, start_moto
from tests.spark.cluster import EXECUTOR_ACCESS_KEY, SparkCluster

# The tasks run this module's functions; executors import only the shipped project, so ship these by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.s3, pytest.mark.slow]  # Spark jobs: seconds each, the cluster tens
ROWS_PER_PARTITION = 42_000  # ~6 MiB of jsonl per partition: every part but the last clears S3's 5 MiB
PARTITIONS = 3
DATASET_ROWS = 20_000


def _rows_df(spark: Any, partitions: int = PARTITIONS, per_partition: int = ROWS_PER_PARTITION) -> Any:
    """Rows in id order, partition p holding the p-th contiguous id range."""
    return spark.range(0, partitions * per_partition, 1, partitions).selectExpr(
        "id", "concat('user-', id) AS name", "repeat(chr(97 + id % 26), 96) AS pad")


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"user-{i}", "pad": chr(97 + i % 26) * 96}


def encode_jsonl(batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """The project's jsonl snapshot writer over a task's rows, one chunk per batch."""
    from snapshot_assets.archive.formats import get_format

    for batch in batches:
        out = io.BytesIO()
        writer = get_format("jsonl").snapshot_writer(out, ("id",))
        for row in batch.to_pylist():
            writer.write(row)
        writer.close()
        yield out.getvalue()


def _single_process_jsonl(count: int) -> bytes:
    """What one process writes for the same rows: the oracle."""
    return b"".join(encode_jsonl([pa.RecordBatch.from_pylist([_row(i) for i in range(count)])]))


def _dataset_df(spark: Any, partitions: int = 4) -> Any:
    return spark.range(0, DATASET_ROWS, 1, partitions).selectExpr(
        "id", "id + 9007199254740993 AS big", "IF(id % 7 = 0, NULL, concat('v', id)) AS text",
        "CAST(id % 3 = 0 AS BOOLEAN) AS flag")


def _expected_dataset() -> list[tuple[Any, ...]]:
    return [(i, i + 9007199254740993, None if i % 7 == 0 else f"v{i}", i % 3 == 0) for i in range(DATASET_ROWS)]


def _collected(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in df.collect())


@pytest.fixture
def s3_dest(moto_server: str, s3_bucket: str) -> S3Destination:
    return S3Destination(s3_bucket, endpoint_url=moto_server, path_style=True)


# -- on the local runtime -------------------------------------------------------------------------------


def test_a_parquet_dataset_round_trips_through_s3_one_file_per_task(spark: Any, s3_dest: S3Destination) -> None:
    uri = f"s3://{s3_dest.bucket}/t/state/"
    names = write_parquet(_dataset_df(spark), uri, s3=s3_dest.connection)
    assert names == [f"part-{i:05d}.parquet" for i in range(4)]
    assert _collected(read_parquet(spark, uri, s3=s3_dest.connection)) == _expected_dataset()
    # any reader of parquet sees the same dataset (exact 64-bit integers included)
    table = pq.read_table(f"{s3_dest.bucket}/t/state", filesystem=arrow_s3(s3_dest.connection))
    assert sorted(table.column("big").to_pylist()) == [i + 9007199254740993 for i in range(DATASET_ROWS)]


def test_a_local_path_takes_the_same_call(spark: Any, tmp_path: Path) -> None:
    uri = (tmp_path / "state").as_uri()
    write_parquet(_dataset_df(spark), uri)
    assert _collected(read_parquet(spark, uri)) == _expected_dataset()


def test_writing_again_replaces_the_dataset_and_no_rows_still_leave_a_schema(spark: Any,
                                                                            s3_dest: S3Destination) -> None:
    uri = f"s3://{s3_dest.bucket}/t/state"
    write_parquet(_dataset_df(spark, partitions=4), uri, s3=s3_dest.connection)
    assert write_parquet(_dataset_df(spark, partitions=2), uri, s3=s3_dest.connection) == [
        "part-00000.parquet", "part-00001.parquet"]
    assert [info.key for info in s3_dest.list("t/state/")] == ["t/state/part-00000.parquet",
                                                               "t/state/part-00001.parquet"]
    assert write_parquet(_dataset_df(spark).limit(0), uri, s3=s3_dest.connection) == ["part-00000.parquet"]
    empty = read_parquet(spark, uri, s3=s3_dest.connection)
    assert empty.count() == 0 and empty.columns == ["id", "big", "text", "flag"]


def test_reading_a_folder_without_parquet_files_names_it(spark: Any, s3_dest: S3Destination) -> None:
    with pytest.raises(RemoteIOError, match=f"s3://{s3_dest.bucket}/nothing/: no parquet files there"):
        read_parquet(spark, f"s3://{s3_dest.bucket}/nothing/", s3=s3_dest.connection)


def test_tasks_assemble_one_object_from_their_parts(spark: Any, s3_dest: S3Destination, tmp_path: Path) -> None:
    expected = _single_process_jsonl(PARTITIONS * ROWS_PER_PARTITION)
    for dest in (s3_dest, LocalDestination(tmp_path / "archive")):
        result = assemble_object(_rows_df(spark), dest, "t/epoch=1/snapshot.jsonl", encode_jsonl)
        got = dest.get("t/epoch=1/snapshot.jsonl")
        assert got is not None and got.data == expected and result.size == len(expected)


def _uneven_df(spark: Any, sizes: list[int]) -> Any:
    """One partition per entry of `sizes` (rows), ids contiguous in partition order."""
    frames, start = [], 0
    for size in sizes:
        frames.append(spark.range(start, start + size, 1, 1))
        start += size
    union = functools.reduce(lambda a, b: a.union(b), frames)
    return union.selectExpr("id", "concat('user-', id) AS name", "repeat(chr(97 + id % 26), 96) AS pad")


@pytest.mark.parametrize("sizes", [
    [100, 42_000, 3, 90_000, 50, 0, 30],  # tiny shares between a 6 MiB one and a 13 MiB one (head + body)
    [90_000, 10, 90_000],  # a share too small for a part between two big ones
    [5, 0, 7],  # nothing reaches 5 MiB
    [0, 0],  # no rows: an empty object
])
def test_partitions_of_any_size_assemble_and_leave_nothing_behind(spark: Any, s3_dest: S3Destination,
                                                                   sizes: list[int]) -> None:
    result = assemble_object(_uneven_df(spark, sizes), s3_dest, "t/uneven.jsonl", encode_jsonl)
    got = s3_dest.get("t/uneven.jsonl")
    assert got is not None and got.data == _single_process_jsonl(sum(sizes)) and result.size == len(got.data)
    assert [info.key for info in s3_dest.list("")] == ["t/uneven.jsonl"]  # staged pieces gone
    client = boto3.client("s3", endpoint_url=s3_dest.endpoint_url)
    assert client.list_multipart_uploads(Bucket=s3_dest.bucket).get("Uploads", []) == []


def failing_encoder(batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    yield from encode_jsonl(batches)
    raise ValueError("cannot encode this row")


def test_a_failing_task_drops_the_upload_and_its_staged_pieces(spark: Any, s3_dest: S3Destination) -> None:
    with pytest.raises(Exception, match="cannot encode this row"):
        assemble_object(_rows_df(spark, per_partition=10), s3_dest, "t/failed.jsonl", failing_encoder)
    assert list(s3_dest.list("")) == []
    client = boto3.client("s3", endpoint_url=s3_dest.endpoint_url)
    assert client.list_multipart_uploads(Bucket=s3_dest.bucket).get("Uploads", []) == []


# -- on a standalone cluster: nothing shared but S3 -------------------------------------------------------


def where_am_i(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import os

    import snapshot_assets

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"cwd": [os.getcwd()] * batch.num_rows,
                                          "code": [snapshot_assets.__file__] * batch.num_rows})


@pytest.fixture(scope="module")
def cluster_spark(spark_cluster: SparkCluster) -> Iterator[Any]:
    session = spark_cluster.session()
    yield session
    session.stop()


def test_cluster_tasks_run_on_both_workers_importing_the_shipped_code(spark_cluster: SparkCluster,
                                                                      cluster_spark: Any) -> None:
    rows = cluster_spark.range(0, 64, 1, 8).mapInArrow(where_am_i, "cwd STRING, code STRING").collect()
    used = {next(i for i, d in enumerate(spark_cluster.worker_dirs) if row["cwd"].startswith(str(d)))
            for row in rows}
    assert used == {0, 1}, spark_cluster.diagnostics()
    project = Path(__file__).resolve().parents[2]
    assert all(".zip" in row["code"] and not row["code"].startswith(str(project)) for row in rows)


def _signed(moto: Moto) -> list[tuple[str, str, str, bool]]:
    """(method, path, access key, is a copy) of every request the endpoint recorded."""
    out = []
    for line in moto.recording.read_text().splitlines():
        request = json.loads(line)
        auth = request["headers"].get("Authorization", "")
        key = auth.split("Credential=", 1)[1].split("/")[0] if "Credential=" in auth else ""
        copy = any(name.lower() == "x-amz-copy-source" for name in request["headers"])
        out.append((request["method"], str(request["url"]), key, copy))
    return out


def test_cluster_tasks_write_parts_into_s3_and_the_object_equals_the_local_runs(
        spark_cluster: SparkCluster, cluster_spark: Any, spark: Any, tmp_path: Path) -> None:
    """Each share is over 10 MiB: its task stages the first 5 MiB and sends the rest as a part itself; the
    driver only copies the staged heads inside S3. The endpoint's record says who sent what."""
    moto = start_moto(tmp_path, record=True)
    try:
        boto3.client("s3", endpoint_url=moto.url).create_bucket(Bucket="archive")
        s3_dest = S3Destination("archive", endpoint_url=moto.url, path_style=True)
        moto.recording.write_text("")
        key, rows = "t/epoch=1/snapshot-0_1.jsonl", 80_000
        remote = assemble_object(_rows_df(cluster_spark, per_partition=rows), s3_dest, key, encode_jsonl)
        record = _signed(moto)
        on_s3 = s3_dest.get(key)
    finally:
        moto.stop()
    local_dest = LocalDestination(tmp_path / "archive")
    assemble_object(_rows_df(spark, per_partition=rows), local_dest, key, encode_jsonl)
    on_disk = local_dest.get(key)
    assert on_s3 is not None and on_disk is not None
    assert on_s3.data == on_disk.data == _single_process_jsonl(PARTITIONS * rows)
    assert remote.size == len(on_s3.data) > PARTITIONS * 10 * MiB

    parts = [(key_id, copy) for method, url, key_id, copy in record if method == "PUT" and "partNumber=" in url]
    staged = [key_id for method, url, key_id, _ in record if method == "PUT" and ".parts-" in url]
    assert sorted(parts) == [(EXECUTOR_ACCESS_KEY, False)] * PARTITIONS + [("testing", True)] * PARTITIONS
    assert staged == [EXECUTOR_ACCESS_KEY] * PARTITIONS  # the heads, staged by the tasks too
    assert not [url for method, url, *_ in record if method == "GET" and ".parts-" in url and "list-type" not in url]


def test_cluster_tasks_write_and_read_a_parquet_dataset_on_s3(cluster_spark: Any, s3_dest: S3Destination) -> None:
    uri = f"s3://{s3_dest.bucket}/t/state/"
    assert len(write_parquet(_dataset_df(cluster_spark), uri, s3=s3_dest.connection)) == 4
    assert _collected(read_parquet(cluster_spark, uri, s3=s3_dest.connection)) == _expected_dataset()
