"""Rows and changes without a usable key are refused at ingest, naming table, field and position.

Before this rule, a change lacking a key field was keyed `[null]` and every such row folded into
one (three inserts into a table keyed `user_id`, read with key fields `[id]`, left one row). Now
the buffer refuses it before anything is written: the open transaction is never sealed, and the
buffer reopens exactly as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.buffer import BadChange, ChangeBuffer
from resources.subscribers.events import ChangeEvent, Column, Event, SnapshotRow, TableSchema, TxEnd
from snapshot_assets.archive.changes import Action
from tests.buffer.helpers import buffer_rows, initial_load, lsn

T = "public.accounts"
SCHEMA = TableSchema(T, (Column("user_id", "bigint", False, primary_key=True, ordinal=1, primary_key_ordinal=1),
                         Column("tenant", "text", False, primary_key=True, ordinal=2, primary_key_ordinal=2),
                         Column("name", "text", ordinal=3)))


def row(user_id: int, name: str = "x") -> dict[str, object]:
    return {"user_id": user_id, "tenant": "acme", "name": name}


def loaded(root: Path) -> ChangeBuffer:
    buf = ChangeBuffer(root, T, seal_interval=3600.0)
    for event in initial_load(SCHEMA, lsn(100), [row(1)]):
        buf.append(event)
    return buf


@pytest.mark.parametrize(("bad", "message"), [
    (ChangeEvent(lsn(200), Action.INSERT, new={"user_id": 3, "name": "no tenant"}),
     "INSERT at 0/000000C8: the new row lacks key field 'tenant' (key fields ['user_id', 'tenant'])"),
    (ChangeEvent(lsn(200), Action.UPDATE, old=None, new={"tenant": "acme", "name": "no user_id"}),
     "UPDATE at 0/000000C8: the new row lacks key field 'user_id'"),
    (ChangeEvent(lsn(200), Action.DELETE, old={"user_id": 1}),
     "DELETE at 0/000000C8: the before-image lacks key field 'tenant'"),
    (ChangeEvent(lsn(200), Action.INSERT, new={"user_id": None, "tenant": "acme", "name": "null key"}),
     "INSERT at 0/000000C8: the new row has NULL in key field 'user_id'"),
    (ChangeEvent(lsn(200), Action.UPDATE, old={"user_id": 1, "tenant": None}, new=row(1)),
     "UPDATE at 0/000000C8: the before-image has NULL in key field 'tenant'"),
])
def test_a_change_without_its_key_is_refused_and_nothing_is_buffered(tmp_path: Path, bad: ChangeEvent,
                                                                      message: str) -> None:
    with loaded(tmp_path) as buf:
        buf.append(ChangeEvent(lsn(200), Action.INSERT, new=row(2)))  # same transaction, before the bad one
        with pytest.raises(BadChange) as info:
            buf.append(bad)
        text = str(info.value)
        assert text.startswith(f"table {T}: "), text
        assert message in text
        assert buf.durable_position() == lsn(100)
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as reopened:
        assert reopened.durable_position() == lsn(100)
    assert [r["action"] for r in buffer_rows(tmp_path, T)] == ["SNAPSHOT"]


def test_a_snapshot_row_without_its_key_is_refused(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as buf:
        events: list[Event] = initial_load(SCHEMA, lsn(100), [row(1), row(2)])[:-1]
        for event in events:
            buf.append(event)
        with pytest.raises(BadChange) as info:
            buf.append(SnapshotRow({"tenant": "acme", "name": "no user_id"}))
        assert str(info.value) == (f"table {T}: re-sync row 3 (initial load, after the start) lacks key field "
                                   "'user_id' (key fields ['user_id', 'tenant'])")
        assert buf.durable_position() is None


def test_a_partial_before_image_of_an_update_is_not_a_key_change(tmp_path: Path) -> None:
    """REPLICA IDENTITY DEFAULT sends no key in `old` when the key did not change: that is no error."""
    with loaded(tmp_path) as buf:
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, old={"name": "x"}, new=row(1, "y")))
        buf.append(TxEnd(lsn(200)))
        assert buf.seal()
    last = buffer_rows(tmp_path, T)[-1]
    assert (last["action"], last["key"]) == ("UPDATE", '[1,"acme"]')


def test_three_inserts_keyed_by_user_id_stay_three_keys(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as buf:
        for event in initial_load(SCHEMA, lsn(100)):
            buf.append(event)
        for i in (1, 2, 3):
            buf.append(ChangeEvent(lsn(200), Action.INSERT, new=row(i)))
        buf.append(TxEnd(lsn(200)))
        assert buf.seal()
    assert [r["key"] for r in buffer_rows(tmp_path, T)] == ['[1,"acme"]', '[2,"acme"]', '[3,"acme"]']
