"""An order-preserving binary encoding of a typed key: the key the state's buckets are ranges of.

Why bytes: Spark compares BINARY values byte by byte (unsigned), so one `sk` column lets the
range partitioner, the bucket boundaries and the sort inside a bucket all run in the JVM on any
key shape: one integer, a string, a composite key, integers beyond 2^63. The canonical key JSON
(`effects.key_json`) groups keys but does not order them (`[10]` sorts before `[9]`).

Why ranges of it: many OLTP tables change mostly their newest rows (ascending ids, snowflake ids,
time-ordered keys). Under range bucketing those changes land in the last few buckets and a re-base
rewrites only those; under hash bucketing every bucket would receive some of them.

The order is total and deterministic over the values keys hold (null < bool < int < float <
string < anything else, each kind in its natural order); it only needs to agree with itself:
bucket boundaries are `sk` values taken from the data.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapshot_assets.archive import gojson

_NULL, _BOOL, _INT, _FLOAT, _STR, _OTHER = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05


def _escaped(data: bytes) -> bytes:
    """`data` with 0x00 escaped as 0x00 0xFF and a 0x00 0x00 terminator, so a shorter string sorts
    before every string it is a prefix of, also inside a composite key."""
    return data.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def _int(value: int) -> bytes:
    """Two's-complement-free, length-prefixed: more magnitude bytes sort later for positives and
    earlier for negatives; integers of any size keep their order."""
    if value >= 0:
        body = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
        return bytes([0x80 + len(body)]) + body
    magnitude = -value
    size = max(1, (magnitude.bit_length() + 7) // 8)
    body = ((1 << (8 * size)) - magnitude).to_bytes(size, "big")  # larger magnitude -> smaller bytes
    return bytes([0x7F - size]) + body


def _float(value: float) -> bytes:
    bits = struct.unpack(">Q", struct.pack(">d", value))[0]
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return int(bits).to_bytes(8, "big")


def _part(value: Any) -> bytes:
    if value is None:
        return bytes([_NULL])
    if isinstance(value, bool):
        return bytes([_BOOL, int(value)])
    if isinstance(value, int):
        return bytes([_INT]) + _int(value)
    if isinstance(value, float):
        return bytes([_FLOAT]) + _float(value)
    if isinstance(value, str):
        return bytes([_STR]) + _escaped(value.encode("utf-8", "surrogatepass"))
    return bytes([_OTHER]) + _escaped(gojson.dumps(value).encode("utf-8"))


def sort_key(values: Sequence[Any]) -> bytes:
    """The sort key of a typed key (the values of the key fields, in order)."""
    return b"".join(_part(v) for v in values)


def sort_key_of(key_json: str) -> bytes:
    """The sort key of a canonical key JSON (`[v1, v2, ...]`, the state's and buffer's `key`)."""
    inner = key_json[1:-1]
    if inner.isascii() and (inner.isdigit() or (inner[:1] == "-" and inner[1:].isdigit())):  # one integer key
        return bytes([_INT]) + _int(int(inner))
    values = gojson.loads(key_json)
    if not isinstance(values, list):
        raise ValueError(f"a key must be a JSON array of the key values, got {key_json[:80]!r}")
    return sort_key(values)


# --- a column of keys at once ------------------------------------------------------------------------

_BYTE_STEPS = np.array([1 << (8 * k) for k in range(1, 8)], dtype=np.uint64)


def _magnitude_bytes(magnitude: np.ndarray) -> np.ndarray:
    """How many big-endian bytes each uint64 magnitude needs (at least one), as `_int` counts them."""
    size: np.ndarray = 1 + (magnitude[:, None] >= _BYTE_STEPS[None, :]).sum(axis=1)
    return size


def _int64_sort_keys(values: np.ndarray) -> pa.Array:
    """`sort_key_of("[v]")` of each int64 `v`, built with numpy: a table-sized key column never
    crosses Python row by row. The bytes are `_INT`, the length byte and the body of `_int`."""
    negative = values < 0
    magnitude = np.where(negative, np.uint64(0) - values.astype(np.uint64), values.astype(np.uint64))
    size = _magnitude_bytes(magnitude)
    shift = (8 * size).astype(np.uint64)
    full = size == 8  # 256**8 does not fit: 2**64 - m is -m in wrapping uint64 arithmetic
    complement = np.where(full, np.uint64(0) - magnitude,
                          (np.uint64(1) << np.where(full, np.uint64(0), shift)) - magnitude)
    body = np.where(negative, complement, magnitude)
    rows = np.empty((len(values), 10), dtype=np.uint8)
    rows[:, 0] = _INT
    rows[:, 1] = np.where(negative, 0x7F - size, 0x80 + size)
    rows[:, 2:] = body.astype(">u8").view(np.uint8).reshape(-1, 8)
    keep = np.ones((len(values), 10), dtype=bool)
    keep[:, 2:] = np.arange(8)[None, :] >= (8 - size)[:, None]
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(2 + size, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(rows[keep])])


def sort_keys(keys: pa.Array) -> pa.Array:
    """`sort_key_of` of every canonical key JSON of a string column, as a binary column. A column of
    keys of one int64 integer each (the common primary key) takes a vectorized path; any other
    column goes key by key through `sort_key_of`, so the rule stays the one above."""
    if keys.null_count:
        raise ValueError("a key column holds nulls")
    numbers = _one_int64_each(keys)
    if numbers is not None:
        return _int64_sort_keys(numbers)
    return pa.array([sort_key_of(key) for key in keys.to_pylist()], pa.binary())


def _one_int64_each(keys: pa.Array) -> np.ndarray | None:
    """The integers of keys that are all `[<int64>]` in canonical form, else None."""
    if not len(keys):
        return None
    try:
        numbers = pc.cast(pc.utf8_slice_codeunits(keys, 1, -1), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # not an integer, or beyond int64
        return None
    canonical = pc.binary_join_element_wise("[", pc.cast(numbers, pa.string()), "]", "")
    if not pc.all(pc.equal(canonical, keys)).as_py():  # not "[<digits>]" as written: "[-0]", "[+7]", "[07]"
        return None
    values: np.ndarray = numbers.to_numpy(zero_copy_only=False)
    return values
