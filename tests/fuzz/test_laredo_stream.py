"""Fuzz what a laredo server sends: Connect frames, SyncResponse payloads and their meaning.

A valid Sync stream (handshake, snapshot, journal entries with positions and timestamps, schema
change, heartbeat, go-away, end-of-stream) is encoded as the Connect envelope and mutated as bytes,
then fed to the client's decode path in arbitrary read sizes: `FrameDecoder` (frame bounds),
`parse_end_stream` (the trailer JSON), `decode_response` (protobuf) and the `Sequencer` behind the
subscriber's handshake. Every outcome is success, a FramingError (what the transport raises for
bytes it cannot decode) or a SourceError (what the sequencer raises for messages that make no
sense); the gRPC transport decodes with the same message classes, its frame bound being grpc's
`max_receive_message_length`.
"""

from __future__ import annotations

import datetime as dt

from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_END_STREAM,
    FrameDecoder,
    FramingError,
    encode_frame,
    end_stream_payload,
    parse_end_stream,
)
from resources.subscribers.errors import SourceError
from resources.subscribers.laredo import LaredoSubscriber
from resources.subscribers.laredo_sequencer import Sequencer
from resources.subscribers.laredo_transport import decode_response
from resources.subscribers.replication_wire import Code, StatusError
from tests.fuzz.support import fuzz_settings, guarded, inputs

TABLE = "public.users"


def _struct(row: dict[str, object]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(row)
    return out


def _entry(sequence: int, position: str, action: str, seconds: int) -> pb.SyncResponse:
    entry = pb.ReplicationJournalEntry(sequence=sequence, source_position=position, action=action)
    entry.timestamp.FromDatetime(dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds))
    if action in ("INSERT", "UPDATE"):
        entry.new_values.CopyFrom(_struct({"id": sequence, "name": "n"}))
    if action in ("UPDATE", "DELETE"):
        entry.old_values.CopyFrom(_struct({"id": sequence}))
    return pb.SyncResponse(journal_entry=entry)


def _column(ordinal: int, name: str, key: bool) -> pb.ColumnDefinition:
    return pb.ColumnDefinition(ordinal_position=ordinal, column_name=name, data_type="text",
                               is_primary_key=key, primary_key_ordinal=1 if key else 0)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """A whole valid Connect response body of a Sync call from an initial load."""
    columns = [_column(1, "id", True), _column(2, "name", False)]
    rows = draw(st.integers(0, 3))
    messages = [pb.SyncResponse(handshake=pb.SyncHandshake(mode=pb.SYNC_MODE_FULL_SNAPSHOT, columns=columns)),
                pb.SyncResponse(snapshot_begin=pb.SnapshotBegin(sequence=10, row_count=rows))]
    messages += [pb.SyncResponse(snapshot_row=pb.SnapshotRow(row=_struct({"id": i, "name": "r"}))) for i in range(rows)]
    messages.append(pb.SyncResponse(snapshot_end=pb.SnapshotEnd(sequence=10, rows_sent=rows)))
    lsn = 0x100
    for sequence in range(11, 11 + draw(st.integers(0, 5))):
        lsn += draw(st.integers(0, 2))  # repeated positions: one transaction
        position = draw(st.sampled_from([f"0/{lsn:08X}", ""]))
        messages.append(_entry(sequence, position, draw(st.sampled_from(["INSERT", "UPDATE", "DELETE", "TRUNCATE"])),
                               sequence))
        if draw(st.booleans()):
            messages.append(pb.SyncResponse(heartbeat=pb.Heartbeat(current_sequence=sequence)))
    if draw(st.booleans()):
        messages.append(pb.SyncResponse(schema_change=pb.SchemaChangeNotification(
            sequence=99, new_columns=[*columns, _column(3, "extra", False)])))
    if draw(st.booleans()):
        messages.append(pb.SyncResponse(go_away=pb.GoAway(reason="draining", drain_deadline_unix_ms=1)))
    body = b"".join(encode_frame(m.SerializeToString()) for m in messages)
    error = draw(st.sampled_from([None, StatusError(Code.NOT_FOUND, "no table"), StatusError(Code.UNAVAILABLE, "")]))
    return body + encode_frame(end_stream_payload(error, {"x": ["1"]}), FLAG_END_STREAM)


def _consume(body: bytes, read_sizes: list[int]) -> None:
    """The client's decode path over `body`, arriving in reads of `read_sizes` bytes (cycled)."""
    subscriber = LaredoSubscriber("http://127.0.0.1:9", "public", "users", key_fields=("id",))
    sequencer = Sequencer(TABLE, None, fallback_after=3)
    decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
    handshaken = False
    offset = 0
    while offset < len(body):
        size = read_sizes[offset % len(read_sizes)]
        for frame in decoder.feed(body[offset:offset + size]):
            if frame.end_stream:
                parse_end_stream(frame.payload)
                return
            message = decode_response(frame.payload)
            if not handshaken:
                if message.WhichOneof("message") != "handshake":
                    return  # the session refuses it (ProtocolError) before any decoding
                sequencer.begin_stream(by_position=False, by_sequence=False)
                sequencer.schema(subscriber.schema_from_handshake(message.handshake))
                handshaken = True
            elif message.WhichOneof("message") != "go_away":
                sequencer.message(message)
            sequencer.take()
        offset += size
    decoder.finish()


@fuzz_settings(400)
@given(inputs(streams()), st.lists(st.integers(1, 64), min_size=1, max_size=4))
def test_sync_streams_decode_or_fail_cleanly(body: bytes, read_sizes: list[int]) -> None:
    guarded(lambda: _consume(body, read_sizes), (FramingError, SourceError))


def test_a_huge_frame_length_is_refused_before_buffering() -> None:
    body = b"\x00\xff\xff\xff\xff" + b"\x00" * 1024
    error = guarded(lambda: _consume(body, [7]), (FramingError,))
    assert error is not None and str(DEFAULT_MAX_FRAME_BYTES) in str(error), error


def test_a_deeply_nested_end_stream_trailer_is_a_framing_error() -> None:
    trailer = b'{"metadata":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error = guarded(lambda: parse_end_stream(trailer), (FramingError,))
    assert error is not None and "nested deeper than" in str(error), error


def test_an_out_of_range_commit_timestamp_is_a_protocol_error() -> None:
    entry = pb.ReplicationJournalEntry(sequence=1, source_position="0/10", action="DELETE")
    entry.old_values.CopyFrom(_struct({"id": 1}))
    entry.timestamp.seconds = 2**62
    sequencer = Sequencer(TABLE, "0/1", fallback_after=3)
    sequencer.begin_stream(by_position=True, by_sequence=False)
    error = guarded(lambda: sequencer.message(pb.SyncResponse(journal_entry=entry)), (SourceError,))
    assert error is not None and "timestamp" in str(error), error
