"""The row schema: PostgreSQL types and inferred kinds -> column types, and the `number` reading rule."""

from __future__ import annotations

import math

import pytest

from resources.subscribers import pgtypes
from snapshot_assets.archive import gojson
from snapshot_assets.archive.errors import EncodeError
from snapshot_assets.archive.row_schema import (
    ABSENT_COLUMN,
    KIND_BIGINT,
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_NESTED,
    KIND_NULL,
    KIND_STRING,
    PG_COLUMN_TYPES,
    ColumnType,
    RowSchema,
    column_type_of_kinds,
    number_value,
)


def test_manifest_columns_give_the_schema_in_ordinal_order() -> None:
    columns = [
        {"Name": "doc", "Type": "jsonb", "TypeOID": 3802, "OrdinalPosition": 3},
        {"Name": "id", "Type": "bigint", "TypeOID": 20, "OrdinalPosition": 1},
        {"Name": "score", "Type": "double precision", "TypeOID": 701, "OrdinalPosition": 2},
        {"Name": "mood", "Type": "mood", "TypeOID": 91234, "OrdinalPosition": 4},  # an enum: unknown OID
        {"Name": "laredo", "Type": "text", "TypeOID": 0, "OrdinalPosition": 5},  # no OID from the source
    ]
    schema = RowSchema.from_manifest_columns(columns)
    assert [(c.name, c.type) for c in schema.columns] == [
        ("id", ColumnType.INT64), ("score", ColumnType.FLOAT64), ("doc", ColumnType.JSON),
        ("mood", ColumnType.JSON), ("laredo", ColumnType.JSON)]
    assert RowSchema.from_json(schema.to_json()) == schema


def test_bad_manifest_columns_and_reserved_names_are_refused() -> None:
    with pytest.raises(EncodeError, match="manifest columns"):
        RowSchema.from_manifest_columns([{"Type": "bigint"}])
    with pytest.raises(EncodeError, match="reserved"):
        RowSchema.of([(ABSENT_COLUMN, ColumnType.STRING)])


def _sample(converter: pgtypes.Converter) -> object:
    for text in ("t", "42", "1.5", "\\x0a1b", "2024-05-01 12:00:00.5+00", "hello"):
        try:
            return converter(text)
        except ValueError:
            continue
    raise AssertionError(f"no sample converts with {converter}")


@pytest.mark.parametrize("oid", sorted(PG_COLUMN_TYPES))
def test_every_typed_oid_holds_what_the_postgresql_source_produces(oid: int) -> None:
    """One fact, two places: the subscriber's converter for an OID yields values of its column type."""
    value = _sample(pgtypes.Converters(lambda _oid: None)(oid))
    expected = {ColumnType.BOOL: bool, ColumnType.INT16: int, ColumnType.INT32: int, ColumnType.INT64: int,
                ColumnType.FLOAT64: float, ColumnType.STRING: str}[PG_COLUMN_TYPES[oid]]
    assert type(value) is expected


def test_kinds_merge_like_the_python_writer() -> None:
    assert column_type_of_kinds([KIND_INT, KIND_NULL]) is ColumnType.INT64
    assert column_type_of_kinds([KIND_FLOAT]) is ColumnType.FLOAT64
    assert column_type_of_kinds([KIND_STRING]) is ColumnType.STRING
    assert column_type_of_kinds([KIND_BOOL]) is ColumnType.BOOL
    assert column_type_of_kinds([KIND_NULL]) is ColumnType.STRING
    for mixed in ([KIND_INT, KIND_FLOAT], [KIND_BIGINT], [KIND_NESTED], [KIND_STRING, KIND_INT]):
        assert column_type_of_kinds(mixed) is ColumnType.JSON


def test_merge_widens_to_json_and_appends_columns() -> None:
    a = RowSchema.of([("id", ColumnType.INT64), ("x", ColumnType.STRING)])
    b = RowSchema.of([("id", ColumnType.INT64), ("x", ColumnType.INT64), ("y", ColumnType.BOOL)])
    assert a.merge(b) == RowSchema.of([("id", ColumnType.INT64), ("x", ColumnType.JSON), ("y", ColumnType.BOOL)])


@pytest.mark.parametrize("value", [3.0, 1.5, 1e21, 1e-7, -2.0**60, 123456.789, float("nan"), math.inf, -math.inf])
def test_number_cells_read_back_as_their_go_json_text_decodes(value: float) -> None:
    if math.isnan(value):
        assert number_value(value) == "NaN"
    elif math.isinf(value):
        assert number_value(value) == ("Infinity" if value > 0 else "-Infinity")
    else:
        decoded = gojson.loads(gojson.encode_value(value))
        assert number_value(value) == decoded and type(number_value(value)) is type(decoded)
