"""Protobuf snapshot records of a batch of rows given column by column, as Go-JSON value tokens.

Why: a protobuf snapshot holds one delimited `SnapshotRow` per row, and the archive encodes each row
once, when it enters (the state keeps the record beside the jsonl text). Building that record in
Python (decode the row's JSON, fill a `Struct`, serialize it) costs about 20 µs a row, which for an
initial copy is the whole table. A copied row is already split into columns of Go-JSON value
tokens (`text_columns`), so here its record is assembled from those columns with Arrow kernels and
numpy: each token becomes the bytes of its `google.protobuf.Value`, each column the bytes of its map
entry, and each row the concatenation of its entries in the order the protobuf runtime's
deterministic serialization writes them (`_entry_order`).

The record is exactly `protobuf.snapshot_record(decode_row(text))` of the row's jsonl text: the
oracle the property tests hold this module to, byte for byte. The kernels take the tokens whose
value they spell exactly:

- `null`, `true`, `false`;
- a string without escapes (Go's encoder escapes `"`, `\\`, control characters, `<`, `>`, `&`,
  U+2028 and U+2029, so what it leaves unescaped is the string itself): `string_value`;
- a canonical integer: `number_value` within ±2^53, else `string_value` of its digits (the archive
  never rounds an integer into a double);
- a decimal fraction or exponent form: `number_value` of the correctly rounded double.

Any other token (nested JSON, escaped strings, `-0`) is decoded by the archive's own JSON reader and
set by `protobuf.set_value`, one value at a time.

Telling the tokens apart costs more than spelling them (a regular expression over every token of a
column, several times): a caller that made the tokens with kernels of its own knows their kind
already (`KnownTokens`: a copy's text column is plain strings, its integer column canonical
integers), and those rows skip the classification. On the benchmark table's 8 columns that took
the Value bytes of 268,000 rows from 0.60-0.81 s to about 0.3 s.

Each record is written by one join of all its pieces (tags, varints computed from the lengths,
key bytes, values), not a join per nesting level, so each byte is copied once.

Wire layout (proto3, deterministic): a record is `varint(len(m)) m`; `m` = `0x0a varint(len(s)) s`
(`SnapshotRow.row`, field 1); `s` is the Struct's map entries `0x0a varint(len(e)) e`, each
`e` = `0x0a varint(len(name)) name 0x12 varint(len(v)) v` (key field 1, value field 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import struct_pb2

from snapshot_assets.archive import gojson
from snapshot_assets.archive.formats.protobuf import _varint, set_value
from snapshot_assets.archive.gojson import MAX_SAFE_INT

_LEN = 0x0A  # field 1, wire type LEN: SnapshotRow.row, a Struct's map entry, an entry's key
_VALUE = b"\x12"  # field 2, wire type LEN: an entry's value
_NULL, _TRUE, _FALSE = b"\x08\x00", b"\x20\x01", b"\x20\x00"  # null_value (1), bool_value (4)
_NUMBER, _STRING = b"\x11", b"\x1a"  # number_value (2, fixed64), string_value (3, LEN)

_PLAIN_STRING = r'^"[^"\\]*"$'
_INTEGER = r"^(0|-?[1-9][0-9]*)$"
_FLOAT = rf"^{gojson.NUMBER_TOKEN}$"
#: An integer token of at most this many characters (sign included) fits an int64: Arrow casts it exactly.
INT64_SAFE_CHARS = 18


class TokenKind(Enum):
    """What kind of Go-JSON token every row of a `KnownTokens` holds."""

    PLAIN_STRING = "plain string"  # a string token without escapes: `"` + its text + `"`
    INTEGER = "integer"  # a canonical integer token: `0` or `-?[1-9][0-9]*`
    BOOL = "bool"  # `true` or `false`


@dataclass(frozen=True, slots=True)
class KnownTokens:
    """The rows of a token column whose kind the caller already knows (true in `rows`, a boolean
    array): they are spelled without being classified. Any other row is classified as usual."""

    kind: TokenKind
    rows: pa.Array


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """The bytes of each non-negative integer's varint (`varints` without writing them)."""
    sizes = np.ones(len(values), dtype=np.int64)
    for shift in (7, 14, 21, 28, 35, 42, 49, 56, 63):
        sizes += values >= (1 << shift)
    return sizes


def varints(lengths: np.ndarray) -> pa.Array:
    """Each non-negative integer of `lengths` as its protobuf varint (a binary array)."""
    if len(lengths) and int(lengths.max()) < 0x80:  # the usual column: one byte each, the value itself
        offsets = np.arange(len(lengths) + 1, dtype=np.int64)
        data = lengths.astype(np.uint8)
        return pa.Array.from_buffers(pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    values = lengths.astype(np.uint64)
    counts = _varint_sizes(lengths.astype(np.int64))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    data = np.zeros(int(offsets[-1]), dtype=np.uint8)
    for k in range(int(counts.max()) if len(counts) else 0):
        at = counts > k
        byte = (values[at] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (counts[at] > k + 1).astype(np.uint64) << np.uint64(7)
        data[offsets[:-1][at] + k] = (byte | more).astype(np.uint8)
    return pa.Array.from_buffers(pa.large_binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _delimited(field: bytes, payload: pa.Array) -> pa.Array:
    """`field varint(len(payload)) payload` for each value of the binary array `payload`."""
    lengths = pc.binary_length(payload).to_numpy(zero_copy_only=False)
    return pc.binary_join_element_wise(pa.scalar(field, pa.large_binary()), varints(lengths), payload,
                                       pa.scalar(b"", pa.large_binary()))


def _doubles(values: np.ndarray) -> pa.Array:
    """`number_value` Value bytes of float64 `values` (fixed64, little-endian)."""
    raw = np.ascontiguousarray(values, dtype="<f8").view(np.uint8)
    fixed = pa.Array.from_buffers(pa.binary(8), len(values), [None, pa.py_buffer(raw)])
    return pc.binary_join_element_wise(pa.scalar(_NUMBER, pa.large_binary()), fixed.cast(pa.large_binary()),
                                       pa.scalar(b"", pa.large_binary()))


def _typed_value(token: str) -> bytes:
    """The Value bytes of one token through the typed path (decode, `set_value`, serialize)."""
    value = struct_pb2.Value()
    set_value(value, gojson.loads(token))
    return value.SerializeToString(deterministic=True)


def _where(mask: pa.Array) -> np.ndarray:
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def _repeated(value: bytes, count: int) -> pa.Array:
    return pa.array([value], pa.large_binary()).take(np.zeros(count, dtype=np.int64))


def _float_pieces(tokens: pa.Array, at: np.ndarray) -> tuple[np.ndarray, pa.Array]:
    """The tokens at `at` (fractions, exponent forms) this kernel spells: finite, non-zero (the
    typed path keeps the sign of a zero its own way), and parsed by Arrow (correctly rounded)."""
    try:
        parsed = pc.cast(tokens.take(at), pa.float64()).to_numpy()
    except pa.ArrowInvalid:
        return at[:0], pa.array([], pa.large_binary())
    spelled = np.isfinite(parsed) & (parsed != 0)
    return at[spelled], _doubles(parsed[spelled])


_Pieces = list[tuple[np.ndarray, pa.Array]]  # (rows, their Value bytes)


def _plain_strings(tokens: pa.Array, at: np.ndarray) -> _Pieces:
    """`string_value` of the string tokens at `at`, which hold no escapes: the text between the quotes."""
    return [(at, _delimited(_STRING, pc.utf8_slice_codeunits(tokens.take(at), 1, -1).cast(pa.large_binary())))]


def _integers(tokens: pa.Array, at: np.ndarray) -> _Pieces:
    """The canonical integer tokens at `at`: `number_value` within ±2^53, else `string_value` of the
    digits (`protobuf._set_int`). A token longer than `INT64_SAFE_CHARS` is past 2^53."""
    chosen = tokens.take(at)
    short = pc.less_equal(pc.utf8_length(chosen), INT64_SAFE_CHARS).to_numpy(zero_copy_only=False)
    exact = pc.cast(chosen.filter(short), pa.int64()).to_numpy()
    safe = np.abs(exact) <= MAX_SAFE_INT
    at_short = at[short]
    digits = np.concatenate([at_short[~safe], at[~short]])
    return [(at_short[safe], _doubles(exact[safe].astype(np.float64))),
            (digits, _delimited(_STRING, tokens.take(digits).cast(pa.large_binary())))]


def _bools(tokens: pa.Array, at: np.ndarray) -> _Pieces:
    true = pc.equal(tokens.take(at), "true")
    return [(at, pc.if_else(true, pa.scalar(_TRUE, pa.large_binary()), pa.scalar(_FALSE, pa.large_binary())))]


_SPELL_KNOWN = {TokenKind.PLAIN_STRING: _plain_strings, TokenKind.INTEGER: _integers, TokenKind.BOOL: _bools}


def _classified(tokens: pa.Array) -> _Pieces:
    """The Value bytes of every token, each kind of token told apart by its spelling."""
    pieces: _Pieces = []
    done = np.zeros(len(tokens), dtype=bool)

    def spell(found: _Pieces) -> None:
        for at, encoded in found:
            pieces.append((at, encoded))
            done[at] = True

    for literal, encoded in (("null", _NULL), ("true", _TRUE), ("false", _FALSE)):
        at = _where(pc.equal(tokens, literal))
        if len(at):
            spell([(at, _repeated(encoded, len(at)))])
    strings = _where(pc.match_substring_regex(tokens, _PLAIN_STRING))
    if len(strings):
        spell(_plain_strings(tokens, strings))
    integer = pc.match_substring_regex(tokens, _INTEGER)
    integers = _where(integer)
    if len(integers):
        spell(_integers(tokens, integers))
    floats = _where(pc.and_(pc.match_substring_regex(tokens, _FLOAT), pc.invert(integer)))
    if len(floats):
        spell([_float_pieces(tokens, floats)])
    rest = np.flatnonzero(~done)
    if len(rest):  # each distinct token once (a JSON column often repeats a few shapes)
        others = tokens.take(rest)
        distinct = pc.unique(others)
        typed = pa.array([_typed_value(t) for t in distinct.to_pylist()], pa.large_binary())
        spell([(rest, typed.take(pc.index_in(others, value_set=distinct)))])
    return pieces


def value_bytes(tokens: pa.Array, known: KnownTokens | None = None) -> pa.Array:
    """The `google.protobuf.Value` bytes of each Go-JSON value token in `tokens` (a string array
    without nulls), as `set_value(Value, gojson.loads(token))` serializes it. The rows `known`
    names are spelled as its kind without being classified."""
    count = len(tokens)
    pieces: _Pieces = []
    rest = np.arange(count)
    if known is not None:
        at = _where(known.rows)
        if len(at):
            pieces += _SPELL_KNOWN[known.kind](tokens, at)
            rest = np.flatnonzero(~known.rows.to_numpy(zero_copy_only=False))
    if len(rest) == count:
        pieces += _classified(tokens)
    elif len(rest):
        pieces += [(rest[at], encoded) for at, encoded in _classified(tokens.take(rest))]
    pieces = [(at, encoded) for at, encoded in pieces if len(at)]
    if not pieces:
        return pa.array([], pa.large_binary())
    if len(pieces) == 1:  # every row, in order (each piece's rows ascend)
        return pieces[0][1]
    positions = np.concatenate([at for at, _ in pieces])
    order = np.empty(count, dtype=np.int64)
    order[positions] = np.arange(count)
    return pa.concat_arrays([encoded for _, encoded in pieces]).take(order)


def _entry_order(names: Sequence[str]) -> list[int]:
    """The order (indices into `names`) in which the protobuf runtime's deterministic serialization
    writes a Struct's entries: asked of the runtime itself, once per batch, because it is the
    runtime's and not plain sorting (upb writes a key that is a prefix of another after it)."""
    keys = [gojson.valid_text(name).encode("utf-8") for name in names]
    probe = struct_pb2.Struct()
    for key in keys:
        probe.fields[key.decode("utf-8")].null_value = struct_pb2.NULL_VALUE
    data, at, written = probe.SerializeToString(deterministic=True), 0, []
    while at < len(data):  # each entry: 0x0a len(entry) 0x0a len(key) key 0x12 ...; names are < 2^14 bytes
        size, at = _read_varint(data, at + 1)
        key_size, key_at = _read_varint(data, at + 1)
        written.append(data[key_at:key_at + key_size])
        at += size
    return [keys.index(key) for key in written]


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def snapshot_records(names: Sequence[str], columns: Sequence[pa.Array],
                     known: Sequence[KnownTokens | None] = ()) -> pa.Array:
    """The delimited `SnapshotRow` record of each row whose values are the Go-JSON tokens of
    `columns` (one string array per name in `names`, every row holding every column); `known[j]`,
    when given, names the rows of `columns[j]` whose kind is known (`value_bytes`)."""
    rows = len(columns[0]) if columns else 0
    tag = pa.scalar(bytes([_LEN]), pa.large_binary())
    pieces: list[pa.Array | pa.Scalar] = []
    struct_size = np.zeros(rows, dtype=np.int64)
    for j in _entry_order(names):
        name = gojson.valid_text(names[j]).encode("utf-8")
        key = bytes([_LEN]) + _varint(len(name)) + name + _VALUE
        value = value_bytes(columns[j], known[j] if known else None)
        value_size = pc.binary_length(value).to_numpy(zero_copy_only=False).astype(np.int64)
        entry_size = len(key) + _varint_sizes(value_size) + value_size
        # an entry: 0x0a varint(len(entry)) key-bytes varint(len(value)) value
        pieces += [tag, varints(entry_size), pa.scalar(key, pa.large_binary()), varints(value_size), value]
        struct_size += 1 + _varint_sizes(entry_size) + entry_size
    message_size = 1 + _varint_sizes(struct_size) + struct_size
    # a record: varint(len(message)) 0x0a varint(len(struct)) entries...
    record = pc.binary_join_element_wise(varints(message_size), tag, varints(struct_size), *pieces,
                                         pa.scalar(b"", pa.large_binary()))
    return record.cast(pa.binary())


__all__ = ["INT64_SAFE_CHARS", "KnownTokens", "TokenKind", "snapshot_records", "value_bytes", "varints"]
