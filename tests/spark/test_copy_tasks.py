"""A copy read by the build's own tasks (copy_tasks.py) is the segment Spark's reader reads: the same
rows, versions and records, whatever the tasks' slices, and a census that does not depend on them."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from resources.destinations.local import LocalDestination
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.row_schema import ColumnType, RowSchema
from snapshot_assets.archive.sortkey import sort_key
from snapshot_assets.spark.assemble import assemble
from snapshot_assets.spark.bases import BufferSnapshotBase
from snapshot_assets.spark.copy_tasks import CopyFile, census, encode_copy, sorted_runs
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.snapshot import build_snapshot
from snapshot_assets.spark.state import bounds_of, bucket_count, bucket_of, bucket_writer, encode_rows, in_bucket
from tests.spark.conftest import python_bytes
from tests.spark.test_buckets import BIG, BYTE_FORMATS, KEYS, buffer_with, row

INITIAL = 1_000


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> BufferSnapshotBase:
    """A copy of INITIAL rows kept as column text in row groups of 64 rows, then two changes (in
    the next segment: they are not the copy's)."""
    root: Path = tmp_path_factory.mktemp("copy") / "buffer"
    reader, _ = buffer_with(root, INITIAL, [[(Action.UPDATE, 3), (Action.INSERT, INITIAL)]], text=True,
                            row_group_rows=64)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    return BufferSnapshotBase(reader.segment_ref(resync.segment))


def test_slices_cover_the_row_groups_in_order(copy: BufferSnapshotBase) -> None:
    groups = pq.ParquetFile(copy.segment.path).metadata.num_row_groups
    assert groups > 10
    for task_rows in (1, 200, 10**9):
        file = CopyFile.open(copy.segment, None, task_rows)
        assert file.slices[0].first == 0 and file.slices[-1].stop == groups
        assert all(a.stop == b.first and b.offset > a.offset for a, b in itertools.pairwise(file.slices))
    assert len(CopyFile.open(copy.segment, None, 1).slices) == groups
    assert len(CopyFile.open(copy.segment, None, 10**9).slices) == 1
    assert len(CopyFile.open(copy.segment, None, 10**9, task_bytes=1).slices) == groups  # wide rows: cut by bytes


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted((r["key"], bytes(r["sk"]), r["row"], bytes(r["pb"]), r["ver"]) for r in frame.collect())


def test_the_tasks_encode_the_rows_spark_reads_with_their_versions(spark: Any, copy: BufferSnapshotBase) -> None:
    """Against the segment as Spark's reader gives it (its seq filter, VERSION_SQL, the records
    `read_window` encodes beside the JSON), encoded by `encode_rows`: the same rows, one task or many."""
    expected = _rows(encode_rows(copy.frame(spark, KEYS), KEYS, BYTE_FORMATS))
    assert len(expected) == INITIAL and all(ver.endswith("\tcopy") for *_, ver in expected)
    for task_rows in (100, 10**9):
        file = CopyFile.open(copy.segment, None, task_rows)
        frame = encode_copy(spark, file, KEYS, BYTE_FORMATS, None)
        assert frame.rdd.getNumPartitions() == len(file.slices)
        assert _rows(frame) == expected


def test_the_census_counts_and_samples_the_same_rows_however_the_tasks_split_them(spark: Any,
                                                                                 copy: BufferSnapshotBase) -> None:
    found = [census(spark, CopyFile.open(copy.segment, None, task_rows)) for task_rows in (1, 300, 10**9)]
    assert found[0] == found[1] == found[2]
    (codec, (rows, size)), = found[0].groups.items()
    assert codec is not None and rows == INITIAL and size > 0
    # a small copy is sampled whole
    assert found[0].samples == sorted(sort_key([BIG + i]) for i in range(INITIAL))


SCHEMA = RowSchema.of([("id", ColumnType.INT64), ("name", ColumnType.STRING), ("note", ColumnType.STRING),
                       ("version", ColumnType.INT32)])


def _quoted_name(i: int) -> dict[str, Any]:
    return {**row(i), "name": f'user "{i}"' if i == 77 else f"user {i}"}


@pytest.mark.parametrize(("make", "shuffle"), [(row, "runs"), (_quoted_name, "spark")], ids=["typed-here", "jvm-typed"])
def test_a_copy_is_bucketed_through_runs_unless_a_row_needs_the_jvms_typing(spark: Any, tmp_path: Path, make: Any,
                                                                            shuffle: str) -> None:
    """Every copied row typed by the task's kernels: the rows reach their buckets through the runs in
    scratch (no Spark shuffle), and the scratch folder is gone after. A row with a quoted string is
    typed by the JVM: the build goes through Spark's shuffle. Both archives hold the table."""
    reader, positions = buffer_with(tmp_path / "buffer", INITIAL, [], text=True, make=make)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    formats = (*BYTE_FORMATS, "parquet")
    built = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], KEYS,
                           formats, tmp_path / "staging", tmp_path / "state" / "epoch=1", bucket_bytes=16 * 1024,
                           schema=SCHEMA)
    assert built.details["shuffle"] == shuffle and built.details["buckets"] > 3
    assert not any((tmp_path / "staging" / "_work").glob("copy-*"))
    refs = assemble(built, [LocalDestination(tmp_path / "archive")], "t", 1)
    table = sorted((make(i) for i in range(INITIAL)), key=lambda r: sort_key([r["id"]]))
    for fid in BYTE_FORMATS:
        assert (tmp_path / "archive" / refs[fid].uri.split("/archive/", 1)[1]).read_bytes() == \
            python_bytes(fid, "snapshot", table)
    parquet = pq.read_table(tmp_path / "archive" / refs["parquet"].uri.split("/archive/", 1)[1])
    assert parquet.select(["id", "name", "note", "version"]).to_pylist() == table


@pytest.mark.parametrize("heap", ["key order", "shuffled"])
def test_sorted_runs_are_the_census_and_each_bucket_gets_exactly_its_key_range(spark: Any, tmp_path: Path,
                                                                               heap: str) -> None:
    """Two runs of 1,500 rows in record batches of at most 1,024 (the smallest), merged into ~40
    buckets: the runs' reports count the rows and their exact jsonl bytes, sample every key of a
    small copy, and each bucket's rows file holds exactly the keys in [its bound, the next), sorted.
    A copy in key order is written as it came; a shuffled one is sorted by each run's task."""
    rows = 3_000
    order = list(range(rows))
    if heap == "shuffled":
        random.Random(7).shuffle(order)
    reader, _ = buffer_with(tmp_path / "buffer", rows, [], text=True, row_group_rows=250, copy_order=order)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    file = CopyFile.open(reader.segment_ref(resync.segment), None, task_rows=1_500)
    assert len(file.slices) == 2
    table = sorted((row(i) for i in range(rows)), key=lambda r: sort_key([r["id"]]))
    keys = [sort_key([r["id"]]) for r in table]
    with sorted_runs(spark, file, KEYS, BYTE_FORMATS, None, Location.of(tmp_path / "scratch"), 8 << 10) as runs:
        assert runs is not None
        assert runs.rows == rows and runs.jsonl_bytes == len(python_bytes("jsonl", "snapshot", table))
        assert runs.samples == keys  # under SAMPLE_ROWS rows: every key
        assert len(runs.batches) >= 4 and all(b.first <= b.last for b in runs.batches)
        for before, after in itertools.pairwise(runs.batches):  # each run's batches in sk order
            assert before.uri != after.uri or before.last < after.first
        bounds = bounds_of(runs.samples, bucket_count(runs.rows, runs.jsonl_bytes, 8 << 10))
        assert len(bounds) > 30
        write = bucket_writer(tmp_path / "pool", tmp_path / "staging", BYTE_FORMATS, None, 4096)
        reports = runs.write(spark, bounds, write)
    assert not any((tmp_path / "scratch").glob("copy-*"))
    lowers, uppers = [b"", *bounds], [*bounds, None]
    held: list[bytes] = []
    for r in {int(r["bucket"]): r for r in reports}.values():
        bucket = int(r["bucket"])
        sks = [bytes(sk) for sk in pq.read_table(r["path"], columns=["sk"]).column("sk").to_pylist()]
        assert sks == sorted(sks) and len(sks) == int(r["rows"])
        assert all(lowers[bucket] <= sk and (uppers[bucket] is None or sk < uppers[bucket]) for sk in sks)
        held.extend(sks)
    assert sorted(held) == keys


@given(st.lists(st.binary(max_size=4), max_size=40), st.lists(st.binary(max_size=4), max_size=6))
def test_bucket_membership_in_arrow_is_the_rule_in_python(sks: list[bytes], bounds: list[bytes]) -> None:
    """`in_bucket` (a merge task's filter) and `bucket_of` (the driver's) put every key in the same bucket."""
    ordered = sorted(set(bounds))
    array = pa.array(sks, pa.binary())
    for bucket in range(len(ordered) + 1):
        assert in_bucket(array, ordered, bucket).to_pylist() == [bucket_of(ordered, sk) == bucket for sk in sks]
