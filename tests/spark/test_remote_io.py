"""remote_io: parquet datasets on S3 (moto_server) written and read by Spark tasks.

The local tests run on the suite's classic local[2] session; the cluster tests on a standalone
cluster (tests/spark/cluster.py) whose processes share no disk with the driver or each other, only
the S3 endpoint: its tasks run on both workers with the code the session shipped, and the datasets
they write read back whole.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import cloudpickle

from resources.destinations.s3 import S3Destination
from snapshot_assets.spark.remote_io import (
    RemoteIOError,
    arrow_s3,
    read_parquet,
    write_parquet,
)
from tests.spark.cluster import SparkCluster

# The tasks run this module's functions; executors import only the shipped project, so ship these by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.s3, pytest.mark.slow]  # Spark jobs: seconds each, the cluster tens
DATASET_ROWS = 20_000


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


# -- on a standalone cluster: nothing shared but S3 -------------------------------------------------------


def where_am_i(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import os

    import snapshot_assets

    for batch in batches:
        yield pa.RecordBatch.from_pydict({"cwd": [os.getcwd()] * batch.num_rows,
                                          "code": [snapshot_assets.__file__] * batch.num_rows})


def test_cluster_tasks_run_on_both_workers_importing_the_shipped_code(spark_cluster: SparkCluster,
                                                                      cluster_spark: Any) -> None:
    rows = cluster_spark.range(0, 64, 1, 8).mapInArrow(where_am_i, "cwd STRING, code STRING").collect()
    used = {next(i for i, d in enumerate(spark_cluster.worker_dirs) if row["cwd"].startswith(str(d)))
            for row in rows}
    assert used == {0, 1}, spark_cluster.diagnostics()
    project = Path(__file__).resolve().parents[2]
    assert all(".zip" in row["code"] and not row["code"].startswith(str(project)) for row in rows)


def test_cluster_tasks_write_and_read_a_parquet_dataset_on_s3(cluster_spark: Any, s3_dest: S3Destination) -> None:
    uri = f"s3://{s3_dest.bucket}/t/state/"
    assert len(write_parquet(_dataset_df(cluster_spark), uri, s3=s3_dest.connection)) == 4
    assert _collected(read_parquet(cluster_spark, uri, s3=s3_dest.connection)) == _expected_dataset()
