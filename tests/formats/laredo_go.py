"""An independent model of laredo-snapshotter's Go reader, for checking archives this project writes.

It shares no decoding code with the project's formats, on purpose: it decodes each format the way
Go does (encoding/json into `any`: every number a float64; `structpb.Value.AsInterface`: numbers
float64, strings stay strings) and keys rows with Go's `%v` (spec section 6), implemented here
from the rule itself. parquet is read the way a typed reader reads it (pyarrow: int64 stays an
exact integer) with the project's documented cell encodings (`json`, `decimal`) undone.

The fold is laredo's: newest snapshot, then every diff chained from it (`from` equal to the previous
`to`); DELETE drops `key`, TRUNCATE clears, INSERT/UPDATE set `key` to `new`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from google.protobuf import struct_pb2

from snapshot_assets.archive.formats.parquet import SPARK_SCHEMA_KEY, annotated_schema
from snapshot_assets.archive.proto.laredo.snapshotter.v1.artifact_pb2 import DiffChange, SnapshotRow

EXTENSIONS = {"jsonl": ".jsonl", "protobuf": ".pb", "parquet": ".parquet"}

# --- Go's %v ---------------------------------------------------------------------------------------


def go_float(x: float) -> str:
    """`%v` of a float64: shortest round-trip digits, exponent form when exp < -4 or exp >= 6."""
    if x == 0:
        return "0"
    sign, digits_t, exponent = Decimal(repr(x)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digits_t))
    exp10 = len(digits) + exponent - 1
    minus = "-" if sign else ""
    if exp10 < -4 or exp10 >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{minus}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if exponent >= 0:
        return minus + digits + "0" * exponent
    point = len(digits) + exponent
    if point > 0:
        return minus + digits[:point] + "." + digits[point:]
    return minus + "0." + "0" * -point + digits


def go_v(value: Any) -> str:
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    raise AssertionError(f"no key value of type {type(value).__name__} in these tests")


def row_key(row: Mapping[str, Any], key_fields: Sequence[str]) -> str:
    """laredo's RowKey: one field alone, several as `[v1 v2 ...]`, a missing one `<nil>`."""
    values = [go_v(row.get(f)) for f in key_fields]
    return values[0] if len(values) == 1 else "[" + " ".join(values) + "]"


# --- decoding, as Go does ---------------------------------------------------------------------------


def json_any(text: bytes | str) -> Any:
    """encoding/json into `any`: every number a float64."""
    return json.loads(text, parse_int=float)


def struct_any(value: struct_pb2.Value) -> Any:
    """structpb's AsInterface."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return value.number_value
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return {k: struct_any(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [struct_any(v) for v in value.list_value.values]
    return None


def _struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    return {k: struct_any(v) for k, v in struct.fields.items()}


def _frames(data: bytes) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        length = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        yield data[pos:pos + length]
        pos += length


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    rows: list[dict[str, Any]] = []
    for file in files:
        table = pq.read_table(file)
        # a Spark-written file keeps the encodings in Spark's footer schema, not in Arrow field metadata
        spark_schema = (pq.read_metadata(file).metadata or {}).get(SPARK_SCHEMA_KEY)
        schema = annotated_schema(table.schema, spark_schema) if spark_schema else None
        rows.extend(_typed(schema or table.schema, row) for row in table.to_pylist())
    return rows


def _typed(schema: pa.Schema | pa.StructType, row: dict[str, Any]) -> dict[str, Any]:
    """Undo the project's documented cell encodings; drop the columns a row lacks."""
    out: dict[str, Any] = {}
    fields = list(schema) if isinstance(schema, pa.Schema) else [schema.field(i) for i in range(schema.num_fields)]
    absent: list[str] = []
    for field in fields:
        value = row.get(field.name)
        encoding = (field.metadata or {}).get(b"snapshotter.encoding")
        if encoding == b"absent":
            absent = value or []
            continue
        if pa.types.is_struct(field.type):
            out[field.name] = None if value is None else _typed(field.type, value)
        elif encoding == b"json" and value is not None:
            out[field.name] = json.loads(value)
        else:
            out[field.name] = value
    for name in absent:
        out.pop(name, None)
    return out


def snapshot_rows(format_id: str, path: Path) -> list[dict[str, Any]]:
    if format_id == "jsonl":
        return [json_any(line) for line in path.read_bytes().splitlines() if line]
    if format_id == "protobuf":
        rows = []
        for frame in _frames(path.read_bytes()):
            message = SnapshotRow()
            message.ParseFromString(frame)
            rows.append(_struct(message.row))
        return rows
    return _parquet_rows(path)


Change = tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]


def diff_changes(format_id: str, path: Path) -> list[Change]:
    """(action, key, old, new) of every change, in file order."""
    if format_id == "jsonl":
        out: list[Change] = []
        for line in path.read_bytes().splitlines():
            if line:
                obj = json_any(line)
                out.append((obj["action"], obj.get("key", ""), obj.get("old"), obj.get("new")))
        return out
    if format_id == "protobuf":
        out = []
        for frame in _frames(path.read_bytes()):
            message = DiffChange()
            message.ParseFromString(frame)
            old = _struct(message.old) if message.HasField("old") else None
            new = _struct(message.new) if message.HasField("new") else None
            out.append((message.action, message.key, old, new))
        return out
    return [(r["action"], r["key"], r.get("old"), r.get("new")) for r in _parquet_rows(path)]


# --- the reader ------------------------------------------------------------------------------------


def _san(position: str) -> str:
    return (position or "0").replace("/", "_").replace(":", "_").replace(" ", "_")


def object_path(root: Path, prefix: str, art: Mapping[str, Any], format_id: str) -> Path:
    """laredo recomputes an object's key from the layout and ignores the stored URI."""
    ext = EXTENSIONS[format_id]
    if art["kind"] == "snapshot":
        name = f"snapshot-{_san(art['to_position'])}{ext}"
    else:
        name = f"diff-{_san(art['from_position'])}-{_san(art['to_position'])}{ext}"
    return root / prefix / f"epoch={art['epoch']}" / name


def fold(table: dict[str, dict[str, Any]], changes: Sequence[Change]) -> None:
    for action, key, _old, new in changes:
        if action == "TRUNCATE":
            table.clear()
        elif action == "DELETE":
            table.pop(key, None)
        else:
            assert new is not None
            table[key] = new


def _lsn(position: str) -> int:
    high, low = position.split("/")
    return int(high, 16) << 32 | int(low, 16)


def reconstruct(root: Path, prefix: str, format_id: str, key_fields: Sequence[str],
                at: str | None = None) -> dict[str, dict[str, Any]]:
    """The table laredo's reader rebuilds from the local archive at `root`: at the head, or as of
    `at` (the newest snapshot at or before it, then the diffs chained from it that end at or
    before it). The position reached must be `at` (or the head): a diff that did not chain would be
    skipped by laredo, and hide a broken archive."""
    manifest = json.loads((root / prefix / "manifest.json").read_text())
    artifacts = manifest["artifacts"]
    bound = _lsn(at) if at is not None else None
    snap_index = max(i for i, a in enumerate(artifacts)
                     if a["kind"] == "snapshot" and (bound is None or _lsn(a["to_position"]) <= bound))
    snap = artifacts[snap_index]
    table = {row_key(r, key_fields): r for r in snapshot_rows(format_id, object_path(root, prefix, snap, format_id))}
    position = snap["to_position"]
    for art in artifacts[snap_index + 1:]:
        if bound is not None and _lsn(art["to_position"]) > bound:
            break
        if art["kind"] == "diff" and art["from_position"] == position:
            fold(table, diff_changes(format_id, object_path(root, prefix, art, format_id)))
            position = art["to_position"]
    assert position == (at if at is not None else manifest["head_position"]), f"the diff chain stops at {position}"
    return table


def as_read(format_id: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A source row as laredo's reader of `format_id` decodes it (spec sections 4 and 5): jsonl
    numbers are float64; protobuf Struct numbers too, except integers beyond 2^53, which this
    project writes as decimal strings; parquet keeps the typed values."""
    if format_id == "jsonl":
        return dict(json_any(json.dumps(row)))
    if format_id == "protobuf":
        return {k: _struct_number(v) for k, v in row.items()}
    return dict(row)


def _struct_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return [_struct_number(v) for v in value] if isinstance(value, list) else value
    if isinstance(value, int) and abs(value) > 2**53:
        return str(value)
    return float(value)


def expected_table(format_id: str, rows: Iterator[Mapping[str, Any]] | Sequence[Mapping[str, Any]],
                   key_fields: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What laredo's reader of `format_id` must rebuild for a source table holding `rows`."""
    out = {}
    for row in rows:
        view = as_read(format_id, row)
        out[row_key(view, key_fields)] = view
    return out
