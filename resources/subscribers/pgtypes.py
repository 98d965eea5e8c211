"""PostgreSQL text values → row values that keep fidelity, one converter per type OID.

Both the initial copy and the replication stream receive every value as the text its type's
output function writes, and both convert it here, by type OID, so a value has one representation
whether it arrived in the snapshot or in a change. The text form is only stable under fixed session
settings, so every connection of the source runs with `SESSION_SETTINGS`.

Mapping (what a reader of the archive gets):
- int2/int4/int8/oid → `int` (exact beyond 2^53); numeric → its decimal string, digits untouched
  (also 'NaN' and '±Infinity').
- float4/float8 → `float`, except NaN/Infinity/-Infinity, which stay the strings 'NaN',
  'Infinity', '-Infinity': JSON and the archive formats cannot encode them as numbers.
- bool → `bool`; bytea → base64 string; json/jsonb → nested values (`json.loads`: integers exact,
  fractions as float).
- timestamptz → RFC 3339 in UTC ('2024-05-01T12:00:00.5Z'); timestamp → the same without an offset
  ('2024-05-01T12:00:00.5': it has none to give); date → 'YYYY-MM-DD'. 'infinity', '-infinity' and
  BC values stay PostgreSQL's text, since RFC 3339 has no spelling for them.
- arrays → (nested) lists with converted elements; an array printed with explicit bounds
  ('[0:1]={1,2}') or a vector type that is not brace-delimited stays its text.
- domains convert as their base type; everything else (text, varchar, uuid, enums, time, interval,
  inet, composites, ranges, ...) → the text as PostgreSQL prints it. NULL → None.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

Converter = Callable[[str], Any]

# Applied to every connection (query and walsender) through libpq's `options`: the output functions
# read these settings, so the snapshot and the stream must run under identical values.
SESSION_SETTINGS: Final[dict[str, str]] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",  # shortest round-trip text for floats (the PostgreSQL 12+ default)
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}


@dataclass(frozen=True, slots=True)
class PgType:
    """What the converter needs to know about a type that is not built in (from `pg_type`).

    `kind` is `typtype` ('b' base, 'd' domain, 'e' enum, 'c' composite, 'r' range, ...);
    `base_oid` is a domain's base type; `element_oid` is set only for varlena arrays.
    """

    oid: int
    name: str
    kind: str
    base_oid: int = 0
    element_oid: int = 0


TypeLookup = Callable[[int], "PgType | None"]

#: How a `TypeLookup` describes an OID from the catalog (one parameter: the OID); `pg_type_of` reads
#: its row. The source resolves the types it reads with it, a restore the types it writes.
PG_TYPE_QUERY: Final = ("SELECT typname, typtype, typbasetype, "
                        "CASE WHEN typcategory = 'A' AND typlen = -1 THEN typelem ELSE 0 END "
                        "FROM pg_type WHERE oid = %s")


def pg_type_of(oid: int, row: tuple[Any, ...] | None) -> PgType | None:
    """The `PgType` of a `PG_TYPE_QUERY` answer row (None: no such type)."""
    if row is None:
        return None
    name, kind, base, element = row
    return PgType(oid=oid, name=name, kind=kind, base_oid=base, element_oid=element)

_FLOAT_SPECIALS: Final = frozenset({"NaN", "Infinity", "-Infinity"})
_UTC_OFFSET = re.compile(r"([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?$")


def to_text(text: str) -> str:
    return text


def to_int(text: str) -> int:
    return int(text)


def to_bool(text: str) -> bool:
    if text == "t":
        return True
    if text == "f":
        return False
    raise ValueError(f"not a PostgreSQL boolean: {text!r}")


def to_float(text: str) -> float | str:
    """A float, or the special value's name: JSON has no NaN or Infinity."""
    return text if text in _FLOAT_SPECIALS else float(text)


def to_base64(text: str) -> str:
    """bytea in hex output format (`\\x0a1b`) → base64 of the bytes."""
    if not text.startswith("\\x"):
        raise ValueError("bytea is not in hex output format (bytea_output must be 'hex')")
    return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")


def to_json(text: str) -> Any:
    return json.loads(text)


def _is_plain_datetime(text: str) -> bool:
    return text[:1].isdigit() and not text.endswith(" BC")


def to_timestamp(text: str) -> str:
    """`2024-05-01 12:00:00.5` → `2024-05-01T12:00:00.5` (no offset: the type has none)."""
    return text.replace(" ", "T", 1) if _is_plain_datetime(text) else text


def to_timestamptz(text: str) -> str:
    """`2024-05-01 12:00:00.5+00` → `2024-05-01T12:00:00.5Z` (sessions run with TimeZone=UTC)."""
    if text.endswith("+00") and text[:1].isdigit():
        return text[:-3].replace(" ", "T", 1) + "Z"  # the usual case, without the regex
    if not _is_plain_datetime(text):
        return text
    match = _UTC_OFFSET.search(text)
    if match is None:
        raise ValueError(f"timestamptz without an offset: {text!r}")
    sign, hours, minutes, seconds = match.groups()
    stamp = text[:match.start()].replace(" ", "T", 1)
    if seconds not in (None, "00"):
        return text  # a sub-minute offset (historic local mean time) has no RFC 3339 spelling
    if hours == "00" and minutes in (None, "00"):
        return stamp + "Z"
    return f"{stamp}{sign}{hours}:{minutes or '00'}"


class _ArraySyntax(ValueError):
    pass


def _quoted(text: str, pos: int) -> tuple[str, int]:
    """The element starting after an opening quote at `pos - 1`; returns it and the position after."""
    out: list[str] = []
    while True:
        char = text[pos]
        if char == "\\":
            out.append(text[pos + 1])
            pos += 2
        elif char == '"':
            return "".join(out), pos + 1
        else:
            out.append(char)
            pos += 1


def _unquoted(text: str, pos: int) -> tuple[str | None, int]:
    end = pos
    while text[end] not in ",}":
        end += 1
    if end == pos:
        raise _ArraySyntax("empty unquoted element")
    token = text[pos:end]
    return (None if token == "NULL" else token), end


def _level(text: str, pos: int) -> tuple[list[Any], int]:
    """Parse the array level whose '{' is at `pos - 1`; returns its items and the position after '}'."""
    items: list[Any] = []
    if text[pos] == "}":
        return items, pos + 1
    while True:
        char = text[pos]
        item: Any
        if char == "{":
            item, pos = _level(text, pos + 1)
        elif char == '"':
            item, pos = _quoted(text, pos + 1)
        else:
            item, pos = _unquoted(text, pos)
        items.append(item)
        if text[pos] == "}":
            return items, pos + 1
        if text[pos] != ",":
            raise _ArraySyntax(f"unexpected {text[pos]!r} at {pos}")
        pos += 1


def parse_array(text: str) -> list[Any] | None:
    """PostgreSQL's array text (`{1,NULL,"a b"}`, nested for more dimensions) → nested lists of str/None.

    Returns None for anything else (explicit bounds `[0:1]={...}`, vector types), so the caller
    keeps the text rather than guess.
    """
    if not text.startswith("{"):
        return None
    try:
        items, end = _level(text, 1)
    except (_ArraySyntax, IndexError):
        return None
    return items if end == len(text) else None


def _map_leaves(items: list[Any], element: Converter) -> list[Any]:
    return [_map_leaves(item, element) if isinstance(item, list)
            else None if item is None else element(item) for item in items]


def array_of(element: Converter) -> Converter:
    """A converter for arrays whose elements convert with `element`."""

    def convert(text: str) -> Any:
        items = parse_array(text)
        return text if items is None else _map_leaves(items, element)

    return convert


# A converter has a name (its *spec*), so a row's conversion can be written down and done later,
# elsewhere: the stream keeps column text and the build converts it (`text_rows`). An array's spec
# is `array:` + its element's spec.
_BY_SPEC: Final[dict[str, Converter]] = {
    "text": to_text, "int": to_int, "bool": to_bool, "float": to_float, "base64": to_base64, "json": to_json,
    "timestamp": to_timestamp, "timestamptz": to_timestamptz,
}
_ARRAY_SPEC: Final = "array:"
_SCALARS: Final[dict[int, str]] = {
    16: "bool", 17: "base64", 20: "int", 21: "int", 23: "int", 26: "int",
    114: "json", 3802: "json", 700: "float", 701: "float",
    1114: "timestamp", 1184: "timestamptz",
}
# Built-in types that print as plain text; known here so common tables need no catalog lookup.
_BUILTIN_TEXT: Final = frozenset({
    18, 19, 25, 142, 650, 829, 869, 1042, 1043, 1082, 1083, 1186, 1266, 1700, 2950, 774, 3614,
})
# Built-in array type → element type.
_BUILTIN_ARRAYS: Final[dict[int, int]] = {
    1000: 16, 1001: 17, 1005: 21, 1007: 23, 1016: 20, 1028: 26, 1009: 25, 1015: 1043, 1014: 1042,
    1002: 18, 1003: 19, 1231: 1700, 2951: 2950, 1021: 700, 1022: 701, 1182: 1082, 1183: 1083,
    1115: 1114, 1185: 1184, 1187: 1186, 1270: 1266, 199: 114, 3807: 3802, 143: 142,
}


@functools.cache
def converter_of(spec: str) -> Converter:
    """The converter a spec names (`Converters.spec`); a ValueError for a spec no version wrote."""
    if spec.startswith(_ARRAY_SPEC):
        return array_of(converter_of(spec[len(_ARRAY_SPEC):]))
    converter = _BY_SPEC.get(spec)
    if converter is None:
        raise ValueError(f"unknown PostgreSQL value converter {spec!r}")
    return converter


class Converters:
    """Converter per type OID, resolving non-built-in types (domains, arrays of them) once each.

    `lookup` describes an OID from the catalog (None when unknown); it is only called for types
    this module does not know, and each answer is cached for the source's lifetime.
    """

    def __init__(self, lookup: TypeLookup) -> None:
        self._lookup = lookup
        self._cache: dict[int, str] = dict(_SCALARS)

    def __call__(self, oid: int) -> Converter:
        return converter_of(self.spec(oid))

    def spec(self, oid: int) -> str:
        """The name of the converter of `oid` (`converter_of` turns it back into the function)."""
        spec = self._cache.get(oid)
        if spec is None:
            spec = self._resolve(oid)
            self._cache[oid] = spec
        return spec

    def _resolve(self, oid: int) -> str:
        if oid in _BUILTIN_TEXT:
            return "text"
        element = _BUILTIN_ARRAYS.get(oid)
        if element is not None:
            return _ARRAY_SPEC + self.spec(element)
        described = self._lookup(oid)
        if described is None:
            return "text"
        if described.kind == "d" and described.base_oid:
            return self.spec(described.base_oid)
        if described.element_oid:
            return _ARRAY_SPEC + self.spec(described.element_oid)
        return "text"


def convert(text: str | None, converter: Converter) -> Any:
    """Convert one value; SQL NULL stays None."""
    return None if text is None else converter(text)
