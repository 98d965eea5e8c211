"""Rows kept as column text (`text_rows`) → their Go-JSON text, computed column by column.

Why: a snapshot row of the initial copy or a re-sync is encoded once, in the build's tasks, and
there are as many of them as the table has rows. Typing each value in Python and encoding each row
with `gojson.encode_row` cost about 20 µs a row; here each column of a batch is turned into its
JSON values by Arrow compute kernels, and the rows are joined from them with the column names, in
Go's order (sorted), so Python only touches the values no kernel spells exactly.

What a kernel spells, by converter spec (`pgtypes`), is exactly what the typed path writes:
- `int`: a canonical integer (how PostgreSQL prints one), which is Go's spelling of the exact
  integer; any other text goes to the typed path, which refuses it;
- `bool`: `t`/`f` → `true`/`false`;
- `text`: the text quoted, when it holds nothing Go escapes (`"`, `\\`, control characters, `<`,
  `>`, `&`, U+2028, U+2029);
- `timestamptz`/`timestamp`: the usual `YYYY-MM-DD HH:MM:SS[.f][+00]` rewritten to RFC 3339;
- `float`: a plain decimal (no exponent: PostgreSQL prints one only for exponents in [-4, 15),
  where Go writes the same shortest digits without one).
Every other value (nested JSON, bytea, arrays, NaN, BC dates, strings with escapes, exponents) goes
through the typed path's own converter and encoder, one value at a time, except JSON documents, which
`gojson.encode_documents` encodes all at once where it can; NULL is `null`.

A batch any value of which that path refuses is encoded again row by row with `gojson.encode_row`,
so a refusal reads exactly as the typed path's (column and row key named). The property tests in
tests/buffer/test_text_columns.py hold this module to the typed path, byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from resources.subscribers import pgtypes
from resources.subscribers.text_rows import RowCodec
from snapshot_assets.archive import gojson
from snapshot_assets.archive.formats.protobuf import snapshot_record
from snapshot_assets.archive.formats.protobuf_columns import KnownTokens, TokenKind, snapshot_records

_NULL = "null"
# RE2 classes (Arrow's regex engine) of what each kernel can spell exactly.
_PLAIN_TEXT = r'^[^\x00-\x1f"\\<>&\x{2028}\x{2029}]*$'
_STAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?"
_UTC_STAMP = _STAMP + r"\+00$"
_LOCAL_STAMP = _STAMP + "$"
_PLAIN_DECIMAL = r"^-?\d+(\.\d+)?$"
_CANONICAL_INT = r"^(0|-?[1-9]\d*)$"


def _quoted(values: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise('"', values, '"', "")


def _as_is(values: pa.Array) -> pa.Array:
    return values


def _bool(values: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(values, "t"), "true", "false")


def _utc_stamp(values: pa.Array) -> pa.Array:
    # `2024-05-01 12:00:00.5+00` → `"2024-05-01T12:00:00.5Z"` (`pgtypes.to_timestamptz`'s usual case)
    stamp = pc.replace_substring(pc.utf8_slice_codeunits(values, 0, -3), " ", "T", max_replacements=1)
    return pc.binary_join_element_wise('"', stamp, 'Z"', "")


def _local_stamp(values: pa.Array) -> pa.Array:
    return _quoted(pc.replace_substring(values, " ", "T", max_replacements=1))


# spec → (the values the kernel spells exactly: an RE2 pattern, or None for "every value"; kernel)
_KERNELS: dict[str, tuple[str | None, Callable[[pa.Array], pa.Array]]] = {
    "int": (_CANONICAL_INT, _as_is),
    "bool": ("^[tf]$", _bool),
    "text": (_PLAIN_TEXT, _quoted),
    "timestamptz": (_UTC_STAMP, _utc_stamp),
    "timestamp": (_LOCAL_STAMP, _local_stamp),
    "float": (_PLAIN_DECIMAL, _as_is),
}


#: spec → the kind of token its kernel spells (`protobuf_columns.KnownTokens`: the records skip
#: classifying those tokens again); a spec without one leaves its tokens to be classified.
_KERNEL_TOKENS: dict[str, TokenKind] = {
    "int": TokenKind.INTEGER,
    "bool": TokenKind.BOOL,
    "text": TokenKind.PLAIN_STRING,
    "timestamptz": TokenKind.PLAIN_STRING,
    "timestamp": TokenKind.PLAIN_STRING,
}


def _typed_path(values: Sequence[str], spec: str) -> list[str]:
    if spec == "json":  # all of them at once where it gives the same bytes (no Python per document)
        documents = gojson.encode_documents(values)
        if documents is not None:
            return documents
    convert = pgtypes.converter_of(spec)
    return [gojson.encode_value(convert(value)) for value in values]


class JsonColumn(NamedTuple):
    """A column's JSON values (`encode_column`) and what its kernel is known to have spelled."""

    tokens: pa.Array
    known: KnownTokens | None


def json_column(values: pa.Array, spec: str) -> JsonColumn:
    """`encode_column`, with the rows whose token the spec's kernel spelled (their kind is the
    kernel's, `_KERNEL_TOKENS`) for the protobuf records built from the same tokens."""
    kernel = _KERNELS.get(spec)
    present = pc.is_valid(values)
    if kernel is None:
        spelled = pa.array(np.zeros(len(values), dtype=bool))
        out = pa.nulls(len(values), pa.string())
    else:
        pattern, encode = kernel
        spelled = present if pattern is None else pc.and_(present, pc.match_substring_regex(values, pattern))
        spelled = spelled.fill_null(False)
        out = pc.if_else(spelled, encode(values), pa.scalar(None, pa.string()))
    rest = pc.and_(present, pc.invert(spelled))
    if pc.any(rest).as_py():
        out = pc.replace_with_mask(out, rest, _each_distinct_once(values.filter(rest), spec))
    kind = _KERNEL_TOKENS.get(spec)
    return JsonColumn(out.fill_null(_NULL), None if kind is None else KnownTokens(kind, spelled))


def _each_distinct_once(others: pa.Array, spec: str) -> pa.Array:
    """The typed path of each value of `others`, computed once per distinct value: a column the
    kernels leave to it (json, numeric, arrays) often repeats a few values (settings, tags, enums).
    On the benchmark table's jsonb column (50 distinct documents) a 268,000-row slice took 0.02 s
    instead of 0.5 s; a column of all-distinct documents pays one hash pass more (0.045 of 0.72 s)."""
    distinct = pc.unique(others)
    if len(distinct) == len(others):
        return pa.array(_typed_path(others.to_pylist(), spec), pa.string())
    encoded = pa.array(_typed_path(distinct.to_pylist(), spec), pa.string())
    return encoded.take(pc.index_in(others, value_set=distinct))


def encode_column(values: pa.Array, spec: str) -> pa.Array:
    """The JSON value of every text in `values` (a string array, null for SQL NULL) as the typed
    path writes it: `gojson.encode_value(pgtypes.converter_of(spec)(text))`, `null` for NULL."""
    return json_column(values, spec).tokens


#: What `encode_column` raises for a value the typed path refuses (it names the value's column and
#: row only when the rows are encoded again one by one).
REFUSED = (ValueError, gojson.UnsupportedValue)


def columns_of(images: pa.ListArray, width: int) -> list[pa.Array]:
    """The `width` columns of `images` (every image `width` texts long)."""
    flat = pc.list_flatten(images)
    rows = len(images)
    return [flat.take(pa.array(np.arange(j, rows * width, width))) for j in range(width)]


def spread(values: pa.Array, where: pa.Array) -> pa.Array:
    """`values` (one per true of `where`) placed at the trues of `where`, null elsewhere."""
    if pc.all(where).as_py():
        return values
    positions = pc.subtract(pc.cumulative_sum(pc.cast(where, pa.int64())), 1)
    return values.take(pc.if_else(where, positions, pa.scalar(None, pa.int64())))


def joined_rows(names: Sequence[str], columns: Sequence[pa.Array]) -> pa.Array:
    """Each row's Go-JSON object from its columns' JSON values (`columns[j]` is the column
    `names[j]`): members in Go's order, the names sorted."""
    pieces: list[pa.Array | str] = []
    for position, j in enumerate(sorted(range(len(names)), key=lambda i: names[i])):
        pieces.append(("{" if position == 0 else ",") + gojson.quote(names[j]) + ":")
        pieces.append(columns[j])
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "")


def _naming(key: str) -> Callable[[], str]:
    return lambda: key


def _row_by_row(codec: RowCodec, images: pa.ListArray, keys: Sequence[str]) -> pa.Array:
    return pa.array([gojson.encode_row(codec.image(tuple(texts)), _naming(key))
                     for texts, key in zip(images.to_pylist(), keys, strict=True)], pa.string())


def _records_of(texts: pa.Array) -> pa.Array:
    """The protobuf snapshot records of whole Go-JSON rows, one row at a time (the typed path)."""
    return pa.array([snapshot_record(gojson.loads(text), ()) for text in texts.to_pylist()], pa.binary())


class CellTyper(Protocol):
    """Turns a batch's columns of Go-JSON values into typed cells (`typed_copies.CopyTyper`)."""

    @property
    def type(self) -> pa.DataType: ...

    def __call__(self, names: Sequence[str], tokens: Sequence[pa.Array],
                 known: Sequence[KnownTokens | None] = ()) -> pa.Array: ...


class Copies(NamedTuple):
    """What `encode_copies` made of a batch of copied rows."""

    texts: pa.Array  # each row's Go-JSON text
    records: pa.Array | None  # each row's protobuf snapshot record (asked for)
    cells: pa.Array | None  # each row's typed cells (asked for; null rows: none given)


def encode_copies(codec: RowCodec, images: pa.ListArray, keys: pa.Array, *,
                  records: bool = False, typed: CellTyper | None = None) -> Copies:
    """The Go-JSON text of each whole image in `images` (list<string>, table order), exactly
    `gojson.encode_row(codec.image(texts))`, and with `records` also each row's protobuf snapshot
    record, exactly `protobuf.snapshot_record` of that text decoded (`protobuf_columns`), built
    from the same columns of JSON values; with `typed`, the typed cells `typed` makes of those
    columns (all null when the batch went row by row). `keys` name the rows in an error."""
    width = len(codec.names)
    if len(images) > 0 and width > 0 and images.null_count == 0 and \
            pc.all(pc.equal(pc.list_value_length(images), width)).as_py():
        try:
            encoded = [json_column(column, codec.specs[j]) for j, column in enumerate(columns_of(images, width))]
        except REFUSED:
            pass  # the row-by-row path below raises the typed path's own error, naming column and row
        else:
            columns, known = [c.tokens for c in encoded], [c.known for c in encoded]
            return Copies(joined_rows(codec.names, columns),
                          snapshot_records(codec.names, columns, known) if records else None,
                          typed(codec.names, columns, known) if typed is not None else None)
    texts = _row_by_row(codec, images, keys.to_pylist())
    return Copies(texts, _records_of(texts) if records else None,
                  pa.nulls(len(texts), typed.type) if typed is not None else None)


COPY_BLOCK_BYTES = 1 << 20
"""How much CSV one batch of a copy is parsed from: about 5,000 rows of a narrow table, so the
ingest's queue of batches stays a few tens of MiB (a row larger than a block is parsed again with
larger blocks: `copy_text_batches`)."""
_MAX_BLOCK_BYTES = 1 << 31


def _csv_reader(path: str, width: int, block_bytes: int) -> Any:
    names = [f"c{i}" for i in range(width)]
    return pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names, block_size=block_bytes),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        # PostgreSQL's CSV: NULL is an unquoted empty field, an empty string a quoted one.
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=True,
                                             quoted_strings_can_be_null=False, null_values=[""]))


def copy_text_batches(path: str, width: int, block_bytes: int = COPY_BLOCK_BYTES) -> Iterator[pa.RecordBatch]:
    """The rows of `COPY ... TO STDOUT (FORMAT csv)` output in the file `path` as batches of
    `width` string columns (null: SQL NULL), exactly the column texts the row path reads.

    Why CSV: it is the copy format whose NULL and empty string differ by quoting alone, and Arrow
    parses it in C++, so a copy costs no Python per row. A row larger than a block stops Arrow's
    streaming reader; the file is then read again with blocks four times larger, from the first
    row not yet handed out."""
    if os.path.getsize(path) == 0:
        return
    done = 0
    while True:
        try:
            seen = 0
            for batch in _csv_reader(path, width, block_bytes):
                start, seen = max(0, done - seen), seen + batch.num_rows
                if seen > done:
                    yield batch.slice(start)
                    done = seen
            return
        except pa.ArrowInvalid as exc:
            if "straddling" not in str(exc) or block_bytes >= _MAX_BLOCK_BYTES:
                raise
            block_bytes *= 4


def encode_images(codec: RowCodec, images: pa.ListArray, keys: pa.Array) -> pa.Array:
    """`encode_copies` without the records: the Go-JSON text of each whole image."""
    return encode_copies(codec, images, keys).texts


__all__ = ["COPY_BLOCK_BYTES", "REFUSED", "CellTyper", "Copies", "columns_of", "copy_text_batches", "encode_column",
           "encode_copies", "encode_images", "joined_rows", "spread"]
