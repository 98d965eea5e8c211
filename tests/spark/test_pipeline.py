"""End to end on Spark: snapshot + diffs built from a generated buffer, assembled onto a local
destination, committed; the archive then reconstructs (Python reader and Spark) to the source table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resources.destinations.local import LocalDestination
from resources.subscribers.generator import KEY_FIELDS
from snapshot_assets.archive.manifest import DIFF, SNAPSHOT, Artifact, Manifest, utc_now
from snapshot_assets.archive.positions import comparator, format_lsn, parse_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.pipeline.commit import commit_artifact
from snapshot_assets.spark.assemble import assemble
from snapshot_assets.spark.bases import EmptyBase, StateBase, choose_base
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.parts import BuiltArtifact, StagedFormat
from snapshot_assets.spark.reconstruct import reconstruct_to_path
from snapshot_assets.spark.snapshot import build_snapshot
from tests.formats import laredo_go
from tests.spark.conftest import ALL_FORMATS, TABLE, Generated, by_key, generate, read_parts

PREFIX = "users/"


def commit(m: Manifest, built: BuiltArtifact, dest: LocalDestination, epoch: int) -> Manifest:
    refs = assemble(built, [dest], PREFIX, epoch)
    kind = SNAPSHOT if built.kind == "snapshot" else DIFF
    art = Artifact(kind=kind, epoch=epoch, from_position=built.from_position, to_position=built.to_position,
                   created_at=utc_now(), formats=refs, row_count=built.count if kind == SNAPSHOT else 0,
                   change_count=built.count if kind == DIFF else 0)
    return commit_artifact([dest], PREFIX, TABLE, art, cmp=comparator("lsn")).manifest


@pytest.fixture(scope="module")
def archive(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Generated, LocalDestination, list[str]]:
    """Epoch 1: snapshot from the initial load + 2 diffs; epoch 2: snapshot from the state + 1 diff."""
    work = tmp_path_factory.mktemp("pipeline")
    g = generate(work / "buffer", 61, truncate=0.004, pk_change=0.1, changes=1200)
    dest = LocalDestination(work / "archive")
    m = Manifest(table=TABLE)
    b = g.boundaries
    cuts = [b[len(b) // 5], b[2 * len(b) // 5], b[3 * len(b) // 5], b[4 * len(b) // 5], b[-1]]
    base, segments = choose_base(g.reader, cuts[0])
    m = commit(m, build_snapshot(spark, base, segments, cuts[0], KEY_FIELDS, ALL_FORMATS, work / "st0",
                                        work / "state" / "epoch=1"), dest, 1)
    truncated = []
    for i, (lo, hi) in enumerate([(cuts[0], cuts[1]), (cuts[1], cuts[2])]):
        diff = build_diff(spark, g.reader.segments(lo, hi), EmptyBase(lo), hi, KEY_FIELDS, ALL_FORMATS, work / f"d{i}",
                          work / f"delta{i}")
        truncated.append(diff.truncated)
        m = commit(m, diff, dest, 1)
    assert any(truncated), "the seed should put a TRUNCATE into an epoch-1 diff"
    state = StateBase.load(work / "state" / "epoch=1")
    assert state is not None
    base, segments = choose_base(g.reader, cuts[3], state=state)
    assert base == state
    m = commit(m, build_snapshot(spark, base, segments, cuts[3], KEY_FIELDS, ALL_FORMATS, work / "st1",
                                        work / "state" / "epoch=2"), dest, 2)
    m = commit(m, build_diff(spark, g.reader.segments(cuts[3], cuts[4]), EmptyBase(cuts[3]), cuts[4],
                                    KEY_FIELDS, ALL_FORMATS, work / "d2", work / "delta2"), dest, 2)
    assert m.head_position == cuts[4] and not m.problems()
    return g, dest, cuts


def test_python_reader_rebuilds_the_source_at_every_boundary(
        archive: tuple[Generated, LocalDestination, list[str]]) -> None:
    g, dest, cuts = archive
    for fid in ("jsonl", "parquet"):
        reader = ArchiveReader(dest, PREFIX, formats=[fid], key_fields=KEY_FIELDS)
        for cut in cuts:
            rec = reader.reconstruct_as_of(cut)
            assert rec is not None and rec.position == cut
            assert by_key(rec.rows) == g.gen.table_at(cut), (fid, cut)


def test_laredo_reader_rebuilds_the_source_from_every_format(
        archive: tuple[Generated, LocalDestination, list[str]]) -> None:
    """laredo's own reader (an independent model of its Go decoding and RowKey) folds the Spark-built
    diffs onto the Spark-built snapshots in every format: ids beyond 2^53, key changes, a TRUNCATE."""
    g, dest, cuts = archive
    assert any(i > 2**53 for cut in cuts for (i,) in g.gen.table_at(cut))
    for fid in ALL_FORMATS:
        for cut in cuts:
            got = laredo_go.reconstruct(dest.root, PREFIX, fid, KEY_FIELDS, at=cut)
            assert got == laredo_go.expected_table(fid, list(g.gen.table_at(cut).values()), KEY_FIELDS), (fid, cut)


def read_parts_of(parts: tuple[Path, ...], format_id: str) -> list[Any]:
    """The rows of a reconstruction's part files, each a whole file of the format."""
    return [row for part in parts for row in read_parts(StagedFormat(format_id, (part,), 0), "snapshot")]


def between(a: str, b: str) -> str:
    """A position strictly between two boundaries (no artifact ends there)."""
    lo, hi = parse_lsn(a), parse_lsn(b)
    assert lo is not None and hi is not None and hi - lo > 1
    return format_lsn(lo + 1)


def test_spark_reconstruct_equals_the_reader(spark: Any, tmp_path: Path,
                                             archive: tuple[Generated, LocalDestination, list[str]]) -> None:
    g, dest, cuts = archive
    cases = [("jsonl", "parquet", cuts[0]), ("parquet", "jsonl", between(cuts[1], cuts[2])),
             ("protobuf", "parquet", cuts[2]), ("jsonl", "jsonl", cuts[4]), ("parquet", "parquet", None)]
    for i, (stored, out_fmt, position) in enumerate(cases):
        reader = ArchiveReader(dest, PREFIX, formats=[stored], key_fields=KEY_FIELDS)
        expected = reader.reconstruct_as_of(position)
        assert expected is not None
        got = reconstruct_to_path(spark, reader, position, tmp_path / f"out{i}", out_fmt)
        assert got is not None and got.position == expected.position and got.rows == len(expected.rows)
        assert all(p.parent == tmp_path / f"out{i}" for p in got.parts)
        staged = read_parts_of(got.parts, out_fmt)
        assert by_key(staged) == by_key(expected.rows), (stored, out_fmt, position)
    before = ArchiveReader(dest, PREFIX, key_fields=KEY_FIELDS)
    assert reconstruct_to_path(spark, before, g.resyncs[0], tmp_path / "none") is None  # before the 1st snapshot


