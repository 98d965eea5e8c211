"""The Spark diff equals `algebra.collapse` on the same window, byte for byte per change."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from resources.subscribers.generator import KEY_FIELDS
from snapshot_assets.archive.algebra import collapse
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.spark.bases import EmptyBase
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.effects import (
    WINDOW_CHANGES_CONF,
    WINDOW_CHANGES_PER_PARTITION,
    read_window,
    window_facts,
    window_partitions,
)
from snapshot_assets.spark.parquet_artifact import infer_row_schema, write_diff
from snapshot_assets.spark.window import net_window
from tests.spark.conftest import (
    ALL_FORMATS,
    Generated,
    change_multiset,
    frames,
    generate,
    python_bytes,
    read_parts,
    staged_bytes,
    window_changes,
)


def decode(format_id: str, data: bytes) -> list[Change]:
    return list(FORMATS[format_id].read_diff(io.BytesIO(data)))


def check_diff(spark: Any, g: Generated, from_position: str, to_position: str, staging: Path) -> bool:
    """Build the diff with Spark and compare it with collapse; returns whether it had a TRUNCATE."""
    expected = collapse(window_changes(g.reader, from_position, to_position), KEY_FIELDS)
    built = build_diff(spark, g.reader.segments(from_position, to_position), EmptyBase(from_position), to_position,
                       KEY_FIELDS, ALL_FORMATS, staging, staging / "delta")
    assert built.count == len(expected)
    truncated = bool(expected) and expected[0].action is Action.TRUNCATE
    assert built.truncated == truncated
    for fid in ALL_FORMATS:
        got = read_parts(built.formats[fid], "diff")
        # decoded as the format decodes (protobuf turns integers beyond 2^53 into strings)
        assert change_multiset(got) == change_multiset(decode(fid, python_bytes(fid, "diff", expected))), fid
        if truncated:
            assert got[0].action is Action.TRUNCATE, f"{fid}: the TRUNCATE must come first"
            assert all(c.action is not Action.TRUNCATE for c in got[1:])
        if fid != "parquet":  # (c) every line / message is the Python writer's bytes
            data = staged_bytes(built.formats[fid])
            assert sorted(frames(data, fid)) == sorted(frames(python_bytes(fid, "diff", expected), fid)), fid
            assert built.formats[fid].bytes == len(data)
    return truncated


@pytest.mark.parametrize("seed, truncate", [(1, 0.0), (2, 0.004), (3, 0.01)])
def test_diff_equals_collapse(spark: Any, tmp_path: Path, seed: int, truncate: float) -> None:
    g = generate(tmp_path / "buffer", seed, truncate=truncate, pk_change=0.1)
    b = g.boundaries
    windows = [(b[5], b[len(b) // 2]), (b[len(b) // 2], b[-1])]
    if seed == 1:
        windows.append((g.resyncs[0], b[-1]))  # the whole stream after the initial load
    truncated = [check_diff(spark, g, lo, hi, tmp_path / f"staging-{i}") for i, (lo, hi) in enumerate(windows)]
    if truncate >= 0.01:
        assert any(truncated), "the seed should exercise a TRUNCATE"


def test_single_transaction_and_hot_key_windows(spark: Any, tmp_path: Path) -> None:
    """Tiny windows (one transaction) and a stream concentrated on few keys (long key groups)."""
    g = generate(tmp_path / "buffer", 7, rows=20, changes=600, pk_change=0.2, tx_size=(3, 12))
    b = g.boundaries
    check_diff(spark, g, b[10], b[11], tmp_path / "one")
    check_diff(spark, g, b[0], b[-1], tmp_path / "all")


def test_pk_changes_collapse_across_keys(spark: Any, tmp_path: Path) -> None:
    """Every update moves its row to a new key: deletes of old keys and inserts of new ones."""
    g = generate(tmp_path / "buffer", 11, rows=30, changes=400, pk_change=1.0)
    check_diff(spark, g, g.boundaries[3], g.boundaries[-1], tmp_path / "staging")


def test_segments_older_than_the_derived_columns_give_the_same_diff(spark: Any, tmp_path: Path) -> None:
    """Segments written before ingest stored the derived key columns (the eight-column layout):
    the job derives them in a task (`effects.upgrade_legacy`) and the diff is the same."""
    g = generate(tmp_path / "buffer", 13, rows=40, changes=500, pk_change=0.2, truncate=0.004)
    for ref in g.reader.all_segments():
        table = pq.read_table(ref.path)
        old = table.select(table.schema.names[:8])
        pq.write_table(old.replace_schema_metadata(table.schema.metadata), ref.path)
    assert pq.read_schema(g.reader.all_segments()[-1].path).names[-1] == "unchanged"
    check_diff(spark, g, g.boundaries[2], g.boundaries[-1], tmp_path / "staging")


def test_an_insert_only_window_types_no_before_images_and_writes_the_same_parquet(spark: Any, tmp_path: Path) -> None:
    """An append-only table's window (INSERTs only): its facts say no net change has a before-image,
    so the parquet diff leaves out the typing of `old` (half its plan), and its bytes are those of
    the diff typed in full. A window with an UPDATE, or an INSERT carrying an old image, says it may."""
    g = generate(tmp_path / "buffer", 17, rows=40, changes=300, pk_change=0.0,
                 mix={"insert": 1.0, "update": 0.0, "delete": 0.0, "truncate": 0.0})
    lo, hi = g.resyncs[0], g.boundaries[-1]
    check_diff(spark, g, lo, hi, tmp_path / "staging")
    segments = g.reader.segments(lo, hi)
    rows = read_window(spark, segments)
    assert not window_facts(rows).befores
    first = rows.agg(F.min("seq")).first()[0]
    with_old = rows.withColumn("old", F.when(F.col("seq") == first, F.col("new")).otherwise(F.col("old")))
    assert window_facts(with_old).befores
    mixed = generate(tmp_path / "mixed", 17, rows=40, changes=300)
    assert window_facts(read_window(spark, mixed.reader.segments(mixed.resyncs[0], mixed.boundaries[-1]))).befores

    window = net_window(spark, segments, EmptyBase(lo), KEY_FIELDS, partitions=3, scratch=tmp_path / "scratch")
    assert not window.befores
    net = window.net.cache()
    schema = infer_row_schema(net, texts=("old", "new"))
    written = [write_diff(net, schema, tmp_path / f"{befores}.parquet", KEY_FIELDS, truncated=False, befores=befores)
               for befores in (True, False)]
    assert written[0].rows == written[1].rows == net.count() > 0
    assert Path(str(written[0].path)).read_bytes() == Path(str(written[1].path)).read_bytes()


def test_empty_window_stages_nothing(spark: Any, tmp_path: Path) -> None:
    built = build_diff(spark, [], EmptyBase("0/10"), "0/20", KEY_FIELDS, ALL_FORMATS, tmp_path / "staging",
                       tmp_path / "delta")
    assert built.count == 0 and not built.truncated
    assert all(not s.parts and s.bytes == 0 for f, s in built.formats.items() if f != "parquet")
    assert read_parts(built.formats["parquet"], "diff") == []  # one valid parquet file without changes


def test_diff_rejects_a_degenerate_window(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="two different"):
        build_diff(spark, [], EmptyBase("0/10"), "0/10", KEY_FIELDS, ALL_FORMATS, tmp_path, tmp_path / "delta")


def test_a_small_window_runs_one_partition_wide_and_gives_the_same_bytes(spark: Any, tmp_path: Path) -> None:
    """With Spark's default shuffle width (200, what a cluster has unless told), a window of a few
    hundred changes is folded in one partition, not 200 (each a scratch file on a cluster), and the
    diff's bytes are those of a build three partitions wide."""
    g = generate(tmp_path / "buffer", 13, rows=60, changes=500)
    b = g.boundaries
    segments = g.reader.segments(b[2], b[-1])
    assert sum(s.changes for s in segments) < WINDOW_CHANGES_PER_PARTITION
    built = {}
    previous = {k: spark.conf.get(k, None) for k in ("spark.sql.shuffle.partitions", WINDOW_CHANGES_CONF)}
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "200")
        spark.conf.unset(WINDOW_CHANGES_CONF)
        assert window_partitions(spark, segments) == 1 and window_partitions(spark, []) == 1
        for name, width in (("default", None), ("three", 3)):
            built[name] = build_diff(spark, segments, EmptyBase(b[2]), b[-1], KEY_FIELDS, ALL_FORMATS,
                                     tmp_path / name, tmp_path / name / "delta", partitions=width)
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value) if value is not None else spark.conf.unset(key)
    delta_files = list((tmp_path / "default" / "delta").rglob("*.parquet"))
    assert len(delta_files) == 1, delta_files
    assert len(list((tmp_path / "three" / "delta").rglob("*.parquet"))) > 1
    for fid in ("jsonl", "protobuf"):
        assert staged_bytes(built["default"].formats[fid]) == staged_bytes(built["three"].formats[fid]), fid
    assert change_multiset(read_parts(built["default"].formats["parquet"], "diff")) == \
        change_multiset(read_parts(built["three"].formats["parquet"], "diff"))


def test_the_window_width_follows_the_windows_changes_up_to_the_shuffle_setting(spark: Any, tmp_path: Path) -> None:
    g = generate(tmp_path / "buffer", 17, rows=40, changes=900, seal_changes=100)
    segments = g.reader.segments(g.resyncs[0], g.boundaries[-1])
    changes = sum(s.changes for s in segments)
    assert spark.conf.get(WINDOW_CHANGES_CONF) == "100"  # the suite's setting (conftest.py)
    assert window_partitions(spark, segments) == min(3, -(-changes // 100)) == 3
    assert window_partitions(spark, segments[:1]) == -(-segments[0].changes // 100)
    spark.conf.set(WINDOW_CHANGES_CONF, "0")
    try:
        with pytest.raises(ValueError, match="positive number of changes"):
            window_partitions(spark, segments)
    finally:
        spark.conf.set(WINDOW_CHANGES_CONF, "100")
