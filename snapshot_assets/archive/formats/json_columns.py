"""Go-JSON row texts taken apart into their columns' value tokens with Arrow kernels.

Why: a row that enters as JSON (every source but PostgreSQL: a generator, a laredo server) has no
column texts, so its protobuf snapshot record was built from the decoded row in Python, about 10-20
µs a row, which for a copy is the whole table. The rows of a batch nearly always have the same
column names (two lists of them where it straddles a schema change: each list is split in turn, up
to MAX_SHAPES), which the Go-JSON encoder writes in one order without spaces, so each such row is
`{"k0":v0,"k1":v1,...}`: split at the literal `,"k1":`, `,"k2":`, ... (one RE2 split of the whole
batch) it gives each column's Go-JSON token, and `protobuf_columns.snapshot_records` builds the
records from the tokens, as it does from a PostgreSQL copy's columns.

A split is taken only where it is the row's parse: the row is exactly the names' prefix and
separators around its pieces, and every piece is one whole JSON value (a separator inside a string
cannot occur, the encoder escapes its quotes; one inside a nested object leaves a piece that is not
a whole value). The check accepts values nested at most two levels deep (a scalar; an array or
object of scalars, or of arrays and objects of scalars). Any other row is encoded alone, from its
decoded row, as before: the records are the per-row encoder's bytes either way
(tests/formats/test_json_columns.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Row
from snapshot_assets.archive.formats.protobuf import snapshot_record
from snapshot_assets.archive.formats.protobuf_columns import snapshot_records

_SCALAR = rf"(?:{gojson.STRING_TOKEN}|{gojson.NUMBER_TOKEN}|true|false|null)"


def _nested(inner: str) -> str:
    """A value that is a scalar, or an array or object of `inner` values."""
    array = rf"\[(?:{inner}(?:,{inner})*)?\]"
    members = rf"{gojson.STRING_TOKEN}:{inner}"
    return rf"(?:{_SCALAR}|{array}|\{{(?:{members}(?:,{members})*)?\}})"


#: A Go-JSON value token nested at most two levels deep.
_VALUE = _nested(_nested(_SCALAR))


#: How many lists of column names one batch is split by (a batch that straddles a schema change
#: has two); rows of further shapes are encoded one by one.
MAX_SHAPES = 4

#: The whole of a value token, and nothing else.
_WHOLE_VALUE = rf"^{_VALUE}$"


@dataclass(frozen=True, slots=True)
class SplitRows:
    """The rows of a batch that have one list of column names: which, and each column's tokens."""

    names: tuple[str, ...]
    rows: np.ndarray  # positions in the batch, ascending
    columns: list[pa.Array]  # one string array per name, the tokens of `rows`


def split_rows(texts: pa.Array) -> SplitRows | None:
    """The rows of `texts` (Go-JSON objects; nulls allowed) with the column names of its first
    row, in that order, split into their values' tokens; None when no row is (no object row)."""
    if pa.types.is_large_string(texts.type):  # Arrow's join kernels want one string type throughout
        try:
            texts = texts.cast(pa.string())
        except pa.ArrowInvalid:  # over 2 GiB of text in one batch: the row-by-row path
            return None
    valid = texts.drop_null()
    if not len(valid):
        return None
    first = gojson.loads(valid[0].as_py())
    if not isinstance(first, dict) or not first:
        return None
    names = tuple(first)
    keys = [gojson.encode_value(name) for name in names]
    prefix, separators = "{" + keys[0] + ":", ["," + key + ":" for key in keys[1:]]
    texts = texts.fill_null("")
    if not separators:  # one column: the whole row is its one piece
        pieces = pa.ListArray.from_arrays(pa.array(np.arange(len(texts) + 1, dtype=np.int32)), texts)
    else:
        try:
            pieces = pc.split_pattern_regex(texts, pattern="|".join(re.escape(s) for s in separators))
        except pa.ArrowInvalid:  # RE2 refused the pattern: the row-by-row path
            return None
    width = len(names)
    counted = pc.equal(pc.list_value_length(pieces), width)
    at = np.flatnonzero(counted.to_numpy(zero_copy_only=False))
    flat = pc.list_flatten(pieces.take(pa.array(at, pa.int64())))
    columns = [flat.take(pa.array(np.arange(j, len(flat), width, dtype=np.int64))) for j in range(width)]
    if not len(at):
        return SplitRows(names, at, columns)
    # the first piece follows the prefix; the last ends with the object's brace
    starts_right = pc.starts_with(columns[0], prefix)
    ends_right = pc.ends_with(columns[-1], "}")
    columns[0] = pc.utf8_slice_codeunits(columns[0], len(prefix))
    columns[-1] = pc.utf8_slice_codeunits(columns[-1], 0, -1)
    spelled: list[pa.Array | str] = [prefix, columns[0]]  # the row as these pieces would spell it
    for separator, column in zip(separators, columns[1:], strict=True):
        spelled += [separator, column]
    rebuilt = pc.binary_join_element_wise(*spelled, "}", "")
    exact = pc.and_(pc.and_(starts_right, ends_right), pc.equal(rebuilt, texts.take(pa.array(at, pa.int64()))))
    for column in columns:
        exact = pc.and_(exact, pc.match_substring_regex(column, _WHOLE_VALUE))
    keep = np.flatnonzero(exact.to_numpy(zero_copy_only=False))
    chosen = pa.array(keep, pa.int64())
    return SplitRows(names, at[keep], [column.take(chosen) for column in columns])


def snapshot_records_of_texts(texts: pa.Array, key_fields: Sequence[str], decode: Callable[[str], Row | None]
                              ) -> pa.Array:
    """The delimited `SnapshotRow` record of each Go-JSON row text in `texts` (no nulls): built
    from its columns' tokens where the row splits (`split_rows`), else from the row `decode` makes
    of it (which raises on a text that is no row). The records of each shape stay Arrow arrays and
    are put back in the texts' order with one take: no Python object per row but for rows encoded alone."""
    positions: list[np.ndarray] = []  # per group of records: the rows they belong to
    records: list[pa.Array] = []
    left = np.arange(len(texts), dtype=np.int64)  # the rows still without a record, ascending
    alone: list[int] = []  # rows whose own shape split nothing: encoded one by one
    for _ in range(MAX_SHAPES):
        if not len(left):
            break
        split = split_rows(texts.take(pa.array(left, pa.int64())))
        if split is None or not len(split.rows):  # its first row's shape split nothing (`{}`, nested too deep)
            alone.append(int(left[0]))
            left = left[1:]
            continue
        positions.append(left[split.rows])
        records.append(snapshot_records(split.names, split.columns))
        left = np.delete(left, split.rows)
    rest = np.sort(np.concatenate([np.array(alone, dtype=np.int64), left]))
    if len(rest):
        positions.append(rest)
        records.append(pa.array([snapshot_record(decode(text) or {}, key_fields)
                                 for text in texts.take(pa.array(rest, pa.int64())).to_pylist()], pa.binary()))
    if not records:
        return pa.array([], pa.binary())
    order = np.argsort(np.concatenate(positions), kind="stable")  # record i belongs at row positions[i]
    return pa.concat_arrays(records).take(pa.array(order, pa.int64()))


__all__ = ["MAX_SHAPES", "SplitRows", "snapshot_records_of_texts", "split_rows"]
