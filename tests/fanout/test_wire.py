"""Connect framing, filters and message conversions shared by the client and the server."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from google.protobuf import struct_pb2

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import (
    FrameDecoder,
    FramingError,
    TruncatedStream,
    code_for_http_status,
    encode_frame,
    end_stream_frame,
    parse_end_stream,
)
from resources.subscribers.replication_filters import Filter, compile_filters, parse_filters
from resources.subscribers.replication_wire import (
    Code,
    StatusError,
    column_from_proto,
    column_to_proto,
    row_to_struct,
    schema_from_columns,
    struct_to_row,
)
from snapshot_assets.archive.changes import Action
from tests.fanout.support import COLUMNS

# --- framing ------------------------------------------------------------------------------------


def test_decoder_reassembles_frames_fed_byte_by_byte() -> None:
    data = encode_frame(b"hello") + encode_frame(b"") + end_stream_frame()
    decoder = FrameDecoder()
    frames = [f for i in range(len(data)) for f in decoder.feed(data[i:i + 1])]
    assert [(f.flags, f.payload) for f in frames] == [(0, b"hello"), (0, b""), (2, b"{}")]
    decoder.finish()


def test_decoder_refuses_what_it_cannot_trust() -> None:
    with pytest.raises(FramingError, match="more than the 10-byte limit"):
        list(FrameDecoder(max_frame_bytes=10).feed(struct.pack(">BI", 0, 11)))
    with pytest.raises(FramingError, match="compressed"):
        list(FrameDecoder().feed(encode_frame(b"x", 0x01)))
    decoder = FrameDecoder()
    assert list(decoder.feed(encode_frame(b"abcdef")[:7])) == []
    with pytest.raises(TruncatedStream, match="7 bytes of it received"):
        decoder.finish()


def test_end_stream_json() -> None:
    assert parse_end_stream(b"{}").error is None
    assert parse_end_stream(b"").error is None
    end = parse_end_stream(b'{"error":{"code":"resource_exhausted","message":"max clients"},"metadata":{"a":["1"]}}')
    assert end.error is not None and end.error.code is Code.RESOURCE_EXHAUSTED and end.error.message == "max clients"
    assert end.error.transient and end.metadata == {"a": ["1"]}
    unknown = parse_end_stream(b'{"error":{"message":"?"}}').error
    assert unknown is not None and unknown.code is Code.UNKNOWN
    with pytest.raises(FramingError, match="not JSON"):
        parse_end_stream(b"{nope")
    with pytest.raises(FramingError, match="not an object"):
        parse_end_stream(b"[1]")
    frame = end_stream_frame(StatusError(Code.NOT_FOUND, "no fan-out target for a.b"))
    again = parse_end_stream(frame[5:]).error
    assert again is not None and (again.code, again.message) == (Code.NOT_FOUND, "no fan-out target for a.b")


def test_codes() -> None:
    assert Code.parse("CANCELLED") is Code.CANCELED and Code.parse("Not_Found") is Code.NOT_FOUND
    assert Code.parse("whatever") is Code.UNKNOWN
    assert code_for_http_status(503) is Code.UNAVAILABLE and code_for_http_status(404) is Code.UNIMPLEMENTED
    assert not StatusError(Code.INVALID_ARGUMENT, "").transient and StatusError(Code.UNAVAILABLE, "").transient


# --- conversions --------------------------------------------------------------------------------


def test_rows_keep_integers_exact() -> None:
    row: dict[str, Any] = {"id": 2**53, "big": 2**53 + 1, "neg": -(2**63), "f": 1.5, "whole": 2.0, "s": "x",
                           "n": None, "b": True, "nested": {"k": [1, "two", None]}}
    struct = struct_pb2.Struct()
    row_to_struct(struct, row, lambda: "row")
    back = struct_to_row(struct)
    assert back["id"] == 2**53 and isinstance(back["id"], int)
    assert back["big"] == str(2**53 + 1) and back["neg"] == str(-(2**63))  # beyond doubles: exact text
    assert back["f"] == 1.5 and back["whole"] == 2 and back["nested"] == {"k": [1, "two", None]}
    assert back["n"] is None and back["b"] is True


def test_columns_round_trip_and_primary_key_order() -> None:
    assert [column_from_proto(column_to_proto(c)) for c in COLUMNS] == list(COLUMNS)
    definitions = [
        pb.ColumnDefinition(column_name="b", ordinal_position=2, is_primary_key=True, primary_key_ordinal=1),
        pb.ColumnDefinition(column_name="a", ordinal_position=1, is_primary_key=True, primary_key_ordinal=2),
        pb.ColumnDefinition(column_name="c", ordinal_position=3, not_null=True),
    ]
    schema = schema_from_columns("s.t", definitions)
    assert [c.name for c in schema.columns] == ["a", "b", "c"]
    assert schema.key_fields == ("b", "a")
    assert not schema.columns[2].nullable


# --- filters ------------------------------------------------------------------------------------


def _compile(*specs: dict[str, Any], columns: tuple[str, ...] = ()) -> Any:
    return compile_filters([f.to_proto() for f in parse_filters(specs)], columns)


def test_equals_compares_numbers_numerically_and_nothing_else() -> None:
    flt = _compile({"field": "n", "equals": 42})
    assert flt.matches_row({"n": 42}) and flt.matches_row({"n": 42.0})
    assert not flt.matches_row({"n": "42"}) and not flt.matches_row({"n": 43})
    assert not _compile({"field": "n", "equals": 1}).matches_row({"n": True})  # a bool is not a number
    assert _compile({"field": "n", "equals": True}).matches_row({"n": True})
    assert _compile({"field": "s", "equals": "x"}).matches_row({"s": "x"})


def test_prefix_in_and_nulls() -> None:
    assert _compile({"field": "s", "prefix": "ab"}).matches_row({"s": "abc"})
    assert not _compile({"field": "s", "prefix": "1"}).matches_row({"s": 12})  # strings only
    membership = _compile({"field": "n", "in": [1, "two", None]})
    assert membership.matches_row({"n": 1.0}) and membership.matches_row({"n": "two"})
    assert not membership.matches_row({"n": None}) and not membership.matches_row({})
    assert not _compile({"field": "n", "equals": None}).matches_row({"n": None})


def test_predicates_and_and_changes_test_the_right_row() -> None:
    flt = _compile({"field": "tenant", "equals": 1}, {"field": "name", "prefix": "a"})
    assert flt.matches_row({"tenant": 1, "name": "ab"}) and not flt.matches_row({"tenant": 1, "name": "b"})
    assert flt.matches_change(Action.INSERT, None, {"tenant": 1, "name": "a"})
    assert not flt.matches_change(Action.UPDATE, {"tenant": 1, "name": "a"}, {"tenant": 2, "name": "a"})
    assert flt.matches_change(Action.DELETE, {"tenant": 1, "name": "a"}, None)
    assert flt.matches_change(Action.TRUNCATE, None, None)
    assert _compile().matches_row({"anything": 1})


@pytest.mark.parametrize(("predicate", "message"), [
    (pb.FieldPredicate(prefix="x"), "field is required"),
    (pb.FieldPredicate(field="a"), "a match condition"),
    (pb.FieldPredicate(field="zz", prefix="x"), "'zz' is not a column"),
    (pb.FieldPredicate(field="a", equals=struct_pb2.Value(list_value=struct_pb2.ListValue())), "scalar"),
])
def test_bad_predicates_are_invalid(predicate: pb.FieldPredicate, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compile_filters([predicate], ["a", "b"])


@pytest.mark.parametrize("spec", [
    {"equals": 1},
    {"field": "a"},
    {"field": "a", "equals": 1, "in": [1]},
    {"field": "a", "prefix": 3},
    {"field": "a", "in": "abc"},
    {"field": "a", "equals": {"x": 1}},
    {"field": "a", "equals": float("nan")},
    {"field": "a", "like": "x"},
])
def test_bad_filter_specs(spec: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Filter.parse(spec)


# --- the wire contract --------------------------------------------------------------------------

_CONTRACT = {
    "SyncRequest": {"schema": 1, "table": 2, "last_known_sequence": 3, "last_snapshot_id": 4, "client_id": 5,
                    "last_known_source_position": 6, "filters": 7},
    "FieldPredicate": {"field": 1, "equals": 2, "prefix": 3, "in": 4},
    "SyncResponse": {"handshake": 1, "snapshot_begin": 2, "snapshot_row": 3, "snapshot_end": 4,
                     "journal_entry": 5, "schema_change": 6, "heartbeat": 7, "go_away": 8},
    "SyncHandshake": {"mode": 1, "server_current_sequence": 2, "journal_oldest_sequence": 3,
                      "resume_from_sequence": 4, "columns": 5, "snapshot_id": 6},
    "SnapshotBegin": {"snapshot_id": 1, "sequence": 2, "row_count": 3},
    "SnapshotRow": {"row": 1},
    "SnapshotEnd": {"sequence": 1, "rows_sent": 2},
    "ReplicationJournalEntry": {"sequence": 1, "source_position": 2, "timestamp": 3, "action": 4,
                                "old_values": 5, "new_values": 6},
    "SchemaChangeNotification": {"sequence": 1, "old_columns": 2, "new_columns": 3},
    "ColumnDefinition": {"ordinal_position": 1, "column_name": 2, "data_type": 3, "not_null": 4,
                         "is_primary_key": 5, "primary_key_ordinal": 6},
    "Heartbeat": {"current_sequence": 1, "server_time": 2},
    "GoAway": {"reason": 1, "drain_deadline_unix_ms": 2},
}


def test_field_numbers_match_the_spec() -> None:
    package = pb.DESCRIPTOR
    assert package.package == "laredo.replication.v1"
    assert {name: {f.name: f.number for f in package.message_types_by_name[name].fields} for name in _CONTRACT} \
        == _CONTRACT
    modes = {v.name: v.number for v in package.enum_types_by_name["SyncMode"].values}
    assert modes == {"SYNC_MODE_UNSPECIFIED": 0, "SYNC_MODE_FULL_SNAPSHOT": 1, "SYNC_MODE_DELTA": 2,
                     "SYNC_MODE_DELTA_FROM_SNAPSHOT": 3, "SYNC_MODE_REPLAY_ARCHIVE": 4}
    sync = package.services_by_name["LaredoReplicationService"].methods_by_name["Sync"]
    assert sync.server_streaming and not sync.client_streaming
