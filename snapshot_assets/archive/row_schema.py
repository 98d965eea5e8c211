"""The typed columns of a table's rows: one definition shared by the Spark parquet writer and the reader.

A row travels through the Spark jobs as Go-JSON text; its parquet artifact holds typed columns.
Which type a column gets comes from the table's schema: the manifest `columns` of a PostgreSQL
source (by type OID, `PG_COLUMN_TYPES`), or, for a source without a schema (the generator, laredo
archives without `columns`), the kinds of the values seen (`column_type_of_kinds`, the same merge
rule the Python parquet writer applies while it spools).

A column type only ever holds a value it can give back exactly, as the row's Go-JSON text decodes
(`gojson.loads`):
- BOOL, INT16/INT32/INT64, STRING: the value itself.
- FLOAT64: a double whose cells read back the way the JSON number they came from decodes
  (`number_value`): an integral value below 1e21 is an int (Go writes `3`, not `3.0`, and beyond
  2^53 the shortest round-trip digits padded with zeros), NaN and
  +-Infinity are the strings 'NaN', 'Infinity', '-Infinity' (how the PostgreSQL source carries float
  specials, which JSON cannot hold as numbers). No Go-JSON row holds a NaN float, so nothing is
  ambiguous.
- JSON: a string holding the value's JSON text (nested objects/arrays, integers beyond int64, a
  column mixing kinds, a type this module does not know). Integers of any size stay exact.

The parquet field metadata `snapshotter.encoding` names the encodings the reader undoes: `json`
(JSON text), `number` (the FLOAT64 rule above), `decimal` (the Python writer's Decimal text),
`absent` (the list column naming the columns a row lacks). No Spark or Arrow import here: the
archive core stays free of both.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from snapshot_assets.archive.errors import EncodeError

ENCODING_KEY = "snapshotter.encoding"
ABSENT_COLUMN = "__snapshotter_absent__"

ENCODING_JSON = "json"
ENCODING_NUMBER = "number"
ENCODING_DECIMAL = "decimal"
ENCODING_ABSENT = "absent"


class ColumnType(enum.Enum):
    """How one column is stored in a typed artifact."""

    BOOL = "bool"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT64 = "float64"
    STRING = "string"
    JSON = "json"

    @property
    def encoding(self) -> str | None:
        """The `snapshotter.encoding` a reader must undo for this column (None: the cell is the value)."""
        return _ENCODINGS.get(self)


_ENCODINGS = {ColumnType.JSON: ENCODING_JSON, ColumnType.FLOAT64: ENCODING_NUMBER}

#: PostgreSQL type OID -> column type, for the values `resources.subscribers.pgtypes` produces: ints
#: exact (oid is unsigned 32-bit, so int64), floats as numbers or their special names, bool, and the
#: types whose values are text (numeric keeps its digits as text, bytea is base64, times are RFC 3339
#: or PostgreSQL's own text for infinity/BC). json/jsonb, arrays, domains, enums and every other OID
#: map to JSON, which holds any value exactly.
PG_COLUMN_TYPES: Mapping[int, ColumnType] = {
    16: ColumnType.BOOL, 21: ColumnType.INT16, 23: ColumnType.INT32, 20: ColumnType.INT64, 26: ColumnType.INT64,
    700: ColumnType.FLOAT64, 701: ColumnType.FLOAT64,
    **{oid: ColumnType.STRING for oid in (
        17,  # bytea (base64)
        18, 19, 25, 1042, 1043,  # char, name, text, bpchar, varchar
        142, 650, 774, 829, 869,  # xml, cidr, macaddr8, macaddr, inet
        1082, 1083, 1114, 1184, 1186, 1266,  # date, time, timestamp, timestamptz, interval, timetz
        1700, 2950, 3614,  # numeric, uuid, tsvector
    )},
}

# --- the kinds of values, as the Spark inference classifies a row's Go-JSON members -------------

KIND_NULL = "null"
KIND_BOOL = "bool"
KIND_INT = "int"  # an integer within int64
KIND_BIGINT = "bigint"  # an integer beyond int64
KIND_FLOAT = "float"  # a number written with a fraction or an exponent
KIND_STRING = "string"
KIND_NESTED = "nested"  # an object or an array

_TYPE_OF_KIND = {KIND_BOOL: ColumnType.BOOL, KIND_INT: ColumnType.INT64, KIND_FLOAT: ColumnType.FLOAT64,
                 KIND_STRING: ColumnType.STRING}


def column_type_of_kinds(kinds: Iterable[str]) -> ColumnType:
    """The type that holds every value of these kinds: nulls fit anything, one scalar kind keeps
    its type, anything else (two kinds, nested values, integers beyond int64) is JSON text.
    A column that only ever held nulls is STRING (a typed column of nulls)."""
    seen = {kind for kind in kinds if kind != KIND_NULL}
    if not seen:
        return ColumnType.STRING
    if len(seen) == 1:
        return _TYPE_OF_KIND.get(seen.pop(), ColumnType.JSON)
    return ColumnType.JSON


def number_value(value: float) -> int | float | str:
    """The value of a FLOAT64 cell as the JSON number it came from decodes (see the module doc)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value.is_integer() and abs(value) < 1e21:
        # Go prints the shortest digits that round-trip, then zeros: -2.0**60 is -1152921504606847000.
        return int(value) if abs(value) < 2**53 else int(Decimal(repr(value)))
    return value


# --- the schema ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchemaColumn:
    name: str
    type: ColumnType


@dataclass(frozen=True, slots=True)
class RowSchema:
    """The typed columns of a table's rows, in order. Every typed image also carries ABSENT_COLUMN."""

    columns: tuple[SchemaColumn, ...]

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if ABSENT_COLUMN in names:
            raise EncodeError(f"column name {ABSENT_COLUMN!r} is reserved by the parquet format",
                              column=ABSENT_COLUMN)
        if len(set(names)) != len(names):
            raise EncodeError(f"a row schema names a column twice: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def type_of(self, name: str) -> ColumnType:
        for column in self.columns:
            if column.name == name:
                return column.type
        raise KeyError(name)

    @classmethod
    def of(cls, columns: Iterable[tuple[str, ColumnType]]) -> RowSchema:
        return cls(tuple(SchemaColumn(name, type_) for name, type_ in columns))

    @classmethod
    def from_manifest_columns(cls, columns: Sequence[Mapping[str, Any]]) -> RowSchema:
        """The schema of a source that describes its columns (laredo's ColumnDefinition, as the
        manifest's `columns` and the buffer's `TableSchema` carry them): ordered by
        OrdinalPosition, typed by TypeOID (0 or unknown: JSON)."""
        try:
            ordered = sorted(columns, key=lambda c: int(c.get("OrdinalPosition") or 0))
            return cls.of((str(c["Name"]), PG_COLUMN_TYPES.get(int(c.get("TypeOID") or 0), ColumnType.JSON))
                          for c in ordered)
        except (KeyError, TypeError, ValueError) as exc:
            raise EncodeError(f"manifest columns cannot describe a row schema: {exc!r}") from None

    def merge(self, other: RowSchema) -> RowSchema:
        """A schema that holds the rows of both (columns of `other` not here are appended; a column
        typed differently by the two is JSON)."""
        theirs = {c.name: c.type for c in other.columns}
        merged = [(c.name, c.type if theirs.get(c.name, c.type) is c.type else ColumnType.JSON)
                  for c in self.columns]
        mine = set(self.names)
        merged.extend((c.name, c.type) for c in other.columns if c.name not in mine)
        return RowSchema.of(merged)

    def to_json(self) -> str:
        """A compact text form, e.g. for a state dataset's marker."""
        return json.dumps([[c.name, c.type.value] for c in self.columns], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RowSchema:
        return cls.of((str(name), ColumnType(type_)) for name, type_ in json.loads(text))
