"""A diff's net changes encoded once: the new images' state bytes and the diff's own records, in one pass.

Why: a net change enters the archive twice, as the state's new row (its sort key and protobuf
SnapshotRow, so the next snapshot merges bytes: state.py) and as the diff's records (its jsonl line
and protobuf DiffChange). Made in two passes, each decoded both images from Go-JSON again, and the
protobuf writer encoded the new image's Struct a second time: about 144 µs a change on the
benchmark's 8-column rows, measured in one process. Here each change is decoded once, the jsonl
line splices the images' texts (`jsonl.diff_line`) and the DiffChange reuses the SnapshotRow's Struct
(`protobuf.diff_record(new_record=...)`); the records are kept in the delta (`RECORD_COLUMNS`), so
the diff's pieces are the concatenation of stored bytes (versions.py), like a snapshot's.

Python here is per net change, which is what a diff is made of, never per row of the table.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Change
from snapshot_assets.archive.formats.jsonl import diff_line
from snapshot_assets.archive.formats.protobuf import diff_record, go_struct_value, snapshot_record
from snapshot_assets.archive.gojson import MAX_SAFE_INT, Kind
from snapshot_assets.archive.keys import go_json_value, written_key
from snapshot_assets.spark.effects import NET_COLUMNS, NET_DDL, decode_row
from snapshot_assets.spark.state import encoded_rows

#: The delta's column holding each net change's record, per diff record format.
RECORD_COLUMNS = {"jsonl": "dj", "protobuf": "dpb"}


def record_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """The formats of `formats` whose diff is a concatenation of per-change records (not parquet)."""
    return tuple(f for f in formats if f in RECORD_COLUMNS)


def _read_alike(value: Any) -> bool:
    """Whether Go reads `value` back as the same value from JSON and from a protobuf Struct: a
    string, bool, null, double, or an integer within ±2^53 (a double either way). A larger integer
    is a double in JSON but its decimal string in a Struct (protobuf.py's mapping)."""
    kind = gojson.kind_of(value)
    return kind in _SAME_KINDS or (kind is Kind.INT and -MAX_SAFE_INT <= value <= MAX_SAFE_INT)


_SAME_KINDS = frozenset((Kind.STRING, Kind.BOOL, Kind.NULL, Kind.FLOAT))


def struct_key(change: Change, key_fields: Sequence[str], json_key: str) -> str:
    """The protobuf record's key (`written_key` with `go_struct_value`), given the jsonl line's: the
    same string when every key value reads back alike (the usual key: an integer id, a string),
    else computed. Why: building a Struct Value per key value to learn that cost a fifth of the pass."""
    image = change.new if change.new is not None else change.old
    if image is None or all(_read_alike(image[f]) for f in key_fields if f in image):
        return json_key
    return written_key(change, key_fields, go_struct_value)


def _encode(batch: pa.RecordBatch, key_fields: tuple[str, ...], state_protobuf: bool,
            records: tuple[str, ...]) -> pa.RecordBatch:
    """`batch` (NET_DDL) with `sk` and `pb` (the new image's state record, null unless
    `state_protobuf`) and one column of records per format of `records`."""
    out = encoded_rows(batch, key_fields, None, "new")  # refuses an over-long image before anything is encoded
    jsonl, protobuf = "jsonl" in records, "protobuf" in records
    state_pbs: list[bytes | None] = []
    lines: list[bytes] = []
    diff_pbs: list[bytes] = []
    if state_protobuf or records:
        columns = [batch.column(name).to_pylist() for name in ("action", "change_key", "old", "new", "old_pb")]
        for action, key, old, new, old_record in zip(*columns, strict=True):
            change = Change(Change.parse_action(action), key, decode_row(old), decode_row(new))
            new_record = None
            if change.new is not None and (state_protobuf or protobuf):
                new_record = snapshot_record(change.new, key_fields)
            if state_protobuf:
                state_pbs.append(new_record)
            json_key = written_key(change, key_fields, go_json_value) if records else ""
            if jsonl:
                lines.append(diff_line(change, key_fields, old, new, json_key))
            if protobuf:
                diff_pbs.append(diff_record(change, key_fields, new_record, struct_key(change, key_fields, json_key),
                                            old_record))
    if state_protobuf:
        index = out.schema.get_field_index("pb")
        out = out.set_column(index, out.schema.field(index), pa.array(state_pbs, pa.binary()))
    for fid, values in (("jsonl", lines), ("protobuf", diff_pbs)):
        if fid in records:
            out = out.append_column(RECORD_COLUMNS[fid], pa.array(values, pa.binary()))
    return out


def _batches(batches: Iterable[Any], key_fields: tuple[str, ...], state_protobuf: bool,
             records: tuple[str, ...]) -> Iterator[Any]:
    for batch in batches:
        yield _encode(batch, key_fields, state_protobuf, records)


def encode_net(net: DataFrame, key_fields: Sequence[str], formats: Sequence[str],
               diff_formats: Sequence[str] = ()) -> DataFrame:
    """Net changes (NET_DDL) with the sort key and protobuf record (`pb`, when `formats` has
    protobuf) of their new image, for the state's `formats`, and the diff's record of each change
    per record format of `diff_formats` (`RECORD_COLUMNS`)."""
    records = record_formats(diff_formats)
    func = functools.partial(_batches, key_fields=tuple(key_fields), state_protobuf="protobuf" in formats,
                             records=records)
    ddl = ", ".join([NET_DDL, "sk BINARY, pb BINARY", *(f"{RECORD_COLUMNS[f]} BINARY" for f in records)])
    return net.select(*NET_COLUMNS).mapInArrow(func, ddl)


__all__ = ["RECORD_COLUMNS", "encode_net", "record_formats"]
