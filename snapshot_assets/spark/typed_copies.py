"""The typed image of copied rows, from the Go-JSON values their encoding already computed.

Why: a full build types every row for parquet (`parquet_artifact.with_image`: the JVM parses each
row's Go-JSON twice and classifies every member). For the rows of a PostgreSQL copy that was the
largest part of an initial snapshot's task time, although the task that encodes those rows
(`segments.with_images`) holds each column's Go-JSON values as Arrow arrays a moment earlier. Here
those arrays become the typed cells with Arrow kernels, in the same task.

The JVM's typing stays the definition: a cell is given here only where these kernels certainly
produce the JVM's cell for that Go-JSON value, and a row with any other value is left null, for
`typed_columns(..., given=...)` to type in the JVM (exactly as before, misfits refused there). Per
column type, what is certain:
- BOOL: `true`/`false`; INT16/INT32/INT64: an integer token of at most 19 digits within the type's
  range (the JVM's `try_cast` of the same text; snowflake ids have 19 digits);
- FLOAT64: a number with a fraction or an exponent whose double is finite and not integral below
  1e21 (the JVM keeps it as is), or an integer of at most 15 digits other than `-0` (exact as a
  double, so it reads back with the same digits); both parse correctly rounded in Arrow and Java;
- STRING: a JSON string without a backslash (its contents are the text between the quotes);
- JSON: a value without a backslash, a character beyond U+FFFF, a fraction/exponent digit pattern
  or a `-0`: the JVM copies such a value's text unchanged (Jackson re-spells escapes, doubles and
  characters beyond the BMP, which it writes as escaped surrogate pairs);
- `null` everywhere (a NULL cell); the absent list is null (a copy holds every column).
A copy whose columns are not the schema's (a schema change mid-epoch) is left to the JVM whole.

Rows whose token kind the encoder already knows (`KnownTokens`: a text column's plain strings, an
integer column's canonical integers, a boolean's `true`/`false`) are typed without the patterns
above where the kind settles the cell: a plain string is its text, an integer of at most 18
characters its int64 (checked against the column's range), a boolean its literal. Only the other
rows go through the patterns. On the benchmark table this halved the typing of a 268,000-row slice.
tests/spark/test_typed_copies.py holds these kernels to the JVM's typing, cell for cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from resources.subscribers.text_columns import spread
from snapshot_assets.archive.formats.protobuf_columns import INT64_SAFE_CHARS, KnownTokens, TokenKind
from snapshot_assets.archive.row_schema import ColumnType, RowSchema
from snapshot_assets.spark.parquet_artifact import snapshot_arrow_schema

_INT_TOKEN = r"^-?[0-9]{1,19}$"
_INT64_TEXT = {False: ("^[0-9]{19}$", str(2**63 - 1)), True: ("^-[0-9]{19}$", str(-(2**63)))}
_SHORT_INT = r"^(0|-?[1-9][0-9]{0,14})$"  # exact as a double; `-0` is not (it reads back as 0)
_FRACTION = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"
_FLOAT_DIGIT = r"[0-9][.eE]"
_NEGATIVE_ZERO = r"(^|[^0-9])-0([^0-9]|$)"
_ASTRAL = r"[\x{10000}-\x{10FFFF}]"  # Jackson writes these as escaped surrogate pairs
_RANGES = {ColumnType.INT16: (-(2**15), 2**15 - 1), ColumnType.INT32: (-(2**31), 2**31 - 1),
           ColumnType.INT64: (-(2**63), 2**63 - 1)}


@dataclass(frozen=True)
class CopyTyper:
    """The typed cells of copied rows for `schema`, as the struct `type` (the Arrow form of
    `parquet_artifact.image_type(schema)`). Picklable: it travels to the tasks."""

    schema: RowSchema
    type: pa.StructType

    @classmethod
    def of(cls, schema: RowSchema) -> CopyTyper:
        """The typer of `schema`'s rows, its cells in the snapshot's parquet columns."""
        return cls(schema, pa.struct(list(snapshot_arrow_schema(schema))))

    def __call__(self, names: Sequence[str], tokens: Sequence[pa.Array],
                 known: Sequence[KnownTokens | None] = ()) -> pa.Array:
        """One struct per row of the Go-JSON values `tokens` (one string array per column `names`,
        `null` spelled out; `known[j]`: the rows of `tokens[j]` whose kind is known): the typed
        cells where certain, else a null row."""
        rows = len(tokens[0]) if tokens else 0
        by_name = dict(zip(names, tokens, strict=True))
        kinds = dict(zip(names, known, strict=True)) if known else {}
        if sorted(by_name) != sorted(self.schema.names) or rows == 0:
            return pa.nulls(rows, self.type)
        certain = pa.array([True] * rows)
        children = []
        for column, field in zip(self.schema.columns, self.type, strict=False):
            cell, fits = _typed_cells(column.type, by_name[column.name], field.type, kinds.get(column.name))
            children.append(cell)
            certain = pc.and_(certain, fits)
        absent = self.type.field(len(self.schema.columns))
        children.append(pa.nulls(rows, absent.type))
        return pa.StructArray.from_arrays(children, fields=list(self.type), mask=pc.invert(certain))


_KIND_OF_TYPE = {ColumnType.INT16: TokenKind.INTEGER, ColumnType.INT32: TokenKind.INTEGER,
                 ColumnType.INT64: TokenKind.INTEGER, ColumnType.STRING: TokenKind.PLAIN_STRING,
                 ColumnType.BOOL: TokenKind.BOOL}


def _typed_cells(column_type: ColumnType, tokens: pa.Array, arrow_type: pa.DataType,
                 known: KnownTokens | None) -> tuple[pa.Array, pa.Array]:
    """`_cell`, with the rows of a known kind that settles their cell typed straight from it."""
    if known is None or _KIND_OF_TYPE.get(column_type) is not known.kind:
        return _cell(column_type, tokens, arrow_type)
    settled = known.rows
    if known.kind is TokenKind.INTEGER:
        settled = pc.and_(settled, pc.less_equal(pc.utf8_length(tokens), INT64_SAFE_CHARS))
        value = pc.cast(pc.if_else(settled, tokens, "0"), pa.int64())
        low, high = _RANGES[column_type]
        settled = pc.and_(settled, pc.and_(pc.greater_equal(value, low), pc.less_equal(value, high)))
        cell = pc.cast(pc.if_else(settled, value, 0), arrow_type)
    elif known.kind is TokenKind.PLAIN_STRING:
        cell = pc.utf8_slice_codeunits(tokens, 1, -1).cast(arrow_type)
    else:
        cell = pc.equal(tokens, "true").cast(arrow_type)
    if pc.all(settled).as_py():
        return cell, settled
    rest = pc.invert(settled)
    rest_cell, rest_fits = _cell(column_type, tokens.filter(rest), arrow_type)
    cell = pc.if_else(settled, cell, spread(rest_cell, rest))
    return cell, pc.or_(settled, spread(rest_fits, rest).fill_null(False))


def _cell(column_type: ColumnType, tokens: pa.Array, arrow_type: pa.DataType) -> tuple[pa.Array, pa.Array]:
    """The cells of one column (null where NULL or uncertain) and where they are certain."""
    null = pc.equal(tokens, "null")
    if column_type is ColumnType.BOOL:
        fits = pc.or_(null, pc.is_in(tokens, pa.array(["true", "false"])))
        cell = pc.equal(tokens, "true")
    elif column_type in _RANGES:
        low, high = _RANGES[column_type]
        number = pc.match_substring_regex(tokens, _INT_TOKEN)
        for pattern, limit in _INT64_TEXT.values():  # 19 digits may pass int64: equal lengths compare as text
            number = pc.and_(number, pc.invert(pc.and_(pc.match_substring_regex(tokens, pattern),
                                                      pc.greater(tokens, limit))))
        value = pc.cast(pc.if_else(number, tokens, "0"), pa.int64())
        fits = pc.or_(null, pc.and_(number, pc.and_(pc.greater_equal(value, low), pc.less_equal(value, high))))
        cell = pc.cast(pc.if_else(fits, value, 0), arrow_type)
    elif column_type is ColumnType.FLOAT64:
        short = pc.match_substring_regex(tokens, _SHORT_INT)
        fraction = pc.and_(pc.match_substring_regex(tokens, _FRACTION), pc.match_substring_regex(tokens, "[.eE]"))
        value = pc.cast(pc.if_else(pc.or_(short, fraction), tokens, "0"), pa.float64())
        integral = pc.and_(pc.less(pc.abs(value), 1e21), pc.equal(pc.floor(value), value))
        kept = pc.and_(fraction, pc.and_(pc.is_finite(value), pc.invert(integral)))
        fits = pc.or_(null, pc.or_(short, kept))
        cell = value
    elif column_type is ColumnType.STRING:
        plain = pc.and_(pc.starts_with(tokens, '"'), pc.invert(pc.match_substring(tokens, "\\")))
        fits = pc.or_(null, plain)
        cell = pc.utf8_slice_codeunits(tokens, 1, -1)
    else:  # JSON: the value's text, where the JVM would copy it unchanged
        odd = pc.or_(pc.or_(pc.match_substring(tokens, "\\"), pc.match_substring_regex(tokens, _ASTRAL)),
                     pc.or_(pc.match_substring_regex(tokens, _FLOAT_DIGIT),
                            pc.match_substring_regex(tokens, _NEGATIVE_ZERO)))
        fits = pc.or_(null, pc.invert(odd))
        cell = tokens
    return pc.if_else(pc.or_(null, pc.invert(fits)), pa.scalar(None, arrow_type), cell.cast(arrow_type)), fits


__all__ = ["CopyTyper"]
