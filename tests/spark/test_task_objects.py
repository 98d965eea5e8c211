"""task_objects: one object per target assembled from every Spark task's share (S3 on moto_server, local disk).

The oracle is the single-process writer over the same rows. On the standalone cluster
(tests/spark/cluster.py: processes that share nothing but the S3 endpoint) the object the workers'
tasks send must equal, byte for byte, what the local runtime produces, and the endpoint's record
of who signed what shows that the executors sent the bytes and the driver only copied inside S3.
"""

from __future__ import annotations

import functools
import io
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from pyspark import cloudpickle

from resources.destinations.local import LocalDestination
from resources.destinations.s3 import MiB, S3Destination
from snapshot_assets.spark.task_objects import assemble_object, assemble_objects
from tests.aws.conftest import Moto, start_moto
from tests.spark.cluster import EXECUTOR_ACCESS_KEY, SparkCluster

# The tasks run this module's encoders; executors import only the shipped project, so ship these by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.s3, pytest.mark.slow]  # Spark jobs: seconds each, the cluster tens
ROWS_PER_PARTITION = 42_000  # ~6 MiB of jsonl per partition
PARTITIONS = 3


def _rows_df(spark: Any, partitions: int = PARTITIONS, per_partition: int = ROWS_PER_PARTITION) -> Any:
    """Rows in id order, partition p holding the p-th contiguous id range."""
    return spark.range(0, partitions * per_partition, 1, partitions).selectExpr(
        "id", "concat('user-', id) AS name", "repeat(chr(97 + id % 26), 96) AS pad")


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"user-{i}", "pad": chr(97 + i % 26) * 96}


def encode_jsonl(batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    """The project's jsonl snapshot writer over a task's rows, one chunk per batch."""
    for _, chunk in encode_formats(batches, ("jsonl",)):
        yield chunk


def encode_formats(batches: Iterable[pa.RecordBatch], formats: tuple[str, ...] = ("jsonl", "protobuf"),
                   ) -> Iterator[tuple[str, bytes]]:
    """Each batch's rows through the project's snapshot writer of every format, once per row."""
    from snapshot_assets.archive.formats import get_format

    for batch in batches:
        rows = batch.to_pylist()
        for format_id in formats:
            out = io.BytesIO()
            writer = get_format(format_id).snapshot_writer(out, ("id",))
            for row in rows:
                writer.write(row)
            writer.close()
            yield format_id, out.getvalue()


def _single_process(count: int, format_id: str = "jsonl") -> bytes:
    """What one process writes for the same rows: the oracle."""
    batch = pa.RecordBatch.from_pylist([_row(i) for i in range(count)])
    return b"".join(chunk for _, chunk in encode_formats([batch], (format_id,)))


@pytest.fixture
def s3_dest(moto_server: str, s3_bucket: str) -> S3Destination:
    return S3Destination(s3_bucket, endpoint_url=moto_server, path_style=True)


def _uploads_left(dest: S3Destination) -> list[Any]:
    client = boto3.client("s3", endpoint_url=dest.endpoint_url)
    return list(client.list_multipart_uploads(Bucket=dest.bucket).get("Uploads", []))


def test_tasks_assemble_one_object_from_their_parts(spark: Any, s3_dest: S3Destination, tmp_path: Path) -> None:
    expected = _single_process(PARTITIONS * ROWS_PER_PARTITION)
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
    assert got is not None and got.data == _single_process(sum(sizes)) and result.size == len(got.data)
    assert [info.key for info in s3_dest.list("")] == ["t/uneven.jsonl"]  # staged pieces gone
    assert _uploads_left(s3_dest) == []


def failing_encoder(batches: Iterable[pa.RecordBatch]) -> Iterator[bytes]:
    yield from encode_jsonl(batches)
    raise ValueError("cannot encode this row")


def test_a_failing_task_drops_the_upload_and_its_staged_pieces(spark: Any, s3_dest: S3Destination) -> None:
    with pytest.raises(Exception, match="cannot encode this row"):
        assemble_object(_rows_df(spark, per_partition=10), s3_dest, "t/failed.jsonl", failing_encoder)
    assert list(s3_dest.list("")) == []
    assert _uploads_left(s3_dest) == []


def test_every_output_goes_to_every_target_from_one_pass(spark: Any, s3_dest: S3Destination, tmp_path: Path) -> None:
    local = LocalDestination(tmp_path / "archive")
    targets = [("jsonl", s3_dest, "t/s.jsonl"), ("jsonl", local, "t/s.jsonl"), ("protobuf", s3_dest, "t/s.pb")]
    results = assemble_objects(_uneven_df(spark, [40_000, 7, 20_000]), targets, encode_formats)
    rows = 60_007
    assert [(r.uri, r.size) for r in results] == [
        (s3_dest.uri("t/s.jsonl"), len(_single_process(rows))), (local.uri("t/s.jsonl"), len(_single_process(rows))),
        (s3_dest.uri("t/s.pb"), len(_single_process(rows, "protobuf")))]
    for _, dest, key in targets:
        got = dest.get(key)
        assert got is not None and got.data == _single_process(rows, "protobuf" if key.endswith(".pb") else "jsonl")


def test_an_output_the_targets_do_not_name_is_refused(spark: Any, s3_dest: S3Destination) -> None:
    with pytest.raises(Exception, match=r"the encoder produced output 'protobuf'; the targets name \['jsonl'\]"):
        assemble_objects(_rows_df(spark, per_partition=5), [("jsonl", s3_dest, "t/x.jsonl")], encode_formats)
    assert list(s3_dest.list("")) == [] and _uploads_left(s3_dest) == []


# -- on a standalone cluster: nothing shared but S3 -------------------------------------------------------


def _signed(moto: Moto) -> list[tuple[str, str, str, bool]]:
    """(method, path, access key, is a copy) of every request the endpoint recorded."""
    out = []
    for request in moto.requests():  # a stream of documents: two can meet on one line (tests/aws/conftest.py)
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
    assert on_s3.data == on_disk.data == _single_process(PARTITIONS * rows)
    assert remote.size == len(on_s3.data) > PARTITIONS * 10 * MiB

    parts = [(key_id, copy) for method, url, key_id, copy in record if method == "PUT" and "partNumber=" in url]
    staged = [key_id for method, url, key_id, _ in record if method == "PUT" and ".parts-" in url]
    assert sorted(parts) == [(EXECUTOR_ACCESS_KEY, False)] * PARTITIONS + [("testing", True)] * PARTITIONS
    assert staged == [EXECUTOR_ACCESS_KEY] * PARTITIONS  # the heads, staged by the tasks too
    assert not [url for method, url, *_ in record if method == "GET" and ".parts-" in url and "list-type" not in url]
