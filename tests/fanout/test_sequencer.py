"""The laredo client's position state machine, message by message (no network)."""

from __future__ import annotations

import pytest

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.errors import PositionRegression, ProtocolError, SourceConfigError, SourceUnavailable
from resources.subscribers.events import ChangeEvent, ResyncBegin, ResyncEnd, SchemaEvent, TableSchema, TxEnd
from resources.subscribers.laredo import LaredoSubscriber
from resources.subscribers.laredo_sequencer import Sequencer
from snapshot_assets.archive.changes import Action
from tests.fanout.support import COLUMNS, SCHEMA, msg_entry, msg_heartbeat, msg_snapshot


def _feed(sequencer: Sequencer, *messages: pb.SyncResponse) -> list[object]:
    for message in messages:
        sequencer.message(message)
    return list(sequencer.take())


def _positions(events: list[object]) -> list[tuple[str, str]]:
    out = []
    for event in events:
        if isinstance(event, ChangeEvent):
            out.append(("change", event.position))
        elif isinstance(event, (TxEnd, ResyncEnd)):
            out.append((type(event).__name__, event.position))
    return out


def test_groups_close_on_a_new_position_or_a_heartbeat() -> None:
    seq = Sequencer("t", "0/50", fallback_after=100)
    seq.begin_stream(by_position=True, by_sequence=False)
    events = _feed(seq, msg_entry(1, "0/100", 1), msg_entry(2, "0/100", 2), msg_entry(3, "0/200", 3), msg_heartbeat())
    assert _positions(events) == [("change", "0/100"), ("change", "0/100"), ("TxEnd", "0/100"),
                                  ("change", "0/200"), ("TxEnd", "0/200")]
    assert seq.anchor == "0/200"


def test_change_after_its_boundary_was_committed_is_refused() -> None:
    seq = Sequencer("t", "0/50", fallback_after=100)
    seq.begin_stream(by_position=False, by_sequence=False)
    _feed(seq, msg_entry(1, "0/100", 1), msg_heartbeat())
    with pytest.raises(PositionRegression, match="after the boundary at 0/00000100 was committed"):
        _feed(seq, msg_entry(2, "0/100", 2))


def test_unparseable_position_is_a_protocol_error() -> None:
    seq = Sequencer("t", None, fallback_after=100)
    seq.begin_stream(by_position=False, by_sequence=False)
    with pytest.raises(ProtocolError, match="'banana' is not a WAL LSN"):
        _feed(seq, msg_entry(1, "banana", 1))


def test_snapshot_messages_out_of_place() -> None:
    seq = Sequencer("t", None, fallback_after=100)
    row = pb.SyncResponse(snapshot_row=pb.SnapshotRow())
    with pytest.raises(ProtocolError, match="outside a snapshot"):
        _feed(seq, row)
    begin, *_ = msg_snapshot(3, [])
    with pytest.raises(ProtocolError, match="2 rows were sent, 0 arrived"):
        _feed(seq, begin, pb.SyncResponse(snapshot_end=pb.SnapshotEnd(sequence=3, rows_sent=2)))


def test_snapshot_from_a_server_behind_the_committed_position_is_retried() -> None:
    seq = Sequencer("t", "0/500", fallback_after=100)
    seq.begin_stream(by_position=True, by_sequence=False)
    events = _feed(seq, *msg_snapshot(3, [{"id": 1}]))
    assert isinstance(events[0], ResyncBegin) and "resume from 0/500" in events[0].reason
    with pytest.raises(SourceUnavailable, match="behind 0/00000500") as info:
        _feed(seq, msg_entry(4, "0/400", 4))
    assert info.value.transient


def test_resumed_stream_skips_what_was_delivered_and_drops_what_the_anchor_covers() -> None:
    seq = Sequencer("t", "0/50", fallback_after=100)
    seq.begin_stream(by_position=True, by_sequence=False)
    _feed(seq, msg_entry(1, "0/100", 1), msg_entry(2, "0/200", 2), msg_entry(3, "0/200", 3))
    assert (seq.anchor, seq.after_anchor) == ("0/100", 2)
    # A new stream that resumed too early: 0/100 again, then the open transaction in full.
    seq.begin_stream(by_position=True, by_sequence=False)
    events = _feed(seq, msg_entry(11, "0/100", 1), msg_entry(12, "0/200", 2), msg_entry(13, "0/200", 3),
                   msg_entry(14, "0/200", 4), msg_entry(15, "0/300", 5))
    assert _positions(events) == [("change", "0/200"), ("TxEnd", "0/200"), ("change", "0/300")]
    assert [e.sequence for e in events if isinstance(e, ChangeEvent)] == [14, 15]


def test_resumed_stream_that_lost_the_open_transaction_is_refused() -> None:
    seq = Sequencer("t", "0/50", fallback_after=100)
    seq.begin_stream(by_position=True, by_sequence=False)
    _feed(seq, msg_entry(1, "0/100", 1), msg_heartbeat(), msg_entry(2, "0/200", 2))
    seq.begin_stream(by_position=True, by_sequence=False)
    with pytest.raises(ProtocolError, match="does not repeat the 1 change") as info:
        _feed(seq, msg_entry(3, "0/300", 3))
    assert info.value.transient


def test_schema_changes_are_emitted_in_order_and_once() -> None:
    seq = Sequencer("t", "0/50", fallback_after=100)
    seq.begin_stream(by_position=True, by_sequence=False)
    seq.schema(SCHEMA)
    seq.schema(SCHEMA)
    narrower = TableSchema(SCHEMA.table, COLUMNS[:2])
    change = pb.SyncResponse(schema_change=pb.SchemaChangeNotification(
        sequence=2, new_columns=[pb.ColumnDefinition(column_name=c.name, ordinal_position=c.ordinal,
                                                     is_primary_key=c.primary_key,
                                                     primary_key_ordinal=c.primary_key_ordinal)
                                 for c in narrower.columns]))
    events = _feed(seq, msg_entry(1, "", 1), change, msg_entry(3, "0/100", 3))
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["SchemaEvent", "ChangeEvent", "SchemaEvent", "ChangeEvent"]
    second = events[2]
    assert isinstance(second, SchemaEvent) and [c.name for c in second.schema.columns] == ["id", "tenant"]


def test_truncate_carries_no_rows() -> None:
    seq = Sequencer("t", "0/50", fallback_after=100)
    seq.begin_stream(by_position=True, by_sequence=False)
    events = _feed(seq, msg_entry(1, "0/100", 0, Action.TRUNCATE))
    assert events == [ChangeEvent("0/100", Action.TRUNCATE, None, None, None, 1)]


def test_start_position_must_be_an_lsn() -> None:
    subscriber = LaredoSubscriber("http://127.0.0.1:1", "public", "items")
    with pytest.raises(SourceConfigError, match="'12' is not a WAL LSN"):
        next(iter(subscriber.events("12")))


def test_bad_configuration_is_refused_up_front() -> None:
    with pytest.raises(SourceConfigError, match="bad filter"):
        LaredoSubscriber("http://h", "public", "items", filters=[{"field": "a", "equals": 1, "prefix": "x"}])
    with pytest.raises(SourceConfigError, match="unknown laredo protocol"):
        LaredoSubscriber("http://h", "public", "items", protocol="websocket")
