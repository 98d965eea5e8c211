"""Acceptance: `snapshotter ingest` SIGKILLed in the middle of a schema-change re-sync restarts cleanly.

The real service reads a table of the private cluster (tests/pg/conftest.py). Each round alters the
table (ADD COLUMN with a DEFAULT, a column type change, DROP COLUMN) and changes one row in the new
shape; as soon as the buffer shows the re-sync that change forces in progress (the table is big
enough for the copy to take a while), the service is SIGKILLed and started again. Afterwards the
buffer holds a completed `schema change` re-sync whose rows are exactly the table (the workload is
quiet by then), its durable schema names the table's columns, the only replication slot left is the
table's own (the killed copy's temporary slot went with its connection), and replaying everything
the buffer holds gives the table.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

from resources.buffer import BufferReader
from resources.subscribers.events import SCHEMA_CHANGE
from snapshot_assets.archive import gojson
from snapshot_assets.archive.positions import compare_lsn
from tests.buffer.helpers import buffer_rows, read_refs, replay
from tests.pg.conftest import PgCluster
from tests.pg.test_ingest_kill9 import IngestProcess, _config

pytestmark = pytest.mark.slow

ROWS: Final = 60_000
ALTERS: Final = ("ADD COLUMN extra int DEFAULT 5", "ALTER COLUMN v TYPE bigint", "DROP COLUMN pad")


def _wait(condition: Callable[[], bool], timeout: float, what: str, ingest: IngestProcess) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        ingest.running()
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{ingest.tail()}")
        time.sleep(0.01)


def test_ingest_killed_during_schema_change_resyncs_restarts_cleanly(pg_cluster: PgCluster, tmp_path: Path) -> None:
    table = f"sk_{uuid.uuid4().hex[:12]}"
    conn = pg_cluster.connect()
    conn.autocommit = True

    def run(statement: str) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall()) if cur.description else []

    def committed(statement: str) -> str:
        """Run `statement` as one transaction; returns a position its commit LSN is at or after (the
        WAL insert position read as its last statement), and the commit LSN of no later one."""
        rows = run(f"BEGIN; {statement}; SELECT pg_current_wal_insert_lsn()::text")
        run("COMMIT")
        return str(rows[0][0])

    def table_now() -> dict[Any, Any]:
        return {row["id"]: row for (row,) in run(f"SELECT to_jsonb(t) FROM {table} t")}

    run(f"CREATE TABLE {table} (id int PRIMARY KEY, v int, pad text)")
    run(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    run(f"INSERT INTO {table} SELECT i, i, md5(i::text) FROM generate_series(1, {ROWS}) i")
    root = tmp_path / "buffer"
    config = _config(tmp_path / "snapshotter.conf", pg_cluster.dsn(), table, root, tmp_path / "archive")
    config.write_text(config.read_text().replace("key_fields = [tenant, id]", "key_fields = [id]"))
    ingest = IngestProcess(config, tmp_path / "ingest.log")
    reader = BufferReader(root, f"public.{table}")

    def durable() -> str | None:
        return reader.durable_position() if (root / f"public.{table}").exists() else None

    def resyncing() -> bool:
        position = durable()
        return position is not None and reader.stats(position).resync_reason == SCHEMA_CHANGE

    try:
        ingest.start()
        _wait(lambda: durable() is not None, 120, "the initial load", ingest)
        for number, alter in enumerate(ALTERS, start=1):
            run(f"ALTER TABLE {table} {alter}")
            after = committed(f"UPDATE {table} SET v = {-number} WHERE id = {number}")
            _wait(resyncing, 60, f"the re-sync after {alter!r}", ingest)
            ingest.kill()
            ingest.start()
            _wait(lambda: compare_lsn(durable() or "", after) >= 0, 120, f"catching up after {alter!r}", ingest)  # noqa: B023

            latest = reader.latest_resync()
            assert latest is not None and latest.reason == SCHEMA_CHANGE
            assert latest.segment is not None
            rows = read_refs([reader.segment_ref(latest.segment)])
            copied = {row["id"]: row for row in (dict(gojson.loads(r["new"])) for r in rows)}
            assert copied == table_now(), f"the re-sync after {alter!r} is not the table"
            schema = reader.durable_schema()
            columns = [name for (name,) in run(
                f"SELECT attname FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum")]
            assert schema is not None and [c.name for c in schema.columns] == columns
            deadline = time.monotonic() + 10
            while (slots := [name for (name,) in run(
                    f"SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE '{table}%'")]) != [table]:
                assert time.monotonic() < deadline, f"replication slots left: {slots}"
                time.sleep(0.05)
        last = committed(f"DELETE FROM {table} WHERE id = 7")
        _wait(lambda: compare_lsn(durable() or "", last) >= 0, 60, "the last change", ingest)
        assert ingest.terminate() == 0
        state = replay(buffer_rows(root, f"public.{table}"), key_fields=("id",))
        assert {key[0]: row for key, row in state.items()} == table_now()
    finally:
        ingest.close()
        run(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{table}' "
            "AND NOT active")
        run(f"DROP TABLE IF EXISTS {table}")
        run(f"DROP PUBLICATION IF EXISTS {table}")
        conn.close()
