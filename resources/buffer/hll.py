"""A small mergeable HyperLogLog sketch: "how many distinct keys changed since P" without the keys.

Why a sketch and not a count: the trigger policy's churn rule needs the number of *distinct* keys
touched in a window that spans many segments. Per-segment counts cannot be summed (a hot key
changed in every segment would be counted once per segment), and a per-segment key set grows with
the table. An HLL register array is fixed-size, and the union of two sets is the register-wise max
of their sketches, so "distinct keys since P" is a merge of the segments after P, read from the
index in milliseconds.

Precision 12 (4096 one-byte registers, standard error 1.04/sqrt(4096) ≈ 1.6%); the hash is the first
64 bits of BLAKE2b, so the estimate is deterministic across processes and machines (unlike Python's
salted `hash`). Small cardinalities use linear counting, as in HLL++, which is exact-ish for the
tiny segments a 1 s seal produces.

Serialised form (`to_text`): base64 of zlib of one mode byte plus either every register (dense)
or (index, rank) pairs of the non-zero ones (sparse, chosen when smaller): a segment that touched
50 keys costs a few hundred bytes in the index, not 4 KB.
"""

from __future__ import annotations

import base64
import hashlib
import math
import zlib
from collections.abc import Iterable

PRECISION = 12
REGISTERS = 1 << PRECISION
_HASH_BITS = 64
_TAIL_BITS = _HASH_BITS - PRECISION
_TAIL_MASK = (1 << _TAIL_BITS) - 1
_ALPHA = 0.7213 / (1 + 1.079 / REGISTERS)
_DENSE, _SPARSE = b"D", b"S"


def _hash64(item: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(item, digest_size=8).digest(), "big")


class HyperLogLog:
    """A HyperLogLog sketch with `REGISTERS` one-byte registers."""

    __slots__ = ("_registers",)

    def __init__(self, registers: bytes | bytearray | None = None) -> None:
        if registers is not None and len(registers) != REGISTERS:
            raise ValueError(f"a sketch has {REGISTERS} registers, got {len(registers)}")
        self._registers = bytearray(registers) if registers is not None else bytearray(REGISTERS)

    def add(self, item: str) -> None:
        """Add one item (a canonical key string)."""
        h = _hash64(item.encode("utf-8"))
        index = h >> _TAIL_BITS
        rank = _TAIL_BITS - (h & _TAIL_MASK).bit_length() + 1
        if rank > self._registers[index]:
            self._registers[index] = rank

    def update(self, items: Iterable[str]) -> None:
        for item in items:
            self.add(item)

    def merge(self, other: HyperLogLog) -> None:
        """Union in place: afterwards this sketch estimates |self ∪ other|."""
        self._registers[:] = bytes(map(max, self._registers, other._registers))

    def merge_text(self, text: str) -> None:
        """Union with a serialised sketch without materialising it (fast for sparse ones)."""
        mode, payload = _decode(text)
        regs = self._registers
        if mode == _DENSE:
            regs[:] = bytes(map(max, regs, payload))
            return
        for i in range(0, len(payload), 3):
            index = (payload[i] << 8) | payload[i + 1]
            if payload[i + 2] > regs[index]:
                regs[index] = payload[i + 2]

    def estimate(self) -> int:
        """The estimated number of distinct items added (rounded)."""
        regs = self._registers
        zeros = regs.count(0)
        raw = _ALPHA * REGISTERS * REGISTERS / math.fsum(2.0 ** -r for r in regs)
        if raw <= 2.5 * REGISTERS and zeros:
            return round(REGISTERS * math.log(REGISTERS / zeros))
        return round(raw)

    def is_empty(self) -> bool:
        return not any(self._registers)

    def to_text(self) -> str:
        """Compact ASCII form for JSON (the index) and Parquet key-value metadata."""
        nonzero = [(i, r) for i, r in enumerate(self._registers) if r]
        if 3 * len(nonzero) < REGISTERS:
            payload = bytearray(_SPARSE)
            for index, rank in nonzero:
                payload += bytes((index >> 8, index & 0xFF, rank))
        else:
            payload = bytearray(_DENSE) + self._registers
        return base64.b64encode(zlib.compress(bytes(payload), 6)).decode("ascii")

    @classmethod
    def from_text(cls, text: str) -> HyperLogLog:
        sketch = cls()
        sketch.merge_text(text)
        return sketch


def _decode(text: str) -> tuple[bytes, bytes]:
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"not a serialised HyperLogLog sketch: {exc}") from None
    mode, payload = raw[:1], raw[1:]
    if mode == _DENSE and len(payload) == REGISTERS:
        return mode, payload
    if mode == _SPARSE and len(payload) % 3 == 0 and all(b < REGISTERS >> 8 for b in payload[::3]):
        return mode, payload
    raise ValueError("not a serialised HyperLogLog sketch: bad mode or length")
