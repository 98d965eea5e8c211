"""Archive rows → PostgreSQL COPY text: the exact inverse of `resources.subscribers.pgtypes`.

The source turned each value's text into a row value by the column's converter spec; a restore
turns it back by the spec of the same column in the restored table (resolved from the target's
catalog by the same `pgtypes.Converters`, so domains and arrays of them resolve alike):
- `int`: the exact integer (also beyond 2^53; a decimal string where a format carried it so);
- `float`: the shortest round-trip digits, or the special's name ('NaN', 'Infinity', ...);
- `bool`: t / f; `base64` (bytea): the bytes in hex input form (`\\x0a1b`);
- `json` (json, jsonb): the value as JSON text (a JSON string stays a quoted string);
- `text`, `timestamp`, `timestamptz` (RFC 3339, which PostgreSQL reads back) and every other
  type: the text itself;
- `array:<spec>`: the nested lists as an array literal, each element by `<spec>` and quoted; an
  array the source kept as text (explicit bounds) is that text.
A COPY field escapes backslash, newline, carriage return and tab; NULL is `\\N`. A batch of rows
becomes one bytes object (the COPY stream's unit); a row naming a column the table lacks is an
error, since writing the rest would silently drop a value.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from snapshot_assets.restore.errors import RestoreError

Encoder = Callable[[Any], str]

NULL: Final = "\\N"
_FIELD_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})
_ARRAY_PREFIX: Final = "array:"


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    return _json(value)


def _bool(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    return _plain(value)


def _bytea(value: Any) -> str:
    if not isinstance(value, str):
        raise RestoreError(f"a bytea value must be base64 text in the archive, got {type(value).__name__}")
    try:
        return "\\x" + base64.b64decode(value, validate=True).hex()
    except binascii.Error as exc:
        raise RestoreError(f"a bytea value is not base64: {exc}") from None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_SCALAR: Final[dict[str, Encoder]] = {
    "text": _plain, "int": _plain, "float": _plain, "timestamp": _plain, "timestamptz": _plain,
    "bool": _bool, "base64": _bytea, "json": _json,
}


def _element(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array(element: Encoder) -> Encoder:
    def literal(items: Sequence[Any]) -> str:
        return "{" + ",".join("NULL" if item is None else literal(item) if isinstance(item, list)
                              else _element(element(item)) for item in items) + "}"

    def encode(value: Any) -> str:
        return literal(value) if isinstance(value, list) else _plain(value)

    return encode


def encoder_of(spec: str) -> Encoder:
    """The encoder of a `pgtypes` converter spec; a RestoreError for a spec no version wrote."""
    if spec.startswith(_ARRAY_PREFIX):
        return _array(encoder_of(spec[len(_ARRAY_PREFIX):]))
    encoder = _SCALAR.get(spec)
    if encoder is None:
        raise RestoreError(f"no COPY encoding for the value converter {spec!r}")
    return encoder


class CopyEncoder:
    """Rows → COPY text lines for the table's columns (name, converter spec), in that order."""

    def __init__(self, columns: Sequence[tuple[str, str]]) -> None:
        self.names = tuple(name for name, _ in columns)
        self._encoders = tuple(encoder_of(spec) for _, spec in columns)
        self._known = frozenset(self.names)

    def line(self, row: Mapping[str, Any]) -> str:
        extra = row.keys() - self._known
        if extra:
            raise RestoreError(f"a row holds columns the restored table does not have: {sorted(extra)} "
                               f"(the manifest describes {list(self.names)})")
        return "\t".join(NULL if (value := row.get(name)) is None else encode(value).translate(_FIELD_ESCAPES)
                         for name, encode in zip(self.names, self._encoders, strict=True)) + "\n"

    def batch(self, rows: Iterable[Mapping[str, Any]]) -> bytes:
        """One COPY payload for `rows`."""
        return "".join(map(self.line, rows)).encode("utf-8")
