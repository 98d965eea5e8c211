"""Spark reconstruct-as-of against the Python reader on laredo-shaped archives: diff lines in any
order (a TRUNCATE last in its file still applies first), several changes per key in one diff,
primary-key changes, keys beyond 2^53, epochs, and positions between boundaries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.destinations.s3 import S3Destination
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import laredo_row_key
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.pipeline.commit import commit_artifact
from snapshot_assets.spark.parts import StagedFormat
from snapshot_assets.spark.reconstruct import reconstruct_to_path
from tests.spark.conftest import by_key, read_parts

PREFIX = "events/"
BIG = 2**53 + 1


def row(ident: int, v: str) -> Row:
    return {"id": ident, "v": v}


def ins(r: Row) -> Change:
    return Change(Action.INSERT, laredo_row_key(r, ["id"]), None, r)


def upd(old: Row, new: Row) -> Change:
    return Change(Action.UPDATE, laredo_row_key(new, ["id"]), old, new)


def dele(old: Row) -> Change:
    return Change(Action.DELETE, laredo_row_key(old, ["id"]), old, None)


TRUNCATE = Change(Action.TRUNCATE)

# (kind, epoch, from, to, items)
STEPS: list[tuple[str, int, str | None, str, list[Any]]] = [
    ("snapshot", 1, None, "0/100", [row(1, "a"), row(2, "b"), row(BIG, "big")]),
    ("diff", 1, "0/100", "0/200", [upd(row(1, "a"), row(1, "a2")), upd(row(1, "a2"), row(1, "a3")),
                                   ins(row(3, "c")), dele(row(3, "c")), ins(row(3, "c2")),
                                   upd(row(2, "b"), row(20, "moved"))]),
    # laredo wrote lines in map order: the TRUNCATE is last in the file, yet applies first
    ("diff", 1, "0/200", "0/300", [ins(row(4, "d")), upd(row(BIG, "big"), row(BIG, "big2")), TRUNCATE]),
    ("diff", 1, "0/300", "0/400", [dele(row(4, "d")), ins(row(5, "e")), upd(row(BIG, "big2"), row(BIG, "big3"))]),
    ("snapshot", 2, None, "0/400", [row(5, "e"), row(BIG, "big3")]),
    ("diff", 2, "0/400", "0/500", [ins(row(6, "f")), TRUNCATE, ins(row(7, "g"))]),
    ("diff", 2, "0/500", "0/600", [ins(row(8, "h")), dele(row(7, "g"))]),
]


@pytest.fixture(scope="module", params=["jsonl", "protobuf", "parquet", "jsonl-in-s3", "parquet-in-s3"])
def reader(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ArchiveReader:
    """The archive on a local destination, or in S3 (moto): the tasks then read the objects
    themselves, signed with the destination's connection."""
    fmt, _, where = str(request.param).partition("-in-")
    dest: Destination
    if where == "s3":
        endpoint, bucket = request.getfixturevalue("moto_server"), f"reconstruct-{fmt}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        dest = S3Destination(bucket, endpoint_url=endpoint, path_style=True)
    else:
        dest = LocalDestination(tmp_path_factory.mktemp(f"laredo-{fmt}"))
    writer = ArtifactWriter([dest], PREFIX, snapshot_formats=[fmt], diff_formats=[fmt])
    for kind, epoch, lo, hi, items in STEPS:
        art = writer.write_snapshot(epoch, hi, items) if kind == "snapshot" else \
            writer.write_diff(epoch, lo or "", hi, items)
        commit_artifact([dest], PREFIX, "public.events", art, cmp=comparator("lsn"))
    return ArchiveReader(dest, PREFIX)


@pytest.mark.parametrize("position", ["0/150", "0/300", "0/350", "0/500", None])
def test_reconstruct_matches_the_reader(spark: Any, reader: ArchiveReader, tmp_path: Path,
                                        position: str | None) -> None:
    expected = reader.reconstruct_as_of(position)
    assert expected is not None
    got = reconstruct_to_path(spark, reader, position, tmp_path / "out", "jsonl")
    assert got is not None and got.position == expected.position
    rows = read_parts(StagedFormat("jsonl", got.parts, 0), "snapshot")
    assert by_key(rows, ["id"]) == by_key(expected.rows, ["id"])


def test_reconstruct_before_the_archive_and_bad_positions(spark: Any, reader: ArchiveReader,
                                                          tmp_path: Path) -> None:
    from snapshot_assets.archive.errors import PositionError

    assert reconstruct_to_path(spark, reader, "0/50", tmp_path / "none") is None
    with pytest.raises(PositionError):
        reconstruct_to_path(spark, reader, "not-an-lsn", tmp_path / "bad")
