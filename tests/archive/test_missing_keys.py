"""A row without a key field names no row: folding refuses it instead of keying it `<nil>`.

laredo's `%v` key string still prints a missing field as `<nil>` (that is its format), but no fold
(the reader, the algebra, the Spark jobs through them) may put two such rows under one key.
"""

from __future__ import annotations

import io

import pytest

from snapshot_assets.archive.algebra import collapse
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.errors import ArchiveError, MissingKeyField
from snapshot_assets.archive.keys import DEFAULT_KEY_FIELDS, row_key, typed_key
from snapshot_assets.archive.positions import compare_sequence
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.cli import main
from tests.archive.conftest import PREFIX, BuildArchive

ROWS = [{"user_id": i, "name": f"u{i}"} for i in (1, 2, 3)]


def test_typed_key_refuses_a_missing_field_and_keeps_a_null_value() -> None:
    with pytest.raises(MissingKeyField) as info:
        typed_key({"user_id": 1}, ["tenant", "user_id"])
    assert str(info.value) == "lacks key field 'tenant' (key fields ['tenant', 'user_id'])"
    assert info.value.field == "tenant" and isinstance(info.value, ArchiveError)
    assert typed_key({"id": None}, ["id"]) == (None,)  # a present NULL is a value (laredo's <nil>)
    assert row_key({}, ["id"]) == "<nil>"  # laredo's key string format itself is unchanged


def test_collapse_refuses_rows_without_the_key() -> None:
    inserts = [Change(Action.INSERT, "<nil>", None, row) for row in ROWS]
    assert len(collapse(inserts, ["user_id"])) == 3
    with pytest.raises(MissingKeyField, match="lacks key field 'id'"):
        collapse(inserts, DEFAULT_KEY_FIELDS)


def test_reader_with_the_wrong_key_names_the_artifact_instead_of_keeping_one_row(
        build_archive: BuildArchive) -> None:
    dest, _ = build_archive([
        ("snapshot", 1, None, "1", ROWS),
        ("diff", 1, "1", "2", [Change(Action.INSERT, "4", None, {"user_id": 4, "name": "u4"})]),
    ], key_fields=["user_id"])
    rec = ArchiveReader(dest, PREFIX, key_fields=["user_id"], cmp=compare_sequence).reconstruct_as_of()
    assert rec is not None and sorted(r["user_id"] for r in rec.rows) == [1, 2, 3, 4]
    with pytest.raises(MissingKeyField) as info:
        ArchiveReader(dest, PREFIX, cmp=compare_sequence).reconstruct_as_of()  # laredo's default key [id]
    assert str(info.value).startswith("a row of snapshot"), str(info.value)
    assert "lacks key field 'id' (key fields ['id'])" in str(info.value)


def test_cli_reconstruct_with_the_wrong_key_exits_1_and_says_which(
        build_archive: BuildArchive, capsys: pytest.CaptureFixture[str]) -> None:
    dest, _ = build_archive([("snapshot", 1, None, "1", ROWS)], key_fields=["user_id"])
    where = ["--path", str(dest.root), "--key-prefix", PREFIX, "--positions", "sequence"]
    assert main(["reconstruct", *where, "--output", "jsonl"], out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "lacks key field 'id'" in err and "--key-fields" in err, err
    out = io.StringIO()
    assert main(["reconstruct", *where, "--output", "jsonl", "--key-fields", "user_id"], out=out) == 0
    assert len(out.getvalue().splitlines()) == 3
