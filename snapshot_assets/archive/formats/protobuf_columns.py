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

Wire layout (proto3, deterministic): a record is `varint(len(m)) m`; `m` = `0x0a varint(len(s)) s`
(`SnapshotRow.row`, field 1); `s` is the Struct's map entries `0x0a varint(len(e)) e`, each
`e` = `0x0a varint(len(name)) name 0x12 varint(len(v)) v` (key field 1, value field 2).
"""

from __future__ import annotations

from collections.abc import Sequence

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
_FLOAT = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$"
_INT64_DIGITS = 18  # any integer of at most 18 digits fits an int64


def varints(lengths: np.ndarray) -> pa.Array:
    """Each non-negative integer of `lengths` as its protobuf varint (a binary array)."""
    values = lengths.astype(np.uint64)
    counts = np.ones(len(values), dtype=np.int64)
    for shift in (7, 14, 21, 28, 35, 42, 49, 56, 63):
        counts += values >= (np.uint64(1) << np.uint64(shift))
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


def value_bytes(tokens: pa.Array) -> pa.Array:
    """The `google.protobuf.Value` bytes of each Go-JSON value token in `tokens` (a string array
    without nulls), as `set_value(Value, gojson.loads(token))` serializes it."""
    count = len(tokens)
    done = np.zeros(count, dtype=bool)
    pieces: list[tuple[np.ndarray, pa.Array]] = []

    def spell(at: np.ndarray, encoded: pa.Array) -> None:
        pieces.append((at, encoded))
        done[at] = True

    for literal, encoded in (("null", _NULL), ("true", _TRUE), ("false", _FALSE)):
        at = _where(pc.equal(tokens, literal))
        if len(at):
            spell(at, _repeated(encoded, len(at)))
    strings = _where(pc.match_substring_regex(tokens, _PLAIN_STRING))
    if len(strings):
        spell(strings, _delimited(_STRING, pc.utf8_slice_codeunits(tokens.take(strings), 1, -1)
                                  .cast(pa.large_binary())))
    integer = pc.match_substring_regex(tokens, _INTEGER)
    integers = _where(pc.and_(integer, pc.less_equal(pc.utf8_length(tokens), _INT64_DIGITS)))
    if len(integers):
        exact = pc.cast(tokens.take(integers), pa.int64()).to_numpy()
        safe = np.abs(exact) <= MAX_SAFE_INT
        spell(integers[safe], _doubles(exact[safe].astype(np.float64)))
        # beyond ±2^53: the exact digits as a string (`protobuf._set_int`)
        spell(integers[~safe], _delimited(_STRING, tokens.take(integers[~safe]).cast(pa.large_binary())))
    floats = _where(pc.and_(pc.match_substring_regex(tokens, _FLOAT), pc.invert(integer)))
    if len(floats):
        spell(*_float_pieces(tokens, floats))
    rest = np.flatnonzero(~done)
    if len(rest):  # each distinct token once (a JSON column often repeats a few shapes)
        others = tokens.take(rest)
        distinct = pc.unique(others)
        typed = pa.array([_typed_value(t) for t in distinct.to_pylist()], pa.large_binary())
        spell(rest, typed.take(pc.index_in(others, value_set=distinct)))
    if not pieces:
        return pa.array([], pa.large_binary())
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


def snapshot_records(names: Sequence[str], columns: Sequence[pa.Array]) -> pa.Array:
    """The delimited `SnapshotRow` record of each row whose values are the Go-JSON tokens of
    `columns` (one string array per name in `names`, every row holding every column)."""
    entries: list[pa.Array] = []
    for j in _entry_order(names):
        name = gojson.valid_text(names[j]).encode("utf-8")
        key = bytes([_LEN]) + _varint(len(name)) + name + _VALUE
        entries.append(_delimited(bytes([_LEN]), _delimited(key, value_bytes(columns[j]))))
    struct = pc.binary_join_element_wise(*entries, pa.scalar(b"", pa.large_binary())) if entries else \
        pa.array([b""] * (len(columns[0]) if columns else 0), pa.large_binary())
    row = _delimited(bytes([_LEN]), struct)
    lengths = pc.binary_length(row).to_numpy(zero_copy_only=False)
    return pc.binary_join_element_wise(varints(lengths), row, pa.scalar(b"", pa.large_binary())).cast(pa.binary())


__all__ = ["snapshot_records", "value_bytes", "varints"]
