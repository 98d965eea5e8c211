"""What a restore writes, decided from the manifest alone: the plan for a label or a position, the
columns and key, the size estimate that chooses the path, and the names it refuses."""

from __future__ import annotations

import re

import pytest

from snapshot_assets.archive.manifest import Artifact, FormatRef, Manifest
from snapshot_assets.archive.pins import Pin, with_pin
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.point import TargetColumn, key_fields_of, restore_point
from snapshot_assets.restore.target import TableName

_FORMATS = {"jsonl": FormatRef("file:///x", 1)}
COLUMNS = [
    {"Name": "id", "Type": "bigint", "Nullable": False, "PrimaryKey": True, "OrdinalPosition": 2,
     "PrimaryKeyOrdinal": 2, "TypeOID": 20},
    {"Name": "tenant", "Type": "text", "Nullable": False, "PrimaryKey": True, "OrdinalPosition": 1,
     "PrimaryKeyOrdinal": 1, "TypeOID": 25},
    {"Name": "amount", "Type": "numeric(12,2)", "Nullable": True, "PrimaryKey": False, "OrdinalPosition": 3,
     "PrimaryKeyOrdinal": 0, "TypeOID": 1700},
]


def _snapshot(to: str, rows: int, label: str | None = None) -> Artifact:
    art = Artifact("snapshot", 1, None, to, "2026-01-01T00:00:00Z", _FORMATS, row_count=rows)
    return with_pin(art, Pin(label, "2026-01-01T00:00:00Z")) if label else art


def _diff(start: str, to: str, changes: int) -> Artifact:
    return Artifact("diff", 1, start, to, "2026-01-01T00:00:00Z", _FORMATS, change_count=changes)


MANIFEST = Manifest("public.t", 1, head_position="0/40", columns=COLUMNS, artifacts=(
    _snapshot("0/10", 100, "go-live"), _diff("0/10", "0/20", 7), _diff("0/20", "0/30", 5),
    _snapshot("0/30", 101), _diff("0/30", "0/40", 3)))


def test_a_label_is_its_snapshot_exactly() -> None:
    point = restore_point(MANIFEST, label="go-live")
    assert point.plan.snapshot is MANIFEST.artifacts[0] and point.plan.diffs == ()
    assert (point.position, point.label, point.estimated_rows) == ("0/10", "go-live", 100)
    assert point.columns == (TargetColumn("tenant", "text", False), TargetColumn("id", "bigint", False),
                             TargetColumn("amount", "numeric(12,2)", True))
    assert point.key_fields == ("tenant", "id")


def test_a_position_is_the_last_boundary_at_or_before_it() -> None:
    point = restore_point(MANIFEST, position="0/2F")
    assert point.plan.snapshot is MANIFEST.artifacts[0]
    assert [d.to_position for d in point.plan.diffs] == ["0/20"]
    assert (point.position, point.label, point.estimated_rows) == ("0/20", None, 107)
    assert restore_point(MANIFEST, position="FF/0").position == "0/40"  # beyond the head: the head


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"label": "nope"}, "public.t has no snapshot labelled 'nope'; labels: go-live"),
    ({"position": "0/F"}, "cannot restore position 0/F: its first snapshot is at 0/10"),
    ({"position": "soon"}, "'soon' is not a PostgreSQL LSN"),
    ({}, "exactly one"),
    ({"label": "go-live", "position": "0/10"}, "exactly one"),
])
def test_points_that_do_not_exist_are_named(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(RestoreError, match=re.escape(message)):
        restore_point(MANIFEST, label=kwargs.get("label"), position=kwargs.get("position"))


def test_a_manifest_without_columns_cannot_be_restored() -> None:
    bare = Manifest("public.gen", 1, head_position="0/10", artifacts=(_snapshot("0/10", 3),))
    with pytest.raises(RestoreError, match=r"public\.gen has no column definitions"):
        restore_point(bare, position="0/10")
    assert key_fields_of(bare, ("k",)) == ("k",)


def test_target_names() -> None:
    assert TableName.parse("users") == TableName("public", "users")
    assert str(TableName.parse("archive.users_2026")) == "archive.users_2026"
    for bad in ("", "s.", ".t", "x" * 64):
        with pytest.raises(RestoreError, match="is not a table name"):
            TableName.parse(bad)
