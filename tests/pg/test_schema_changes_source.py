"""The PostgreSQL source meets ALTER TABLE while it streams: a re-sync in the new shape, never a mix.

ADD COLUMN (with and without DEFAULT), DROP COLUMN and column type changes, made while the source
streams or while it is down: the first change of the new shape makes the source announce a re-sync
(reason `schema change`), then the table copied in the new shape (every row, as the source reads it
now: the default filled, the column gone, the values converted), consistent at a position after
that change, then the stream again. The table's own slot is kept through it all, the temporary
slot that exported the copy's snapshot is gone afterwards, and a re-sync cut short (the process
dies in the middle) is simply done again from the last acknowledged position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from resources.subscribers.events import (
    SCHEMA_CHANGE,
    ChangeEvent,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from resources.subscribers.postgres import PostgresSubscriber
from snapshot_assets.archive.changes import Row
from snapshot_assets.archive.positions import format_lsn
from tests.pg import test_postgres_source as pgsrc
from tests.pg.test_postgres_source import Db, Names, Stream

# The module's fixtures, under the names the tests ask for.
db = pgsrc.db
source = pgsrc.source

Source = Callable[..., tuple[PostgresSubscriber, Names]]


class Resync:
    """One re-sync as the stream delivered it: its events in order, schema, rows and end."""

    def __init__(self, events: list[Event]) -> None:
        self.kinds = [type(e) for e in events]
        begins = [e for e in events if isinstance(e, ResyncBegin)]
        assert len(begins) == 1, self.kinds
        self.reason = begins[0].reason
        self.schema = next(e.schema for e in events if isinstance(e, SchemaEvent))
        self.rows = {row["id"]: row for row in (e.row for e in events if isinstance(e, SnapshotRow))}
        end = events[-1]
        assert isinstance(end, ResyncEnd)
        self.end = end
        self.before = [e for e in events[:self.kinds.index(ResyncBegin)]]

    def column(self, name: str) -> Any:
        return next(c for c in self.schema.columns if c.name == name)


def next_resync(stream: Stream, timeout: float = 20) -> Resync:
    return Resync(stream._until(lambda e: isinstance(e, ResyncEnd), timeout))


def table_rows(db: Db, name: str) -> dict[Any, Row]:
    return {key[0]: row for key, row in pgsrc._table(db, name).items()}


def wal_now(db: Db) -> int:
    return pgsrc._lsn(db.run("SELECT pg_current_wal_lsn()::text")[0][0])


def slots_of(db: Db, names: Names) -> list[str]:
    rows = db.run("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s ORDER BY 1", names.slot + "%")
    return [name for (name,) in rows]


def wait_for_slots(db: Db, names: Names, expected: list[str], timeout: float = 10) -> None:
    """The temporary slot goes when its connection does: poll with a deadline for what remains."""
    deadline = time.monotonic() + timeout
    while slots_of(db, names) != expected:
        assert time.monotonic() < deadline, f"slots {slots_of(db, names)}, expected {expected}"
        time.sleep(0.05)


def wait_for_confirmed(db: Db, names: Names, position: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while pgsrc._confirmed(db, names.slot) != pgsrc._lsn(position):
        assert time.monotonic() < deadline, f"the slot never confirmed {position}"
        time.sleep(0.05)


class Started:
    """A subscriber after the initial load of a fresh table; `schema` is the one it announced."""

    def __init__(self, source: Source, db: Db, columns: str, *rows: str) -> None:
        self.sub, self.names = source()
        db.run(f"CREATE TABLE {self.names.table} ({columns})")
        for row in rows:
            db.run(f"INSERT INTO {self.names.table} VALUES {row}")
        self.stream = Stream(self.sub.events(None))
        self.schema: TableSchema = self.stream.initial()[0]


def test_add_column_with_default_resyncs_every_row_in_the_new_shape(source: Source, db: Db) -> None:
    first = Started(source, db, "id int PRIMARY KEY, v int", "(1, 10)", "(2, 20)")
    names, stream = first.names, first.stream
    db.tx(f"INSERT INTO {names.table} VALUES (3, 30)")
    (before,) = stream.transactions(1)
    assert [c.new for c in before.changes] == [{"id": 3, "v": 30}]
    db.tx(f"ALTER TABLE {names.table} ADD COLUMN extra int DEFAULT 5")  # no row changes: nothing sent yet
    altered_at = wal_now(db)
    db.tx(f"UPDATE {names.table} SET v = 11 WHERE id = 1")  # the first change of the new shape

    resync = next_resync(stream)
    assert resync.reason == SCHEMA_CHANGE
    assert resync.kinds[:2] == [ResyncBegin, SchemaEvent]  # the buffer seals the old shape first
    assert resync.rows == table_rows(db, names.table)
    assert resync.rows[2] == {"id": 2, "v": 20, "extra": 5}  # filled by the source, never seen in a change
    assert [c.name for c in resync.schema.columns] == ["id", "v", "extra"]
    extra = resync.column("extra")
    assert (extra.type, extra.type_oid, extra.default, extra.nullable) == ("integer", 23, "5", True)
    assert pgsrc._lsn(resync.end.position) > altered_at

    # Acknowledgements: the slot holds on to everything after the last acknowledged position
    # through the re-sync, then follows the copy's position and the stream after it.
    first.sub.acknowledge(before.position)
    assert pgsrc._confirmed(db, names.slot) <= pgsrc._lsn(before.position)
    with pytest.raises(ValueError, match="beyond the last position"):
        first.sub.acknowledge(format_lsn(pgsrc._lsn(resync.end.position) + 1))
    first.sub.acknowledge(resync.end.position)
    db.tx(f"INSERT INTO {names.table} (id, v) VALUES (4, 40)")
    (after,) = stream.transactions(1)
    assert [c.new for c in after.changes] == [{"id": 4, "v": 40, "extra": 5}]
    assert all(isinstance(e, ChangeEvent | TxEnd) for e in after.events)
    wait_for_confirmed(db, names, resync.end.position)
    first.sub.acknowledge(after.position)
    wait_for_confirmed(db, names, after.position)
    wait_for_slots(db, names, [names.slot])  # the table's slot stays; the temporary one is gone


def test_a_change_of_shape_inside_a_transaction_drops_its_partial_old_shape_changes(
        source: Source, db: Db) -> None:
    first = Started(source, db, "id int PRIMARY KEY, v int, note text", "(1, 10, 'a')")
    names, stream = first.names, first.stream
    db.tx(f"INSERT INTO {names.table} VALUES (2, 20, 'b')",
          f"ALTER TABLE {names.table} DROP COLUMN note",
          f"INSERT INTO {names.table} VALUES (3, 30)")
    resync = next_resync(stream)
    # The old-shape insert of the same transaction came first, with no transaction end: the buffer
    # drops it (a partial transaction), and the copy holds the whole transaction.
    assert [isinstance(e, ChangeEvent) for e in resync.before] == [True]
    assert resync.reason == SCHEMA_CHANGE
    assert resync.rows == {1: {"id": 1, "v": 10}, 2: {"id": 2, "v": 20}, 3: {"id": 3, "v": 30}}
    assert [c.name for c in resync.schema.columns] == ["id", "v"]
    db.tx(f"DELETE FROM {names.table} WHERE id = 1")
    (after,) = stream.transactions(1)
    assert [(c.action.value, c.old) for c in after.changes] == [("DELETE", {"id": 1})]


@pytest.mark.parametrize(("new_type", "oid", "converted"), [("bigint", 20, 10), ("text", 25, "10"),
                                                            ("varchar(12)", 1043, "10")])
def test_a_column_type_change_resyncs_with_every_value_converted(
        source: Source, db: Db, new_type: str, oid: int, converted: Any) -> None:
    first = Started(source, db, "id int PRIMARY KEY, v int", "(1, 10)", "(2, NULL)")
    names, stream = first.names, first.stream
    db.tx(f"ALTER TABLE {names.table} ALTER COLUMN v TYPE {new_type}")
    db.tx(f"INSERT INTO {names.table} VALUES (3, 30)")
    resync = next_resync(stream)
    assert resync.reason == SCHEMA_CHANGE
    assert resync.rows == table_rows(db, names.table)
    assert resync.rows[1]["v"] == converted and resync.rows[2]["v"] is None
    v = resync.column("v")
    assert v.type_oid == oid and v.max_length == (12 if oid == 1043 else 0)


def test_add_column_without_default_and_then_more_changes_stream_in_the_new_shape(
        source: Source, db: Db) -> None:
    first = Started(source, db, "id int PRIMARY KEY", "(1)")
    names, stream = first.names, first.stream
    db.tx(f"ALTER TABLE {names.table} ADD COLUMN tag text", f"INSERT INTO {names.table} VALUES (2, 'x')")
    resync = next_resync(stream)
    assert resync.rows == {1: {"id": 1, "tag": None}, 2: {"id": 2, "tag": "x"}}
    db.tx(f"UPDATE {names.table} SET tag = 'y' WHERE id = 1")
    db.tx(f"ALTER TABLE {names.table} ALTER COLUMN tag SET DEFAULT 'z'")  # no new shape: no re-sync
    db.tx(f"INSERT INTO {names.table} (id) VALUES (3)")
    txs = stream.transactions(2)
    assert [[c.new for c in tx.changes] for tx in txs] == [[{"id": 1, "tag": "y"}], [{"id": 3, "tag": "z"}]]


def test_a_restart_after_alter_table_resyncs_when_the_caller_holds_the_old_shape(
        source: Source, db: Db) -> None:
    first = Started(source, db, "id int PRIMARY KEY, v int", "(1, 10)")
    names, old_schema = first.names, first.schema
    db.tx(f"INSERT INTO {names.table} VALUES (2, 20)")
    (tx,) = first.stream.transactions(1)
    first.sub.acknowledge(tx.position)
    first.sub.close()
    pgsrc._wait_inactive(db, names.slot)
    # While the source is down: the shape changes before any further change of a row, so the stream
    # after the resume position only ever shows the new shape; only the caller knows it held the old.
    db.tx(f"ALTER TABLE {names.table} ADD COLUMN extra int DEFAULT 7")

    resumed, _ = source()
    resumed.resume_schema(old_schema)
    stream = Stream(resumed.events(tx.position))
    assert stream.schema() == old_schema  # what the rows through the resume position look like
    db.tx(f"INSERT INTO {names.table} VALUES (3, 30, 8)")
    resync = next_resync(stream)
    assert resync.reason == SCHEMA_CHANGE
    assert resync.rows == {1: {"id": 1, "v": 10, "extra": 7}, 2: {"id": 2, "v": 20, "extra": 7},
                           3: {"id": 3, "v": 30, "extra": 8}}
    resumed.acknowledge(resync.end.position)
    resumed.close()
    pgsrc._wait_inactive(db, names.slot)

    # Held in the new shape: the same kind of restart streams on without a re-sync.
    again, _ = source()
    again.resume_schema(resync.schema)
    stream = Stream(again.events(resync.end.position))
    assert stream.schema() == resync.schema
    db.tx(f"UPDATE {names.table} SET extra = 9 WHERE id = 1")
    (tx,) = stream.transactions(1)
    assert [c.new for c in tx.changes] == [{"id": 1, "v": 10, "extra": 9}]


def test_a_resync_cut_short_keeps_the_slot_and_is_done_again_on_resume(source: Source, db: Db) -> None:
    rows = ", ".join(f"({i}, {i})" for i in range(1, 301))
    first = Started(source, db, "id int PRIMARY KEY, v int", rows)
    sub, names, stream, schema = first.sub, first.names, first.stream, first.schema
    db.tx(f"INSERT INTO {names.table} VALUES (301, 301)")
    (tx,) = stream.transactions(1)
    sub.acknowledge(tx.position)
    wait_for_confirmed(db, names, tx.position)
    db.tx(f"ALTER TABLE {names.table} ALTER COLUMN v TYPE bigint", f"UPDATE {names.table} SET v = 0 WHERE id = 1")
    events = stream._until(lambda e: isinstance(e, SnapshotRow), 20)  # the copy has begun...
    assert any(isinstance(e, ResyncBegin) for e in events)
    sub.close()  # ...and the process dies: nothing after the acknowledged position was confirmed
    pgsrc._wait_inactive(db, names.slot)
    wait_for_slots(db, names, [names.slot])
    assert pgsrc._confirmed(db, names.slot) == pgsrc._lsn(tx.position)

    resumed, _ = source()
    resumed.resume_schema(schema)
    stream = Stream(resumed.events(tx.position))
    stream.schema()
    resync = next_resync(stream)
    assert resync.rows == table_rows(db, names.table) and len(resync.rows) == 301
    assert resync.rows[1] == {"id": 1, "v": 0}

