"""`google.protobuf.Struct` wire bytes straight from Python values, without building messages.

Why: every row that enters the archive is encoded once into its protobuf record (a snapshot's
`SnapshotRow`, a diff's `DiffChange`), and building a `Struct` message field by field through the
protobuf runtime, then serializing it, is per-row Python on a path as long as the changes. Writing
the same bytes directly (varints, tags and little-endian doubles, joined once per message) took a
snapshot record of the benchmark table's 8 columns from 25 to 18 µs, measured side by side in one
process; Python's own call overhead is the floor here, not the wire format.

The bytes are exactly what `protobuf.fill_row` / `set_value` followed by
`SerializeToString(deterministic=True)` produce (the oracle tests/archive/test_struct_wire.py holds
this module to, with generated values):

- proto3 wire format; a `Value` sets exactly one member of its `kind` oneof, which is written even
  when it holds its type's default (`number_value` 0.0, `bool_value` false, an empty list);
- a map entry is always `key` (field 1) then `value` (field 2), both written;
- deterministic serialization sorts a Struct's entries by the bytes of their keys, except that a
  key comes after the keys it is a prefix of (`"ab"` before `"a"`, `""` last);
- the value mapping is `protobuf.set_value`'s (module docstring of protobuf.py): an integer beyond
  ±2^53 is a `string_value` of its digits, bytes base64, times RFC 3339, Decimal its text.

What this module does not spell the same way (a lone surrogate in a key or a string, which the
runtime replaces and may merge with another key) it hands back to the runtime: `encode_struct`
raises `NotPlain`, and the callers in protobuf.py encode that row through the message classes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from snapshot_assets.archive import gojson
from snapshot_assets.archive.gojson import MAX_SAFE_INT, Kind, UnsupportedValue

_DOUBLE = struct.Struct("<d").pack
_NULL = b"\x08\x00"  # null_value (field 1, varint) = NULL_VALUE
_TRUE, _FALSE = b"\x20\x01", b"\x20\x00"  # bool_value (field 4, varint)
_NUMBER = b"\x11"  # number_value (field 2, fixed64)
_STRING = b"\x1a"  # string_value (field 3, length-delimited)
_STRUCT = b"\x2a"  # struct_value (field 5)
_LIST = b"\x32"  # list_value (field 6)
_FIELD_1 = b"\x0a"  # field 1, length-delimited: a Struct's entry, an entry's key, a ListValue's item
_FIELD_2 = b"\x12"  # field 2, length-delimited: an entry's value


#: Appended to each key's bytes for sorting: upb writes a key after every key it is a prefix of (its
#: sorter compares the common prefix, then the lengths, and it encodes backwards), and UTF-8 never
#: holds the byte 0xFF, so this ranks a prefix after its extensions and leaves other pairs as memcmp.
_AFTER_ANY_BYTE = b"\xff"


class NotPlain(Exception):
    """A key or string this module does not spell like the runtime (a lone surrogate)."""


_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))  # the varints of 0..127: most lengths in a row


def varint(n: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_ONE_BYTE[n] if n < 0x80 else varint(n)) + payload


def encode_text(text: str) -> bytes:
    """A string field's bytes (UTF-8); NotPlain for a lone surrogate, which the runtime replaces."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotPlain from None


def _string(text: str) -> bytes:
    return _delimited(_STRING, encode_text(text))


def _int(value: int) -> bytes:
    if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        return _NUMBER + _DOUBLE(float(value))
    return _string(gojson.int_text(value))


def _float(value: float) -> bytes:
    if not math.isfinite(value):
        gojson.kind_of(value)  # raises: NaN and ±Infinity are refused, as set_value refuses them
    return _NUMBER + _DOUBLE(value)


def _list(items: Iterable[Any]) -> bytes:
    return _delimited(_LIST, b"".join(_delimited(_FIELD_1, value_bytes(item)) for item in items))


def _object(obj: Mapping[Any, Any]) -> bytes:
    return _delimited(_STRUCT, encode_struct(gojson.object_items(obj)))


_BY_TYPE: dict[type, Callable[[Any], bytes]] = {
    type(None): lambda _value: _NULL,
    bool: lambda value: _TRUE if value else _FALSE,
    int: _int,
    float: _float,
    str: _string,
    dict: _object,
    list: _list,
    tuple: _list,
}

_BY_KIND: dict[Kind, Callable[[Any], bytes]] = {
    Kind.NULL: _BY_TYPE[type(None)],
    Kind.BOOL: lambda value: _TRUE if bool(value) else _FALSE,
    Kind.INT: lambda value: _int(int(value)),
    Kind.FLOAT: lambda value: _NUMBER + _DOUBLE(float(value)),
    Kind.STRING: lambda value: _string(str(value)),
    Kind.BYTES: lambda value: _string(gojson.bytes_text(value)),
    Kind.DATETIME: lambda value: _string(gojson.time_text(value)),
    Kind.DATE: lambda value: _string(gojson.date_text(value)),
    Kind.DECIMAL: lambda value: _string(gojson.decimal_text(value)),
    Kind.OBJECT: _object,
    Kind.ARRAY: _list,
}


def value_bytes(value: Any) -> bytes:
    """The serialized `google.protobuf.Value` of `value` (`protobuf.set_value`'s mapping)."""
    kind = type(value)
    if kind is str:  # the usual kinds first, without a call each (this runs for every cell)
        try:
            text: bytes = value.encode("utf-8")
        except UnicodeEncodeError:
            raise NotPlain from None
        n = len(text)
        return _STRING + (_ONE_BYTE[n] if n < 0x80 else varint(n)) + text
    if kind is int and -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        return _NUMBER + _DOUBLE(value)
    if kind is float and math.isfinite(value):
        return _NUMBER + _DOUBLE(value)
    encode = _BY_TYPE.get(kind)
    if encode is not None:
        return encode(value)
    return _BY_KIND[gojson.kind_of(value)](value)  # subclasses, bytes, times, Decimal; refuses the rest


def encode_struct(items: Iterable[tuple[str, Any]], at: list[str] | None = None) -> bytes:
    """The serialized `google.protobuf.Struct` of (key, value) pairs: its entries in key-byte order.
    `at` (one item) is set to each key before its value is encoded, so that a caller catching an
    UnsupportedValue can name the member it came from."""
    entries: list[tuple[bytes, bytes]] = []
    for key, value in items:
        if at is not None:
            at[0] = key
        v = value_bytes(value)
        try:
            k = key.encode("utf-8")
        except UnicodeEncodeError:
            raise NotPlain from None
        lk, lv = len(k), len(v)
        if lk < 0x80 and lv < 0x80:
            entry = _FIELD_1 + _ONE_BYTE[lk] + k + _FIELD_2 + _ONE_BYTE[lv] + v
        else:
            entry = _delimited(_FIELD_1, k) + _delimited(_FIELD_2, v)
        entries.append((k + _AFTER_ANY_BYTE, _delimited(_FIELD_1, entry)))
    entries.sort()
    return b"".join([entry for _, entry in entries])


def row_struct(row: Mapping[str, Any], row_key: Callable[[], str]) -> bytes:
    """`encode_struct` of a whole row: a value that cannot be stored names its column and row, as
    `protobuf.fill_row` does (the last column reached when the row's keys themselves are refused)."""
    at = [""]
    try:
        return encode_struct(gojson.object_items(row), at)
    except UnsupportedValue as exc:
        raise exc.in_row(str(at[0]), row_key()) from None


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field `number` (a message's string or sub-message) holding `payload`."""
    return _delimited(varint(number << 3 | 2), payload)


__all__ = ["NotPlain", "encode_struct", "encode_text", "field", "row_struct", "value_bytes", "varint"]
