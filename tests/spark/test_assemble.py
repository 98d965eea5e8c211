"""Assembling staged parts into the archive's objects (no Spark needed: parts are plain files)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from resources.destinations.local import LocalDestination
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.manifest import DIFF, SNAPSHOT, Artifact
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.spark.assemble import ChainedReader, assemble, sizes
from snapshot_assets.spark.parts import BuiltArtifact, PartSink, StagedFormat, StagingNotShared, collect_parts
from tests.spark.conftest import python_bytes

ROWS = [{"id": i, "v": f"row {i}", "big": 2**60 + i} for i in range(10)]


def stage(tmp: Path, kind: str, groups: Sequence[Sequence[Any]], formats: tuple[str, ...]) -> BuiltArtifact:
    """Parts written the way tasks write them (one PartSink per group; empty groups write none)."""
    reports: list[dict[str, Any]] = []
    for index, items in enumerate(groups):
        sink = PartSink(tmp, formats, index, kind, ("id",))  # type: ignore[arg-type]
        for item in items:
            sink.write(item)
        reports.extend(dict(zip(("format", "part", "path", "bytes", "count"), r, strict=True)) for r in sink.close())
    staged, count = collect_parts(reports, formats)
    return BuiltArtifact(kind, None if kind == "snapshot" else "0/1", "0/2", count, staged)  # type: ignore[arg-type]


def test_chained_reader_streams_parts_in_order(tmp_path: Path) -> None:
    paths = []
    for i, data in enumerate([b"abc", b"", b"defg", b"h"]):
        paths.append(tmp_path / f"p{i}")
        paths[-1].write_bytes(data)
    with io.BufferedReader(ChainedReader(paths), buffer_size=2) as stream:
        assert stream.read() == b"abcdefgh"


def test_single_objects_and_parquet_folders_on_every_destination(tmp_path: Path) -> None:
    formats = ("jsonl", "protobuf", "parquet")
    built = stage(tmp_path / "staging", "snapshot", [ROWS[:4], [], ROWS[4:]], formats)
    assert built.count == len(ROWS) and len(built.formats["parquet"].parts) == 2
    dests = [LocalDestination(tmp_path / "a"), LocalDestination(tmp_path / "b")]
    refs = assemble(built, dests, "t/", 1)
    for fid in ("jsonl", "protobuf"):  # parts concatenate to exactly what one writer produces
        assert sizes(refs)[fid] == len(python_bytes(fid, "snapshot", ROWS))
        for dest in dests:
            got = dest.get(f"t/epoch=1/snapshot-0_2{'.jsonl' if fid == 'jsonl' else '.pb'}")
            assert got is not None and got.data == python_bytes(fid, "snapshot", ROWS)
    for dest in dests:
        keys = [o.key for o in dest.list("t/epoch=1/snapshot-0_2.parquet/")]
        assert keys == ["t/epoch=1/snapshot-0_2.parquet/part-00000.parquet",
                        "t/epoch=1/snapshot-0_2.parquet/part-00001.parquet"]
        art = Artifact(SNAPSHOT, 1, None, "0/2", "2026-01-01T00:00:00Z", refs, row_count=built.count)
        reader = ArchiveReader(dest, "t/", formats=["parquet"])
        assert list(reader.iter_snapshot(art)) == ROWS


def test_rerun_with_fewer_parts_removes_stale_ones_and_empty_artifacts_stay_readable(tmp_path: Path) -> None:
    dest = LocalDestination(tmp_path / "dest")
    many = stage(tmp_path / "s1", "diff", [[Change(Action.TRUNCATE)], [], [Change(Action.INSERT, "1", None, ROWS[1])]],
                 ("parquet", "jsonl"))
    assemble(many, [dest], "t/", 3)
    assert len(list(dest.list("t/epoch=3/diff-0_1-0_2.parquet/"))) == 2
    empty = stage(tmp_path / "s2", "diff", [[]], ("parquet", "jsonl"))
    refs = assemble(empty, [dest], "t/", 3)
    folder = "t/epoch=3/diff-0_1-0_2.parquet/"
    assert [o.key for o in dest.list(folder)] == [folder + "part-00000.parquet"]
    art = Artifact(DIFF, 3, "0/1", "0/2", "2026-01-01T00:00:00Z", refs)
    for fid in ("parquet", "jsonl"):
        assert list(ArchiveReader(dest, "t/", formats=[fid]).iter_diff(art)) == []
    assert refs["jsonl"].size_bytes == 0


def test_parts_the_driver_cannot_see_mean_staging_is_not_shared(tmp_path: Path) -> None:
    report = {"format": "jsonl", "part": 1, "path": str(tmp_path / "elsewhere" / "part-00001.jsonl"),
              "bytes": 10, "count": 1}
    with pytest.raises(StagingNotShared, match="shared"):
        collect_parts([report], ["jsonl"])
    assert StagedFormat("jsonl", (), 0).bytes == 0
