"""Reading the key a person typed: typed by the manifest's columns, exact beyond 2^53, clear errors."""

from __future__ import annotations

import pytest

from resources.subscribers.events import Column
from snapshot_assets.archive.lookup import BadKey, candidates, key_fields_of, parse_key
from snapshot_assets.archive.manifest import Manifest

COLUMNS = [Column("tenant", "text", False, True, 1, 1, type_oid=25).definition(),
           Column("id", "int8", False, True, 2, 2, type_oid=20).definition(),
           Column("score", "float8", ordinal=3, type_oid=701).definition(),
           Column("flag", "bool", ordinal=4, type_oid=16).definition(),
           Column("blob", "jsonb", ordinal=5).definition()]


def test_values_are_typed_by_the_columns() -> None:
    assert parse_key(["acme", "9007199254740993"], ("tenant", "id"), COLUMNS) == ("acme", 9007199254740993)
    assert parse_key(["42"], ("tenant",), COLUMNS) == ("42",)  # a text column keeps digits as text
    assert parse_key(["2.0"], ("score",), COLUMNS) == (2,)  # canonical: an integral float is the int
    assert parse_key(["true"], ("flag",), COLUMNS) == (True,)


def test_without_column_types_both_readings_are_tried() -> None:
    assert candidates(["42"], ("id",)) == [(42,), ("42",)]
    assert candidates(["abc"], ("id",)) == [("abc",)]
    assert candidates(["42"], ("blob",), COLUMNS) == [(42,), ("42",)]  # JSON column: type unknown
    assert candidates(["42"], ("id",), COLUMNS) == [(42,)]


@pytest.mark.parametrize(("values", "fields", "message"), [
    (["1", "2"], ("id",), r"2 key value\(s\) \['1', '2'\] for key fields \['id'\]"),
    (["x"], ("id",), "key field 'id' holds integers; 'x' is not one"),
    (["x"], ("score",), "key field 'score' holds numbers"),
    (["nan"], ("score",), "cannot be a key"),
    (["yes"], ("flag",), "neither true nor false"),
    (["1"], ("nope",), "key field 'nope' is not a column of the table"),
])
def test_bad_keys_name_the_problem(values: list[str], fields: tuple[str, ...], message: str) -> None:
    with pytest.raises(BadKey, match=message):
        parse_key(values, fields, COLUMNS)


def test_key_fields_come_from_the_primary_key_in_order() -> None:
    assert key_fields_of(Manifest(table="t", columns=list(reversed(COLUMNS)))) == ("tenant", "id")
    assert key_fields_of(Manifest(table="t")) is None
