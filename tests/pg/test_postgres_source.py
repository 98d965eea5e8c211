"""The PostgreSQL source against a real private cluster: load, stream, resume, types, TOAST, errors.

Every test uses its own table, slot and publication, so tests are independent; the cluster is
shared for the session (tests/pg/conftest.py). Reads from the endless stream are bounded by a
deadline (SIGALRM), so a missing event fails the test instead of hanging it.
"""

from __future__ import annotations

import random
import secrets
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest

from resources.subscribers import pgoutput
from resources.subscribers.errors import (
    NoPrimaryKey,
    SlotInUse,
    SlotLost,
    SourceConfigError,
    SourceUnavailable,
    UnknownTable,
)
from resources.subscribers.events import (
    ChangeEvent,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from resources.subscribers.postgres import PostgresSubscriber, fill_unchanged
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.positions import format_lsn, parse_lsn
from tests.pg.conftest import PgCluster


class _Deadline(Exception):
    """Raised by SIGALRM when a stream read takes too long (not an OSError, so never retried)."""


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Deadline("timed out waiting for events")


class Stream:
    """Reads an endless event iterator in bounded steps."""

    def __init__(self, events: Iterator[Event]) -> None:
        self.events = events

    def _until(self, stop: Callable[[Event], bool], timeout: float) -> list[Event]:
        previous = signal.signal(signal.SIGALRM, _alarm)
        outer, _ = signal.setitimer(signal.ITIMER_REAL, timeout)  # pytest-timeout's deadline, put back below
        started = time.monotonic()
        try:
            out: list[Event] = []
            for event in self.events:
                out.append(event)
                if stop(event):
                    return out
            raise AssertionError("the stream ended")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer:
                signal.setitimer(signal.ITIMER_REAL, max(0.001, outer - (time.monotonic() - started)))

    def initial(self, timeout: float = 20) -> tuple[TableSchema, list[Row], ResyncEnd, str]:
        """Schema, snapshot rows, the ResyncEnd and the ResyncBegin reason of a (re-)sync."""
        events = self._until(lambda e: isinstance(e, ResyncEnd), timeout)
        schema = next(e.schema for e in events if isinstance(e, SchemaEvent))
        reason = next(e.reason for e in events if isinstance(e, ResyncBegin))
        end = events[-1]
        assert isinstance(end, ResyncEnd)
        return schema, [e.row for e in events if isinstance(e, SnapshotRow)], end, reason

    def schema(self, timeout: float = 10) -> TableSchema:
        event = self._until(lambda e: True, timeout)[0]
        assert isinstance(event, SchemaEvent), event
        return event.schema

    def transactions(self, count: int, timeout: float = 10) -> list[Tx]:
        """The next `count` transactions."""
        return [Tx(self._until(lambda e: isinstance(e, TxEnd), timeout)) for _ in range(count)]


class Tx:
    """One transaction's events: `events` end with `end`, the TxEnd; `changes` are its row changes."""

    def __init__(self, events: list[Event]) -> None:
        end = events[-1]
        assert isinstance(end, TxEnd)
        self.events = events
        self.end = end
        self.position = end.position
        self.changes = [e for e in events if isinstance(e, ChangeEvent)]


class Db:
    """An autocommit connection for arranging the source table."""

    def __init__(self, cluster: PgCluster) -> None:
        self.conn = cluster.connect()

    def run(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description else []

    def tx(self, *statements: str) -> None:
        """Run statements as one transaction."""
        self.run("BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT")

    def slot(self, name: str) -> tuple[Any, ...] | None:
        rows = self.run("SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots "
                        "WHERE slot_name = %s", name)
        return rows[0] if rows else None


@pytest.fixture(scope="module")
def db(pg_cluster: PgCluster) -> Iterator[Db]:
    handle = Db(pg_cluster)
    yield handle
    handle.conn.close()


class Names:
    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.table = f"t_{suffix}"
        self.slot = f"s_{suffix}"
        self.publication = f"p_{suffix}"


@pytest.fixture
def source(pg_dsn: str, db: Db) -> Iterator[Callable[..., tuple[PostgresSubscriber, Names]]]:
    """A factory for subscribers on fresh names; everything they created is dropped afterwards."""
    created: list[tuple[PostgresSubscriber, Names]] = []
    names = Names()

    def make(dsn: str = pg_dsn, **overrides: Any) -> tuple[PostgresSubscriber, Names]:
        options: dict[str, Any] = {"table": names.table, "slot": names.slot,
                                   "publication": names.publication, "status_interval": 1.0}
        options.update(overrides)
        sub = PostgresSubscriber(dsn, **options)
        created.append((sub, names))
        return sub, names

    yield make
    for sub, _ in created:
        sub.close()
    _wait_inactive(db, names.slot)
    if db.slot(names.slot):
        db.run("SELECT pg_drop_replication_slot(%s)", names.slot)
    db.run(f"DROP PUBLICATION IF EXISTS {names.publication}")
    db.run(f"DROP TABLE IF EXISTS {names.table}")


def _wait_inactive(db: Db, slot: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while (state := db.slot(slot)) and state[1] and time.monotonic() < deadline:
        time.sleep(0.05)


def _confirmed(db: Db, slot: str) -> int:
    """The slot's confirmed_flush_lsn (PostgreSQL prints it unpadded, so compare numbers)."""
    state = db.slot(slot)
    assert state is not None
    return _lsn(state[0])


def _lsn(position: str) -> int:
    value = parse_lsn(position)
    assert value is not None, position
    return value


def _table(db: Db, name: str, key: str = "id") -> dict[Any, Row]:
    """The table's rows as the source would convert them (through a fresh initial-load-free query)."""
    cur = db.conn.cursor()
    cur.execute(f"SELECT to_jsonb(t) FROM {name} t")
    return {tuple(row[k] for k in key.split(",")): row for (row,) in cur.fetchall()}


# --- initial load and streaming -------------------------------------------------------------


def test_initial_load_equals_table_and_is_positioned_before_the_slot(source: Any, db: Db) -> None:
    sub, names = source(batch_size=64)
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY, name text NOT NULL, score bigint)")
    db.run(f"INSERT INTO {names.table} SELECT g, 'name ' || g, g::bigint * 1000000007 FROM generate_series(1, 500) g")
    schema, rows, end, reason = Stream(sub.events(None)).initial()
    assert reason == "initial load"
    assert schema.table == f"public.{names.table}"
    assert schema.key_fields == ("id",)
    assert [(c.name, c.type, c.nullable) for c in schema.columns] == [
        ("id", "integer", False), ("name", "text", False), ("score", "bigint", True)]
    assert end.row_count == 500
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": g, "name": f"name {g}", "score": g * 1000000007} for g in range(1, 501)]
    assert _lsn(end.position) == _confirmed(db, names.slot) - 1


def test_changes_share_their_commit_lsn_and_end_with_txend(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY, v text)")
    db.run(f"CREATE TABLE {names.table}_other (id int PRIMARY KEY)")
    stream = Stream(sub.events(None))
    stream.initial()
    db.tx(f"INSERT INTO {names.table} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    db.tx(f"INSERT INTO {names.table}_other VALUES (1)")  # touches no row of ours: no events at all
    db.run("SELECT 1")  # an empty transaction
    db.tx(f"UPDATE {names.table} SET v = 'bb' WHERE id = 2", f"DELETE FROM {names.table} WHERE id = 3")
    first, second = stream.transactions(2)
    db.run(f"DROP TABLE {names.table}_other")
    for tx in (first, second):
        assert tx.events[-1] is tx.end
        assert {c.position for c in tx.changes} == {tx.position}
        assert all(c.commit_time is not None and c.commit_time.tzinfo is not None for c in tx.changes)
    assert _lsn(first.position) < _lsn(second.position)
    assert [(c.action, c.new) for c in first.changes] == [
        (Action.INSERT, {"id": 1, "v": "a"}), (Action.INSERT, {"id": 2, "v": "b"}),
        (Action.INSERT, {"id": 3, "v": "c"})]
    assert [(c.action, c.old, c.new) for c in second.changes] == [
        (Action.UPDATE, None, {"id": 2, "v": "bb"}), (Action.DELETE, {"id": 3}, None)]


def test_resume_replays_nothing_before_and_loses_nothing_after(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY)")
    stream = Stream(sub.events(None))
    stream.initial()
    for i in range(1, 4):
        db.tx(f"INSERT INTO {names.table} VALUES ({i})")
    txs = stream.transactions(3)
    acked = txs[1].position  # durable up to the second transaction
    sub.acknowledge(acked)
    sub.close()
    db.tx(f"INSERT INTO {names.table} VALUES (4)")  # while the subscriber is down
    _wait_inactive(db, names.slot)
    resumed, _ = source()
    stream = Stream(resumed.events(acked))
    assert stream.schema().key_fields == ("id",)
    db.tx(f"INSERT INTO {names.table} VALUES (5)")
    replayed = stream.transactions(3)
    assert [[c.new for c in tx.changes] for tx in replayed] == [[{"id": 3}], [{"id": 4}], [{"id": 5}]]
    assert replayed[0].end == txs[2].end  # the same transaction has the same position
    assert all(isinstance(e, ChangeEvent | TxEnd) for tx in replayed for e in tx.events)


def test_acknowledge_advances_the_slot_and_never_beyond(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY)")
    stream = Stream(sub.events(None))
    stream.initial()
    db.tx(f"INSERT INTO {names.table} VALUES (1)")
    db.tx(f"INSERT INTO {names.table} VALUES (2)")
    first, second = stream.transactions(2)
    sub.acknowledge(first.position)
    target = _lsn(first.position)
    deadline = time.monotonic() + 5
    while _confirmed(db, names.slot) != target and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _confirmed(db, names.slot) == target
    beyond = format_lsn(_lsn(second.position) + 1)
    with pytest.raises(ValueError, match="beyond the last position"):
        sub.acknowledge(beyond)


def test_busy_slot_and_lost_connection_are_transient_and_resumable(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY)")
    stream = Stream(sub.events(None))
    stream.initial()
    db.tx(f"INSERT INTO {names.table} VALUES (1)")
    (tx,) = stream.transactions(1)
    durable = tx.position
    rival, _ = source()
    with pytest.raises(SlotInUse) as busy:
        Stream(rival.events(durable)).transactions(1)
    assert busy.value.transient and names.table in str(busy.value)
    db.run("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s", names.slot)
    with pytest.raises(SourceUnavailable) as lost:
        stream.transactions(1)
    assert lost.value.transient and names.table in str(lost.value)
    _wait_inactive(db, names.slot)
    db.tx(f"INSERT INTO {names.table} VALUES (2)")
    resumed, _ = source()
    stream = Stream(resumed.events(durable))
    stream.schema()
    assert [c.new for c in stream.transactions(1)[0].changes] == [{"id": 2}]


def test_a_new_initial_load_replaces_the_slot_unless_create_slot_is_off(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY)")
    db.run(f"INSERT INTO {names.table} VALUES (1)")
    Stream(sub.events(None)).initial()
    sub.close()
    _wait_inactive(db, names.slot)
    db.run(f"INSERT INTO {names.table} VALUES (2)")
    again, _ = source()
    _, rows, _, _ = Stream(again.events(None)).initial()  # e.g. a crash before the load was durable
    assert sorted(r["id"] for r in rows) == [1, 2]
    again.close()
    _wait_inactive(db, names.slot)
    manual, _ = source(create_slot=False)
    with pytest.raises(SourceConfigError, match="create_slot is false") as caught:
        Stream(manual.events(None)).initial()
    assert names.slot in str(caught.value) and not caught.value.transient


def test_an_existing_publication_must_cover_the_table(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY)")
    db.run(f"CREATE TABLE {names.table}_x (id int PRIMARY KEY)")
    db.run(f"CREATE PUBLICATION {names.publication} FOR TABLE {names.table}_x")
    with pytest.raises(SourceConfigError, match="does not include the table"):
        next(sub.events(None))
    db.run(f"DROP PUBLICATION {names.publication}")
    db.run(f"CREATE PUBLICATION {names.publication} FOR TABLE {names.table} WITH (publish = 'insert')")
    with pytest.raises(SourceConfigError, match="does not publish every action"):
        next(sub.events(None))
    db.run(f"DROP TABLE {names.table}_x")


# --- type fidelity --------------------------------------------------------------------------

_TYPES_DDL = """
CREATE TYPE {t}_mood AS ENUM ('sad', 'happy');
CREATE DOMAIN {t}_posint AS int CHECK (VALUE > 0);
CREATE TABLE {t} (
  id int PRIMARY KEY, i2 smallint, i4 int, i8 bigint, i8min bigint, n numeric, nnan numeric,
  f4 real, f8 double precision, f8nan double precision, f8inf double precision, b bool,
  t text, vc varchar(10), ch char(5), u uuid, ts timestamp, tstz timestamptz, tsinf timestamptz,
  d date, ti time, iv interval, by bytea, j json, jb jsonb, ia int[], ta text[], i2d int[],
  ba bool[], bounded int[], ea int[], tad text[], tsbc timestamptz, dom {t}_posint, en {t}_mood,
  nul text
)"""
_TYPES_VALUES = """
(%s, -32768, 2147483647, 9007199254740993, -9223372036854775808,
 12345678901234567890.123456789012345678901234567890, 'NaN', 1.5, 0.1, 'NaN', 'Infinity', true,
 'héllo ✓ 𝄞 "quoted" \\ back', 'short', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
 '2024-05-01 12:34:56.789', '2024-05-01 12:00:00.123456+02', 'infinity', '2024-02-29', '13:14:15',
 '1 day 02:03:04', '\\x00ff10', '{"a": [1, 2.5, {"b": null}], "big": 12345678901234567890}',
 '{"z": {"y": [true, false, "s"]}, "n": -1}', '{1,NULL,3}',
 ARRAY['a b', 'c,d', 'NULL', NULL, 'q"uote', 'back\\slash', ''], '{{1,2},{3,4}}', '{t,f}',
 '[0:1]={5,6}', '{}', '{{"x y","}"},{NULL,"\\\\"}}', '0044-03-15 12:00:00+00 BC', 7, 'happy',
 NULL)"""
_TYPES_EXPECTED: Row = {
    "i2": -32768, "i4": 2147483647, "i8": 9007199254740993, "i8min": -9223372036854775808,
    "n": "12345678901234567890.123456789012345678901234567890", "nnan": "NaN", "f4": 1.5, "f8": 0.1,
    "f8nan": "NaN", "f8inf": "Infinity", "b": True, "t": 'héllo ✓ 𝄞 "quoted" \\ back', "vc": "short",
    "ch": "ab   ", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "ts": "2024-05-01T12:34:56.789",
    "tstz": "2024-05-01T10:00:00.123456Z", "tsinf": "infinity", "d": "2024-02-29", "ti": "13:14:15",
    "iv": "1 day 02:03:04", "by": "AP8Q",
    "j": {"a": [1, 2.5, {"b": None}], "big": 12345678901234567890},
    "jb": {"z": {"y": [True, False, "s"]}, "n": -1}, "ia": [1, None, 3],
    "ta": ["a b", "c,d", "NULL", None, 'q"uote', "back\\slash", ""], "i2d": [[1, 2], [3, 4]],
    "ba": [True, False], "bounded": "[0:1]={5,6}", "ea": [], "tad": [["x y", "}"], [None, "\\"]],
    "tsbc": "0044-03-15 12:00:00+00 BC", "dom": 7, "en": "happy", "nul": None,
}


def test_every_common_type_round_trips_identically_in_copy_and_stream(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(_TYPES_DDL.format(t=names.table))
    db.run(f"INSERT INTO {names.table} VALUES {_TYPES_VALUES}", 1)
    stream = Stream(sub.events(None))
    _, rows, _, _ = stream.initial()
    db.run(f"INSERT INTO {names.table} VALUES {_TYPES_VALUES}", 2)
    (tx,) = stream.transactions(1)
    streamed = tx.changes[0].new
    assert rows == [{"id": 1, **_TYPES_EXPECTED}]
    assert streamed == {"id": 2, **_TYPES_EXPECTED}
    assert list(streamed) == list(rows[0])  # same column order too
    db.run(f"DROP TABLE {names.table}; DROP TYPE {names.table}_mood; DROP DOMAIN {names.table}_posint")


def test_malformed_pgoutput_is_a_decode_error_not_a_skip() -> None:
    with pytest.raises(pgoutput.PgOutputError, match="truncated"):
        pgoutput.decode(b"I\x00\x00\x40\x00N\x00\x01t\x00\x00\x00\x09abc")
    with pytest.raises(pgoutput.PgOutputError, match="Stream Start"):
        pgoutput.decode(b"S\x00\x00\x00\x01\x01")


# --- TOAST ----------------------------------------------------------------------------------

def _toast_table(db: Db, name: str, identity: str) -> str:
    big = secrets.token_hex(12_000)  # 24 KB of incompressible-ish text, stored out of line
    db.run(f"CREATE TABLE {name} (id int PRIMARY KEY, big text, n int)")
    db.run(f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL, REPLICA IDENTITY {identity}")
    db.run(f"INSERT INTO {name} VALUES (1, %s, 0)", big)
    return big


def test_unchanged_toast_is_kept_under_replica_identity_full(source: Any, db: Db) -> None:
    sub, names = source()
    big = _toast_table(db, names.table, "FULL")
    stream = Stream(sub.events(None))
    stream.initial()
    db.tx(f"UPDATE {names.table} SET n = 1 WHERE id = 1")
    (tx,) = stream.transactions(1)
    (change,) = tx.changes
    assert isinstance(change, ChangeEvent)
    assert change.new == {"id": 1, "big": big, "n": 1}
    assert change.old == {"id": 1, "big": big, "n": 0}


def test_unchanged_toast_is_marked_and_restored_under_default_identity(source: Any, db: Db) -> None:
    sub, names = source()
    big = _toast_table(db, names.table, "DEFAULT")
    stream = Stream(sub.events(None))
    _, rows, _, _ = stream.initial()
    db.tx(f"UPDATE {names.table} SET n = 1 WHERE id = 1")
    db.tx(f"UPDATE {names.table} SET id = 2 WHERE id = 1")  # key change, big still not resent
    first, second = (tx.changes[0] for tx in stream.transactions(2))
    assert first.unchanged == ("big",)
    assert first.new == {"id": 1, "n": 1}
    restored = fill_unchanged(first, rows[0])
    assert type(restored) is ChangeEvent and restored.new == {"id": 1, "big": big, "n": 1}
    assert second.unchanged and second.old == {"id": 1}
    assert fill_unchanged(second, restored.new).new == {"id": 2, "n": 1, "big": big}
    with pytest.raises(ValueError, match="unchanged TOASTed"):
        fill_unchanged(first, {"id": 1})


def test_require_full_refuses_a_toastable_table_without_full_identity(source: Any, db: Db) -> None:
    sub, names = source(unchanged_toast="require-full")
    _toast_table(db, names.table, "DEFAULT")
    with pytest.raises(SourceConfigError, match="REPLICA IDENTITY FULL") as caught:
        next(sub.events(None))
    assert names.table in str(caught.value) and not caught.value.transient


# --- keys, identities, truncate -------------------------------------------------------------

def test_composite_key_pk_change_delete_and_truncate(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (a int, b text, v int, PRIMARY KEY (b, a))")
    db.run(f"INSERT INTO {names.table} VALUES (1, 'x', 10), (2, 'x', 20)")
    stream = Stream(sub.events(None))
    schema, _, _, _ = stream.initial()
    assert schema.key_fields == ("b", "a")
    db.tx(f"UPDATE {names.table} SET b = 'y' WHERE a = 1")
    db.tx(f"DELETE FROM {names.table} WHERE a = 2")
    db.tx(f"TRUNCATE {names.table}")
    update, delete, truncate = (tx.changes for tx in stream.transactions(3))
    assert [(c.action, c.old, c.new) for c in update] == [
        (Action.UPDATE, {"b": "x", "a": 1}, {"a": 1, "b": "y", "v": 10})]
    assert [(c.action, c.old, c.new) for c in delete] == [(Action.DELETE, {"b": "x", "a": 2}, None)]
    assert [(c.action, c.old, c.new) for c in truncate] == [(Action.TRUNCATE, None, None)]


def test_replica_identity_full_sends_whole_old_rows(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY, v text)")
    db.run(f"ALTER TABLE {names.table} REPLICA IDENTITY FULL")
    db.run(f"INSERT INTO {names.table} VALUES (1, 'a')")
    stream = Stream(sub.events(None))
    stream.initial()
    db.tx(f"UPDATE {names.table} SET v = 'b'", f"DELETE FROM {names.table}")
    (tx,) = stream.transactions(1)
    assert [(c.action, c.old, c.new) for c in tx.changes] == [
        (Action.UPDATE, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
        (Action.DELETE, {"id": 1, "v": "b"}, None)]


# --- a concurrent workload: snapshot + stream equals the table ------------------------------

def _workload(dsn: str, table: str, stop: threading.Event, seed: int, counts: list[int]) -> None:
    """Small random transactions until `stop`; appends the number committed to `counts`."""
    rng = random.Random(seed)
    conn = psycopg2.connect(dsn)
    committed = 0
    try:
        cur = conn.cursor()
        while not stop.is_set():
            for _ in range(rng.randint(1, 4)):
                key = rng.randint(1, 60)
                choice = rng.random()
                if choice < 0.45:
                    cur.execute(f"INSERT INTO {table} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                                "SET v = excluded.v", (key, rng.random(), secrets.token_hex(rng.choice([4, 6000]))))
                elif choice < 0.75:
                    cur.execute(f"UPDATE {table} SET v = %s WHERE id = %s", (rng.random(), key))
                elif choice < 0.9:
                    cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                elif choice < 0.98:
                    cur.execute(f"UPDATE {table} SET id = id + 1000 WHERE id = %s AND NOT EXISTS "
                                f"(SELECT FROM {table} WHERE id = %s)", (key, key + 1000))
                else:
                    cur.execute(f"DELETE FROM {table} WHERE id > 1000")
            conn.commit()
            committed += 1
    finally:
        conn.close()
        counts.append(committed)


def _apply(state: dict[Any, Row], change: ChangeEvent) -> None:
    if change.action == Action.TRUNCATE:
        state.clear()
        return
    old_key = change.old["id"] if change.old else None
    if change.action == Action.DELETE:
        state.pop(old_key, None)
        return
    assert change.new is not None
    key = change.new["id"]
    previous = state.pop(old_key if old_key is not None else key, None)
    restored = fill_unchanged(change, previous).new
    assert restored is not None
    state[key] = restored


def test_snapshot_plus_stream_equals_the_table_under_concurrent_writes(
        source: Any, db: Db, pg_dsn: str) -> None:
    sub, names = source(batch_size=16)
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY, v float8, big text)")
    db.run(f"ALTER TABLE {names.table} ALTER COLUMN big SET STORAGE EXTERNAL")
    db.run(f"INSERT INTO {names.table} SELECT g, 0, repeat('x', g) FROM generate_series(1, 40) g")
    stop = threading.Event()
    counts: list[int] = []
    writer = threading.Thread(target=_workload, args=(pg_dsn, names.table, stop, 7, counts))
    writer.start()
    try:
        time.sleep(0.2)  # the slot is created and the table copied while the writer commits
        stream = Stream(sub.events(None))
        _, rows, _, _ = stream.initial()
        time.sleep(0.5)
    finally:
        stop.set()
        writer.join()
    assert counts and counts[0] > 20, "the writer failed or committed too little to test anything"
    db.run(f"INSERT INTO {names.table} VALUES (-1, 0, 'marker')")
    state = {row["id"]: row for row in rows}
    while True:
        (tx,) = stream.transactions(1)
        for change in tx.changes:
            _apply(state, change)
        if -1 in state:
            break
    expected = {key[0]: row for key, row in _table(db, names.table).items()}
    assert state == expected


# --- errors ---------------------------------------------------------------------------------

def test_table_without_primary_key_is_refused(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (v int)")
    with pytest.raises(NoPrimaryKey, match="no primary key") as caught:
        next(sub.events(None))
    assert names.table in str(caught.value) and not caught.value.transient


def test_unknown_table_is_refused(source: Any) -> None:
    sub, names = source()
    with pytest.raises(UnknownTable, match="no such table") as caught:
        next(sub.events(None))
    assert f"public.{names.table}" in str(caught.value) and not caught.value.transient


def test_wrong_credentials_are_permanent_and_unreachable_is_transient(
        source: Any, pg_cluster: PgCluster) -> None:
    sub, names = source(pg_cluster.dsn(password="wrong"))
    with pytest.raises(SourceConfigError, match="password authentication failed") as caught:
        next(sub.events(None))
    assert names.table in str(caught.value) and not caught.value.transient
    sub, _ = source(pg_cluster.dsn(port=_closed_port(), connect_timeout=2))
    with pytest.raises(SourceUnavailable) as unreachable:
        next(sub.events(None))
    assert names.table in str(unreachable.value) and unreachable.value.transient


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dropped_slot_is_an_error_or_a_full_resync(source: Any, db: Db) -> None:
    sub, names = source()
    db.run(f"CREATE TABLE {names.table} (id int PRIMARY KEY)")
    db.run(f"INSERT INTO {names.table} VALUES (1)")
    stream = Stream(sub.events(None))
    stream.initial()
    db.tx(f"INSERT INTO {names.table} VALUES (2)")
    (tx,) = stream.transactions(1)
    position = tx.position
    sub.acknowledge(position)
    sub.close()
    _wait_inactive(db, names.slot)
    db.run("SELECT pg_drop_replication_slot(%s)", names.slot)
    db.tx(f"INSERT INTO {names.table} VALUES (3)")  # lost with the slot

    strict, _ = source()
    with pytest.raises(SlotLost, match=names.slot) as caught:
        next(strict.events(position))
    assert names.table in str(caught.value) and not caught.value.transient

    recreating, _ = source(recreate_slot_on_loss=True)
    stream = Stream(recreating.events(position))
    _, rows, end, reason = stream.initial()
    assert reason == "replication slot lost"
    assert sorted(r["id"] for r in rows) == [1, 2, 3]
    assert _lsn(end.position) > _lsn(position)
    db.tx(f"INSERT INTO {names.table} VALUES (4)")
    (tx,) = stream.transactions(1)
    assert [c.new for c in tx.changes] == [{"id": 4}]
