"""The manifest's `columns`: laredo's ColumnDefinition objects (Go field names), replaced by a commit
that brings them and kept by one that does not."""

from __future__ import annotations

import json
from pathlib import Path

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from resources.subscribers.events import Column
from snapshot_assets.archive.keys import manifest_key
from snapshot_assets.archive.positions import compare_sequence
from snapshot_assets.pipeline.commit import commit_artifact
from tests.pipeline.test_commit import PREFIX, diff, snap

ID = Column("id", "bigint", nullable=False, primary_key=True, ordinal=1, primary_key_ordinal=1, type_oid=20)
NAME = Column("name", "character varying(40)", ordinal=2, default="'x'::character varying", max_length=40,
              type_oid=1043)


def stored_columns(dest: Destination) -> object:
    got = dest.get(manifest_key(PREFIX))
    assert got is not None
    return json.loads(got.data).get("columns")


def test_columns_are_laredo_column_definitions_and_follow_the_schema(tmp_path: Path) -> None:
    dests: list[Destination] = [LocalDestination(tmp_path / "a", name="a"), LocalDestination(tmp_path / "b", name="b")]
    first = [ID.definition(), NAME.definition()]
    commit_artifact(dests, PREFIX, "public.t", snap(dests, 1, "1"), cmp=compare_sequence, columns=first)
    assert ID.definition() == {"Name": "id", "Type": "bigint", "Nullable": False, "PrimaryKey": True,
                               "OrdinalPosition": 1, "PrimaryKeyOrdinal": 1, "DefaultValue": None,
                               "MaxLength": 0, "TypeOID": 20}
    assert all(stored_columns(d) == first for d in dests)

    commit_artifact(dests, PREFIX, "public.t", diff(dests, 1, "1", "2"), cmp=compare_sequence)
    assert all(stored_columns(d) == first for d in dests)  # a commit without columns keeps them

    changed = [ID.definition()]  # e.g. after DROP COLUMN name
    commit_artifact(dests, PREFIX, "public.t", snap(dests, 2, "3"), cmp=compare_sequence, columns=changed)
    assert all(stored_columns(d) == changed for d in dests)
