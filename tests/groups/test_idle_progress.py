"""Idle progress of a group member's PostgreSQL source (resources/subscribers/postgres.py).

A table no transaction touches gets nothing from pgoutput; with `progress=True` its source turns
the walsender's keepalive position into a change-less transaction end, so the table is known
complete through the database's recent commits, its acknowledgement releases the slot, and a
transaction of its own that follows still arrives with its own commit position.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from resources.subscribers.events import ChangeEvent, TxEnd
from resources.subscribers.postgres import PostgresSubscriber
from snapshot_assets.archive.positions import compare_lsn, format_lsn, parse_lsn
from tests.pg.conftest import PgCluster
from tests.pg.test_postgres_source import Db, Stream


@pytest.fixture
def idle_pair(pg_cluster: PgCluster) -> Iterator[tuple[Db, str, str]]:
    suffix = uuid.uuid4().hex[:8]
    quiet, busy = f"quiet_{suffix}", f"busy_{suffix}"
    db = Db(pg_cluster)
    db.run(f"CREATE TABLE {quiet} (id int PRIMARY KEY, v int)")
    db.run(f"CREATE TABLE {busy} (id int PRIMARY KEY, v int)")
    db.run(f"INSERT INTO {quiet} VALUES (1, 1)")
    try:
        yield db, quiet, busy
    finally:
        db.run("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
               "WHERE slot_name = %s AND NOT active", f"{quiet}_slot")
        db.run(f"DROP TABLE {quiet}, {busy}")
        db.run(f"DROP PUBLICATION IF EXISTS {quiet}_pub")


def test_an_idle_table_is_complete_through_other_tables_commits(pg_cluster: PgCluster,
                                                               idle_pair: tuple[Db, str, str]) -> None:
    db, quiet, busy = idle_pair
    source = PostgresSubscriber(pg_cluster.dsn(), table=quiet, slot=f"{quiet}_slot", publication=f"{quiet}_pub",
                                status_interval=1.0, progress=True)
    stream = Stream(source.events(None))
    try:
        stream.initial()
        db.run(f"INSERT INTO {busy} VALUES (1, 1)")  # only the other table changes
        (after,) = db.run("SELECT pg_current_wal_lsn()::text")[0]
        target = format_lsn((parse_lsn(after) or 0) - 1)
        (tx,) = stream.transactions(1, timeout=30)
        while compare_lsn(tx.position, target) < 0:  # change-less ends until past the other commit
            assert not tx.changes
            (tx,) = stream.transactions(1, timeout=30)
        assert not tx.changes and compare_lsn(tx.position, target) >= 0

        source.acknowledge(tx.position)  # accepted: the source delivered it
        deadline = time.monotonic() + 20
        while True:
            (confirmed,) = db.run("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                  f"{quiet}_slot")[0]
            if compare_lsn(confirmed, tx.position) >= 0:
                break
            assert time.monotonic() < deadline, "the idle table's slot was not released"
            time.sleep(0.2)

        db.run(f"UPDATE {quiet} SET v = 2 WHERE id = 1")  # its own change still comes, after the idle ends
        got = stream.transactions(1, timeout=30)[0]
        while not got.changes:
            got = stream.transactions(1, timeout=30)[0]
        (change,) = got.changes
        assert isinstance(change, ChangeEvent) and change.new == {"id": 1, "v": 2}
        assert isinstance(got.end, TxEnd) and compare_lsn(got.position, tx.position) > 0
    finally:
        source.close()
