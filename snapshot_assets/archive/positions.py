"""Source positions: PostgreSQL LSNs and the comparators opaque positions are ordered by.

Positions are strings on the wire and are never re-formatted: manifest chains link artifacts by
exact string equality. Ordering is only needed to choose snapshots and bound as-of reads, and it
depends on the source, so the reader takes a comparator chosen by the source type.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Comparator = Callable[[str, str], int]

_MAX_HALF = 0xFFFFFFFF


_LSN = re.compile(r"([0-9A-Fa-f]+)/([0-9A-Fa-f]+)")


def parse_lsn(text: str) -> int | None:
    """Parse `HI/LO` (hex halves, case-insensitive, each at most 32 bits) to a 64-bit int.

    Returns None for anything unparseable (including ""): such positions sort lowest, as laredo's do.
    Bare hex digits only (`int(x, 16)` alone would also take `0x`, `_` and signs).
    """
    m = _LSN.fullmatch(text)
    if m is None:
        return None
    hi, lo = int(m.group(1), 16), int(m.group(2), 16)
    if hi > _MAX_HALF or lo > _MAX_HALF:
        return None
    return (hi << 32) | lo


def format_lsn(value: int) -> str:
    """Format a 64-bit LSN as PostgreSQL does: `%X/%08X`."""
    if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"LSN out of range: {value}")
    return f"{value >> 32:X}/{value & _MAX_HALF:08X}"


def compare_lsn(a: str, b: str) -> int:
    """Order two LSN strings; unparseable or empty strings sort lowest (and equal to each other)."""
    pa, pb = parse_lsn(a), parse_lsn(b)
    ka = -1 if pa is None else pa
    kb = -1 if pb is None else pb
    return (ka > kb) - (ka < kb)


def compare_sequence(a: str, b: str) -> int:
    """Order decimal sequence numbers (a source without LSNs, and laredo's own test positions).

    Unparseable strings sort lowest, like LSNs.
    """

    def key(s: str) -> int:
        return int(s) if s.isdigit() else -1

    ka, kb = key(a), key(b)
    return (ka > kb) - (ka < kb)


def compare_bytes(a: str, b: str) -> int:
    """Order positions by their UTF-8 bytes: for sources whose positions are fixed-width strings."""
    ba, bb = a.encode(), b.encode()
    return (ba > bb) - (ba < bb)


COMPARATORS: dict[str, Comparator] = {
    "lsn": compare_lsn,
    "sequence": compare_sequence,
    "bytes": compare_bytes,
}


def comparator(name: str) -> Comparator:
    """The comparator registered under `name` (`lsn`, `sequence`, `bytes`)."""
    try:
        return COMPARATORS[name]
    except KeyError:
        raise ValueError(f"unknown position ordering {name!r}; expected one of "
                         f"{', '.join(sorted(COMPARATORS))}") from None
