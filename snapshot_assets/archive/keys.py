"""Object keys and row keys: the parts of the layout that laredo readers recompute, not look up.

laredo readers derive every object key from (key_prefix, epoch, positions, extension) and ignore
the URIs stored in the manifest, so these functions are part of the compatibility contract.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Change
from snapshot_assets.archive.errors import MissingKeyField
from snapshot_assets.archive.gojson import Kind
from snapshot_assets.archive.gonum import go_v_float

MANIFEST_NAME = "manifest.json"
DEFAULT_KEY_FIELDS = ("id",)
"""laredo's key fields when a table names none and its source reports none."""


def san(position: str) -> str:
    """Sanitise a position for an object key: "" -> "0"; `/`, `:` and space -> `_`."""
    if position == "":
        return "0"
    return position.replace("/", "_").replace(":", "_").replace(" ", "_")


def default_key_prefix(table: str) -> str:
    """laredo's default per-table prefix: the table name without its schema, as a folder."""
    return table.rsplit(".", 1)[-1] + "/"


def manifest_key(key_prefix: str) -> str:
    return f"{key_prefix}{MANIFEST_NAME}"


def snapshot_key(key_prefix: str, epoch: int, to_position: str, ext: str) -> str:
    return f"{key_prefix}epoch={epoch}/snapshot-{san(to_position)}{ext}"


def diff_key(key_prefix: str, epoch: int, from_position: str, to_position: str, ext: str) -> str:
    return f"{key_prefix}epoch={epoch}/diff-{san(from_position)}-{san(to_position)}{ext}"


def go_v(value: Any) -> str:
    """Print one value the way Go's `%v` prints what encoding/json decoded (or a typed Go value)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_v_float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        inner = " ".join(f"{k}:{go_v(value[k])}" for k in sorted(value))
        return f"map[{inner}]"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(go_v(v) for v in value) + "]"
    return str(value)


def row_key(row: Mapping[str, Any] | None, key_fields: Sequence[str]) -> str:
    """laredo's key string: one field prints alone, several as `[v1 v2 ...]`, missing as `<nil>`."""
    values = [None if row is None else row.get(f) for f in key_fields]
    if len(values) == 1:
        return go_v(values[0])
    return "[" + " ".join(go_v(v) for v in values) + "]"


ValueAsRead = Callable[[Any], Any]
"""Maps a row value to the Go value a format's reader holds after decoding what the format wrote."""


def key_as_read(row: Mapping[str, Any] | None, key_fields: Sequence[str], as_read: ValueAsRead) -> str:
    """laredo's RowKey of `row` as a reader sees it: `%v` of each key value after `as_read`.

    laredo keys a snapshot row from the row it decoded, so a diff key only matches that row when
    it is computed from the value the same format's reader decodes, not from the Python value.
    """
    if row is None:
        return row_key(None, key_fields)
    return row_key({f: as_read(row[f]) for f in key_fields if f in row}, key_fields)


#: The smallest integer magnitude Go's JSON decoder cannot hold in a float64 (it rejects the row).
_FLOAT64_LIMIT = 2**1024


def go_json_value(value: Any) -> Any:
    """What Go's encoding/json decodes into `any` from the text `gojson` writes for `value`.

    Every number becomes a float64 (an integer beyond 2^53 is rounded to the nearest double, the
    way Go's strconv rounds the decimal text); bytes, datetimes and dates become the strings they
    were written as; strings and booleans stay. An integer beyond the float64 range, which Go
    refuses to decode at all (laredo cannot read that row), keeps its exact value.
    """
    kind = gojson.kind_of(value)
    if kind is Kind.INT:
        return float(value) if abs(value) < _FLOAT64_LIMIT else value
    if kind is Kind.DECIMAL:
        return float(value)  # beyond the float64 range the jsonl writer refuses the whole row
    if kind is Kind.NULL or kind is Kind.BOOL or kind is Kind.FLOAT:
        return value
    if kind is Kind.STRING:
        return gojson.valid_text(str(value))
    return json.loads(gojson.encode_value(value), parse_int=float, parse_float=float)


def laredo_row_key(row: Mapping[str, Any] | None, key_fields: Sequence[str]) -> str:
    """The key string laredo's reader computes for a row it decoded from JSON (every number a double).

    This is the jsonl format's diff key (id 1000000 keys as `1e+06`), and the key the change
    algebra gives a Change before a format writer derives its own (`written_key`).
    """
    return key_as_read(row, key_fields, go_json_value)


def written_key(change: Change, key_fields: Sequence[str], as_read: ValueAsRead) -> str:
    """The `key` a format's diff writer writes for `change`: derived from the change's row image
    (`new`, else `old`) as that format's reader decodes it, so the key equals the RowKey laredo's
    reader computes from the same format's snapshot rows. A change without an image that carries
    every key field (a TRUNCATE; a DELETE whose source sent no usable before-image) keeps the key
    string it came with: there is nothing else to derive it from.
    """
    image = change.new if change.new is not None else change.old
    if image is None or any(f not in image for f in key_fields):
        return change.key
    try:
        return key_as_read(image, key_fields, as_read)
    except gojson.UnsupportedValue as exc:
        raise exc.in_row(", ".join(key_fields), change.key) from None


def _canonical(value: Any) -> Any:
    """Identity of one key component, independent of the format that carried it.

    Integral floats and decimal-integer strings written by the protobuf format for integers beyond
    2^53 both become the exact int, so a row read from jsonl, protobuf or parquet keys the same.
    """
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _is_big_int_text(value):
        return int(value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    return value


_SAFE = 2**53


_BIG_INT_TEXT = re.compile(r"-?[1-9][0-9]{15,}")


def _is_big_int_text(text: str) -> bool:
    """True for the decimal strings the protobuf format writes for integers beyond ±2^53."""
    return _BIG_INT_TEXT.fullmatch(text) is not None and abs(int(text)) > _SAFE


TypedKey = tuple[Any, ...]


def typed_key(row: Mapping[str, Any], key_fields: Sequence[str]) -> TypedKey:
    """The identity of a row for folding: its key values, canonicalised (exact integers).

    A row without one of the fields raises MissingKeyField: folding it under a `<nil>` key would
    merge it with every other such row. A field present with a null value is a value (laredo's
    `<nil>`); the change buffer refuses those at ingest (see `resources.buffer.segments.key_text`).
    """
    try:
        return tuple(_canonical(row[f]) for f in key_fields)
    except KeyError:
        missing = next(f for f in key_fields if f not in row)
        raise MissingKeyField(missing, tuple(key_fields)) from None


def key_json(key: TypedKey) -> str:
    """The canonical JSON of a typed key (exact integers): the buffer's and the state's `key`
    column, and the key of a diff's versions line (archive/versions.py)."""
    return gojson.dumps(list(key))


def parse_key_string(key: str, n_fields: int) -> TypedKey:
    """Best-effort typed key from a `%v` key string, for a change that carries no row image.

    Only used when a DELETE has no `old` row: split `[a b]` on spaces and read numbers exactly.
    """

    def parse_one(text: str) -> Any:
        if text == "<nil>":
            return None
        if text in ("true", "false"):
            return text == "true"
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return _canonical(float(text))
        except ValueError:
            return text

    if n_fields == 1:
        return (parse_one(key),)
    inner = key[1:-1] if key.startswith("[") and key.endswith("]") else key
    parts = inner.split(" ")
    if len(parts) != n_fields:
        return (key,)
    return tuple(parse_one(p) for p in parts)
