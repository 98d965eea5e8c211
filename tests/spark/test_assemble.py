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


def test_single_objects_on_every_destination(tmp_path: Path) -> None:
    """Record formats concatenate their parts; parquet is staged as one file and uploaded as one object."""
    built = stage(tmp_path / "staging", "snapshot", [ROWS[:4], [], ROWS[4:]], ("jsonl", "protobuf"))
    single = stage(tmp_path / "staging-parquet", "snapshot", [ROWS], ("parquet",))
    formats = {**built.formats, **single.formats}
    built = BuiltArtifact("snapshot", None, "0/2", built.count, formats)
    assert built.count == len(ROWS)
    dests = [LocalDestination(tmp_path / "a"), LocalDestination(tmp_path / "b")]
    refs = assemble(built, dests, "t/", 1)
    for fid in ("jsonl", "protobuf"):  # parts concatenate to exactly what one writer produces
        assert sizes(refs)[fid] == len(python_bytes(fid, "snapshot", ROWS))
        for dest in dests:
            got = dest.get(f"t/epoch=1/snapshot-0_2{'.jsonl' if fid == 'jsonl' else '.pb'}")
            assert got is not None and got.data == python_bytes(fid, "snapshot", ROWS)
    for dest in dests:
        assert [o.key for o in dest.list("t/epoch=1/snapshot-0_2.parquet")] == ["t/epoch=1/snapshot-0_2.parquet"]
        art = Artifact(SNAPSHOT, 1, None, "0/2", "2026-01-01T00:00:00Z", refs, row_count=built.count)
        for fid in ("parquet", "jsonl"):  # (protobuf gives ints beyond 2^53 back as strings, its mapping)
            assert list(ArchiveReader(dest, "t/", formats=[fid]).iter_snapshot(art)) == ROWS


def test_a_rerun_replaces_the_objects_and_empty_artifacts_stay_readable(tmp_path: Path) -> None:
    dest = LocalDestination(tmp_path / "dest")
    many = stage(tmp_path / "s1", "diff", [[Change(Action.TRUNCATE)], [], [Change(Action.INSERT, "1", None, ROWS[1])]],
                 ("jsonl",))
    assemble(many, [dest], "t/", 3)
    empty = stage(tmp_path / "s2", "diff", [[]], ("jsonl",))
    refs = assemble(empty, [dest], "t/", 3)
    art = Artifact(DIFF, 3, "0/1", "0/2", "2026-01-01T00:00:00Z", refs)
    assert list(ArchiveReader(dest, "t/", formats=["jsonl"]).iter_diff(art)) == []
    assert refs["jsonl"].size_bytes == 0


def test_parts_the_driver_cannot_see_mean_staging_is_not_shared(tmp_path: Path) -> None:
    report = {"format": "jsonl", "part": 1, "path": str(tmp_path / "elsewhere" / "part-00001.jsonl"),
              "bytes": 10, "count": 1}
    with pytest.raises(StagingNotShared, match="shared"):
        collect_parts([report], ["jsonl"])
    assert StagedFormat("jsonl", (), 0).bytes == 0
