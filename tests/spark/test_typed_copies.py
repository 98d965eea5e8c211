"""The typed cells of copied rows (`typed_copies`) against the JVM's typing of the same Go-JSON.

The JVM's typing (`parquet_artifact.typed_columns`) is the definition. For any Go-JSON values,
every cell `CopyTyper` claims (a non-null row) must be exactly the JVM's cell, and the JVM must not
refuse such a row; rows it leaves null are typed by the JVM (`typed_columns(given=...)`), which the
last tests check end to end. Values are drawn as PostgreSQL's would be spelled (Go-JSON of typed
values) and as nothing in this project spells them (exponents, `-0`, integral fractions, escapes); always
valid JSON, as every Go-JSON value is.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StringType, StructField, StructType

from snapshot_assets.archive import gojson
from snapshot_assets.archive.formats.protobuf_columns import KnownTokens, TokenKind
from snapshot_assets.archive.row_schema import ColumnType, RowSchema
from snapshot_assets.spark.parquet_artifact import image_type, typed_columns
from snapshot_assets.spark.typed_copies import CopyTyper

SCHEMA = RowSchema.of([("b", ColumnType.BOOL), ("f", ColumnType.FLOAT64), ("i16", ColumnType.INT16),
                       ("i32", ColumnType.INT32), ("i64", ColumnType.INT64), ("j", ColumnType.JSON),
                       ("s", ColumnType.STRING)])
TYPER = CopyTyper.of(SCHEMA)

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)
# any JSON number (what a source other than PostgreSQL might spell)
_number_text = st.from_regex(r"\A-?(0|[1-9][0-9]{0,22})(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?\Z")
_odd = st.sampled_from(["-0", "0", "-0.0", "1e+21", "1E21", "3.0", '"NaN"', '"Infinity"', "true", "false",
                        '"t"', "1", "12", '""', '"a\\"b"', "[]", "{}", '{"a":-0}', '{"a":1.5}', '[1e5]',
                        '{"a":1e-07}', '[0.1000000000000000000001]', '{"a":"\\u003c"}', '[1E+2,2.50]',
                        '{"\U00010000":1}', '["\U0001F600"]'])


def _token(column_type: ColumnType) -> st.SearchStrategy[str]:
    """A Go-JSON value for a column of `column_type`: mostly what the source writes, some not."""
    spelled: st.SearchStrategy[Any]
    if column_type is ColumnType.BOOL:
        spelled = st.booleans()
    elif column_type is ColumnType.FLOAT64:
        spelled = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60)
    elif column_type is ColumnType.STRING:
        spelled = st.text(max_size=12)
    elif column_type is ColumnType.JSON:
        spelled = _json_values
    else:
        # the edges the known path decides on: INT64_SAFE_CHARS (18 characters, sign included) and int64's range
        spelled = st.integers(-(2**64), 2**64) | st.sampled_from(
            [10**18 - 1, -(10**17) + 1, 10**18, -(10**17), 2**63 - 1, -(2**63), 2**63, 32767, 32768, -32769])
    return st.just("null") | spelled.map(gojson.encode_value) | _number_text | _odd


_rows = st.lists(st.fixed_dictionaries({c.name: _token(c.type) for c in SCHEMA.columns}), min_size=1, max_size=40)


def _text(row: dict[str, str]) -> str:
    return "{" + ",".join(f"{gojson.quote(name)}:{row[name]}" for name in sorted(row)) + "}"


def _same(a: Any, b: Any) -> bool:
    """Equal cells, floats by their bits (0.0 and -0.0 differ)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))
    return type(a) is type(b) and a == b


def _cells(rows: list[dict[str, str]]) -> list[dict[str, Any] | None]:
    names = [c.name for c in SCHEMA.columns]
    tokens = [pa.array([row[name] for row in rows], pa.string()) for name in names]
    return TYPER(names, tokens).to_pylist()  # type: ignore[no-any-return]


_KINDS = {TokenKind.INTEGER: re.compile(r"\A(0|-?[1-9][0-9]*)\Z"), TokenKind.PLAIN_STRING: re.compile(r'\A"[^"\\]*"\Z'),
          TokenKind.BOOL: re.compile(r"\A(true|false)\Z")}
_COLUMN_KIND = {
    ColumnType.BOOL: TokenKind.BOOL,
    ColumnType.INT16: TokenKind.INTEGER,
    ColumnType.INT32: TokenKind.INTEGER,
    ColumnType.INT64: TokenKind.INTEGER,
    ColumnType.STRING: TokenKind.PLAIN_STRING,
    ColumnType.FLOAT64: TokenKind.INTEGER,  # a kind that settles no float cell: the patterns type these rows
    ColumnType.JSON: TokenKind.PLAIN_STRING,
}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=_rows, data=st.data())
def test_tokens_of_a_known_kind_get_the_cells_the_patterns_give(rows: list[dict[str, str]], data: Any) -> None:
    """Rows the encoder names as known (some of the tokens that are of the kind; a float or JSON
    column's known rows are typed by the patterns all the same) get exactly the cells the patterns
    give them, the other rows are typed as before."""
    names = [c.name for c in SCHEMA.columns]
    tokens = [pa.array([row[name] for row in rows], pa.string()) for name in names]
    known = []
    for column, column_tokens in zip(SCHEMA.columns, tokens, strict=True):
        kind = _COLUMN_KIND[column.type]
        claimed = [bool(_KINDS[kind].match(t)) and data.draw(st.booleans()) for t in column_tokens.to_pylist()]
        known.append(KnownTokens(kind, pa.array(claimed, pa.bool_())))
    got, expected = TYPER(names, tokens, known).to_pylist(), TYPER(names, tokens).to_pylist()
    for a, b in zip(got, expected, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert all(_same(a[name], b[name]) for name in b), (a, b)


def _jvm(spark: Any, texts: list[str]) -> list[dict[str, Any]]:
    frame = spark.createDataFrame([(str(i), text) for i, text in enumerate(texts)], "key STRING, row STRING")
    typed = typed_columns(frame, SCHEMA).orderBy(frame["key"].cast("int"))
    return [r["columns"].asDict() for r in typed.select("key", "columns").collect()]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=_rows)
def test_every_cell_given_is_the_jvms(spark: Any, rows: list[dict[str, str]]) -> None:
    cells = _cells(rows)
    claimed = [(row, cell) for row, cell in zip(rows, cells, strict=True) if cell is not None]
    if not claimed:
        return
    jvm = _jvm(spark, [_text(row) for row, _ in claimed])
    for (row, mine), theirs in zip(claimed, jvm, strict=True):
        for name in [*SCHEMA.names, "__snapshotter_absent__"]:
            assert _same(mine[name], theirs[name]), (row, name, mine[name], theirs[name])


@pytest.mark.parametrize(("column_type", "token", "cell"), [
    (ColumnType.BOOL, "true", True), (ColumnType.INT16, "-32768", -32768), (ColumnType.INT64, "9007199254740993",
                                                                             9007199254740993),
    (ColumnType.INT64, "1152921504606846976", 2**60), (ColumnType.INT64, "-9223372036854775808", -(2**63)),
    (ColumnType.FLOAT64, "0.14285714285714285", 0.14285714285714285), (ColumnType.FLOAT64, "3", 3.0),
    (ColumnType.FLOAT64, "1e+21", 1e21), (ColumnType.STRING, '"user1@example.com"', "user1@example.com"),
    (ColumnType.STRING, '"2024-01-01T00:00:01Z"', "2024-01-01T00:00:01Z"), (ColumnType.STRING, '"é ✓"', "é ✓"),
    (ColumnType.JSON, '{"tags":["t1"],"tier":1}', '{"tags":["t1"],"tier":1}'), (ColumnType.JSON, "[1,2]", "[1,2]"),
    (ColumnType.JSON, "12345678901234567890123", "12345678901234567890123"), (ColumnType.JSON, '"x"', '"x"'),
])
def test_what_a_postgresql_copy_holds_is_typed_here(column_type: ColumnType, token: str, cell: Any) -> None:
    """The values of an ordinary table are typed in the task (else the fast path is moot)."""
    schema = RowSchema.of([("c", column_type)])
    typer = CopyTyper.of(schema)
    (typed,) = typer(["c"], [pa.array([token])]).to_pylist()
    assert typed is not None and _same(typed["c"], cell)
    (empty,) = typer(["c"], [pa.array(["null"])]).to_pylist()
    assert empty == {"c": None, "__snapshotter_absent__": None}


@pytest.mark.parametrize(("column_type", "token"), [
    (ColumnType.INT16, "40000"), (ColumnType.INT32, "12.5"), (ColumnType.INT64, "99999999999999999999"),
    (ColumnType.INT64, "9223372036854775808"), (ColumnType.INT64, "-9223372036854775809"),
    (ColumnType.FLOAT64, "3.0"), (ColumnType.FLOAT64, "-0"), (ColumnType.FLOAT64, '"NaN"'),
    (ColumnType.FLOAT64, "123456789012345678"), (ColumnType.STRING, '"a\\nb"'), (ColumnType.STRING, "12"),
    (ColumnType.BOOL, '"t"'), (ColumnType.JSON, '{"a":1.5}'), (ColumnType.JSON, '"\\u003c"'), (ColumnType.JSON, "-0"),
    (ColumnType.JSON, '{"\U00010000":1}'),
])
def test_what_the_jvm_spells_otherwise_is_left_to_it(column_type: ColumnType, token: str) -> None:
    schema = RowSchema.of([("c", column_type)])
    typer = CopyTyper.of(schema)
    assert typer(["c"], [pa.array([token])]).to_pylist() == [None]


def test_a_copy_of_other_columns_is_left_to_the_jvm() -> None:
    names = ["b", "extra"]
    assert TYPER(names, [pa.array(["true"]), pa.array(["1"])]).to_pylist() == [None]


def test_given_cells_are_kept_and_the_rest_typed_by_the_jvm(spark: Any) -> None:
    """`typed_columns(given=...)`: a row with cells keeps them (its text is not parsed: here it is
    not even JSON), a row without is typed from its text exactly as without `given`."""
    rows = [{"b": "true", "f": "1.5", "i16": "1", "i32": "2", "i64": "3", "j": "[1]", "s": '"x"'},
            {"b": "false", "f": "-0", "i16": "null", "i32": "7", "i64": "-3", "j": '{"a":1.5}', "s": '"a\\nb"'}]
    cells = _cells(rows)
    assert cells[0] is not None and cells[1] is None
    shape = StructType([StructField("key", StringType()), StructField("row", StringType()),
                        StructField("given", image_type(SCHEMA))])
    frame = spark.createDataFrame([("0", "not json", cells[0]), ("1", _text(rows[1]), None)], shape)
    both = typed_columns(frame, SCHEMA, given="given").orderBy("key").collect()
    assert both[0].__fields__ == ["key", "row", "columns"]
    assert both[0]["columns"].asDict() == cells[0]
    assert both[1]["columns"].asDict() == _jvm(spark, [_text(rows[1])])[0]

