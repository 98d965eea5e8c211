"""Row keys of a PostgreSQL table, on the private cluster: from the table, checked, used downstream.

- The source reports the table's key: the primary key (composite keys in key order), or the
  replica identity index's columns under REPLICA IDENTITY USING INDEX.
- Configured `key_fields` that differ from it stop the start naming both, before the replication
  slot is touched (and through the ingest loop the pipeline runs).
- With `key_fields` unset, the whole pipeline (ingest, Spark build, readers) folds by that key:
  three inserts into a table keyed `user_id` stay three rows, at every committed position, in
  every format (they used to collapse into one under the default `[id]`).

Tables use only fixed-length columns, so no TOAST policy is involved.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resources.buffer import BufferReader
from resources.subscribers.errors import KeyMismatch
from resources.subscribers.events import ChangeEvent, ResyncEnd, SchemaEvent, TxEnd
from resources.subscribers.postgres import PostgresSubscriber
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.archive.manifest import utc_now
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.config import TableConfig, parse_config
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.run_once import ingest_until_caught_up
from tests.pg.conftest import PgCluster
from tests.spark.conftest import spark  # noqa: F401  (the suite's one Spark session)

FORMATS = ("jsonl", "protobuf", "parquet")


class Table:
    """A fresh table, slot and publication; everything is dropped at the end."""

    def __init__(self, cluster: PgCluster) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.name, self.slot, self.publication = f"k_{suffix}", f"ks_{suffix}", f"kp_{suffix}"
        self.dsn = cluster.dsn()
        self.conn = cluster.connect()

    def run(self, *statements: str) -> None:
        """Run `statements` as one transaction."""
        with self.conn.cursor() as cur:
            cur.execute("BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT")

    def rows(self, key: tuple[str, ...]) -> dict[TypedKey, Row]:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT to_jsonb(t) FROM {self.name} t")
            return {typed_key(row, key): row for (row,) in cur.fetchall()}

    def subscriber(self, **options: Any) -> PostgresSubscriber:
        return PostgresSubscriber(self.dsn, table=self.name, slot=self.slot, publication=self.publication,
                                  status_interval=1.0, **options)

    def has_slot(self) -> bool:
        with self.conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
            return cur.fetchone() is not None

    def drop(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND NOT active", (self.slot,))
            cur.execute(f"DROP PUBLICATION IF EXISTS {self.publication}")
            cur.execute(f"DROP TABLE IF EXISTS {self.name}")
        self.conn.close()


@pytest.fixture
def table(pg_cluster: PgCluster) -> Iterator[Table]:
    t = Table(pg_cluster)
    yield t
    t.drop()


USER_ID = "CREATE TABLE {t} (user_id bigint PRIMARY KEY, score int, active bool)"
COMPOSITE = "CREATE TABLE {t} (tenant int, id bigint, score int, PRIMARY KEY (tenant, id))"
USING_INDEX = ("CREATE TABLE {t} (id bigint PRIMARY KEY, account_no bigint NOT NULL, score int, "
               "CONSTRAINT {t}_account UNIQUE (account_no));"
               "ALTER TABLE {t} REPLICA IDENTITY USING INDEX {t}_account")


def first_schema(sub: PostgresSubscriber) -> tuple[str, ...]:
    events = sub.events(None)
    try:
        event = next(events)
        assert isinstance(event, SchemaEvent)
        return event.schema.key_fields
    finally:
        events.close()
        sub.close()


# --- the source: the key it reports, and configured key_fields checked against it ----------------


def test_key_fields_other_than_the_primary_key_fail_at_start_naming_both(table: Table) -> None:
    table.run(USER_ID.format(t=table.name))
    sub = table.subscriber(key_fields=["id"])
    with pytest.raises(KeyMismatch) as caught:
        next(sub.events(None))
    sub.close()
    assert str(caught.value) == (f"public.{table.name}: key_fields [id] do not match the primary key [user_id] "
                                 f"of public.{table.name}")
    assert not caught.value.transient
    assert not table.has_slot()  # refused before the slot (or the publication's copy) was touched
    assert first_schema(table.subscriber()) == ("user_id",)
    assert first_schema(table.subscriber(key_fields=["user_id"])) == ("user_id",)


def test_composite_primary_key_is_the_key_in_its_order(table: Table) -> None:
    table.run(COMPOSITE.format(t=table.name))
    assert first_schema(table.subscriber()) == ("tenant", "id")
    assert first_schema(table.subscriber(key_fields=["tenant", "id"])) == ("tenant", "id")
    with pytest.raises(KeyMismatch, match=r"key_fields \[id, tenant\] do not match the primary key \[tenant, id\]"):
        first_schema(table.subscriber(key_fields=["id", "tenant"]))


def test_replica_identity_using_index_keys_rows_by_the_index(table: Table) -> None:
    table.run(USING_INDEX.format(t=table.name), f"INSERT INTO {table.name} VALUES (1, 100, 0)")
    with pytest.raises(KeyMismatch, match=r"key_fields \[id\] do not match the replica identity index "
                                          rf"\[account_no\] of public\.{table.name}$"):
        first_schema(table.subscriber(key_fields=["id"]))
    sub = table.subscriber()
    events = sub.events(None)
    try:
        got = [next(events) for _ in range(4)]  # schema, begin, one row, end
        assert isinstance(got[0], SchemaEvent) and got[0].schema.key_fields == ("account_no",)
        assert isinstance(got[-1], ResyncEnd)
        table.run(f"UPDATE {table.name} SET id = 2 WHERE account_no = 100",  # a primary-key change
                  f"UPDATE {table.name} SET account_no = 200 WHERE id = 2",  # an identity change
                  f"DELETE FROM {table.name} WHERE account_no = 200")
        changes = []
        while not isinstance(event := next(events), TxEnd):
            assert isinstance(event, ChangeEvent)
            changes.append((event.action, event.old, event.new))
    finally:
        events.close()
        sub.close()
    assert changes == [
        (Action.UPDATE, None, {"id": 2, "account_no": 100, "score": 0}),  # the identity did not change
        (Action.UPDATE, {"account_no": 100}, {"id": 2, "account_no": 200, "score": 0}),
        (Action.DELETE, {"account_no": 200}, None),
    ]


def test_the_ingest_loop_stops_on_mismatched_key_fields(table: Table, tmp_path: Path) -> None:
    table.run(USER_ID.format(t=table.name))
    config = table_config(table, tmp_path, key_fields="key_fields = [id]")
    with pytest.raises(RuntimeError, match=rf"ingest failed: public\.{table.name}: key_fields \[id\] do not "
                                           rf"match the primary key \[user_id\] of public\.{table.name}"):
        ingest_until_caught_up(config, timeout_s=60)


def test_the_ingest_loop_says_when_work_is_pending(table: Table, tmp_path: Path) -> None:
    """`run --once` boots Spark during the ingest only when the source has something for the table."""
    table.run(USER_ID.format(t=table.name), f"INSERT INTO {table.name} VALUES (1, 1, true)")
    config = table_config(table, tmp_path)
    calls: list[str] = []

    def ingest(step: str) -> None:
        ingest_until_caught_up(config, timeout_s=60, on_pending=lambda: calls.append(step))

    ingest("initial load")  # no slot yet: the source cannot say, so work is assumed
    ingest("nothing new")  # the slot has nothing after its confirmed position
    table.run(f"INSERT INTO {table.name} VALUES (2, 2, false)")
    ingest("a new row")
    assert calls == ["initial load", "a new row"]


def test_the_ingest_loop_ends_when_the_copy_is_durable(table: Table, tmp_path: Path) -> None:
    """Without its slot, the table is copied first: `run --once` is caught up once that copy is
    durable, without waiting for the stream to go quiet (idle_s longer than timeout_s would time out)."""
    table.run(USER_ID.format(t=table.name), f"INSERT INTO {table.name} VALUES (1, 1, true)")
    config = table_config(table, tmp_path)
    config = dataclasses.replace(config, source=dataclasses.replace(config.source, recreate_slot_on_loss=True))
    reader = BufferReader(config.buffer.path, config.name)
    first = ingest_until_caught_up(config, idle_s=600, timeout_s=60)  # the initial load
    assert first is not None and reader.durable_position() == first
    table.run(f"SELECT pg_drop_replication_slot('{table.slot}')",  # a lost slot: the table is copied again
              f"INSERT INTO {table.name} VALUES (2, 2, false)")
    again = ingest_until_caught_up(config, idle_s=600, timeout_s=60)
    assert again is not None and compare_lsn(again, first) > 0
    copy = [s for s in reader.all_segments() if s.kind == "snapshot"][-1]
    assert copy.to_position == again and copy.changes == 2


# --- the pipeline: unset key_fields means the source's key, end to end --------------------------------


def table_config(table: Table, work: Path, key_fields: str = "") -> TableConfig:
    return parse_config(f"""
snapshotter {{
  source {{ type = postgres, dsn = "{table.dsn}", table = {table.name}, slot = {table.slot},
           publication = {table.publication} }}
  {key_fields}
  destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
  formats {{ snapshot = [{", ".join(FORMATS)}], diff = [{", ".join(FORMATS)}] }}
  buffer {{ path = "{work / 'buffer'}", seal_interval = 100ms }}
}}
""", env={}).tables[0]


def archive_step(pipe: TablePipeline, spark_session: Any, *, force: bool = False) -> str:
    """Ingest what the table has, then build and commit one artifact; its position."""
    ingest_until_caught_up(pipe.cfg, timeout_s=60)
    later = dt.datetime.fromisoformat(utc_now().replace("Z", "+00:00")) + dt.timedelta(hours=1)
    nxt = pipe.decide(later, force=force)
    assert nxt.kind != "none" and nxt.to_position is not None
    pipe.commit(pipe.build(spark_session, nxt).artifact)
    return nxt.to_position


def as_state(rows: list[Row], key: tuple[str, ...]) -> dict[TypedKey, Row]:
    state = {typed_key(row, key): row for row in rows}
    assert len(state) == len(rows), "two rows under one key"
    return state


@pytest.mark.slow
@pytest.mark.parametrize(("ddl", "key", "columns"), [
    (USER_ID, ("user_id",), "(user_id, score, active) VALUES ({i}, {i}, true)"),
    (COMPOSITE, ("tenant", "id"), "(tenant, id, score) VALUES ({i} % 2, {i}, {i})"),
    (USING_INDEX, ("account_no",), "(id, account_no, score) VALUES ({i}, 1000 + {i}, {i})"),
], ids=["user_id", "composite", "using_index"])
def test_unset_key_fields_archive_by_the_tables_key(table: Table, tmp_path: Path, spark: Any,  # noqa: F811
                                                    ddl: str, key: tuple[str, ...], columns: str) -> None:
    table.run(ddl.format(t=table.name))
    pipe = TablePipeline(table_config(table, tmp_path))
    expected = {archive_step(pipe, spark): table.rows(key)}  # the initial load of the empty table
    assert pipe.key_fields == key
    table.run(*(f"INSERT INTO {table.name} {columns.format(i=i)}" for i in (1, 2, 3)))
    expected[archive_step(pipe, spark)] = table.rows(key)  # a diff of three inserts
    assert len(expected[max(expected)]) == 3
    first = key[0]
    table.run(f"UPDATE {table.name} SET score = -1 WHERE {first} = (SELECT min({first}) FROM {table.name})",
              f"DELETE FROM {table.name} WHERE {first} = (SELECT max({first}) FROM {table.name})",
              f"INSERT INTO {table.name} {columns.format(i=4)}",
              f"UPDATE {table.name} SET {first} = {first} + 10 WHERE score = 4")  # a key change
    expected[archive_step(pipe, spark)] = table.rows(key)  # another diff
    table.run(f"INSERT INTO {table.name} {columns.format(i=5)}")
    expected[archive_step(pipe, spark, force=True)] = table.rows(key)  # a re-base
    manifest = pipe.manifest()
    assert [a.kind for a in manifest.artifacts] == ["snapshot", "diff", "diff", "snapshot"]
    for fid in FORMATS:
        reader = ArchiveReader(pipe.destinations[0], pipe.cfg.key_prefix, formats=[fid], key_fields=pipe.key_fields)
        for position, state in expected.items():
            rec = reader.reconstruct_as_of(position, manifest)
            assert rec is not None and rec.position == position
            assert as_state(rec.rows, key) == state, (fid, position)


@pytest.mark.slow
def test_a_rebase_copies_every_untouched_bucket_of_every_format(table: Table, tmp_path: Path,
                                                                spark: Any) -> None:  # noqa: F811
    """The pipeline hands the build the previous snapshot's objects, parquet's included, so a re-base
    that touches one bucket writes that bucket only and copies the others' bytes: nothing regenerated."""
    table.run(f"CREATE TABLE {table.name} (id bigint PRIMARY KEY, body text)",
              f"INSERT INTO {table.name} SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, 40000) g")
    # 1 MiB buckets, below the config's floor, so that a small table has several
    config = dataclasses.replace(table_config(table, tmp_path), bucket_bytes=1024 * 1024)
    pipe = TablePipeline(config)
    archive_step(pipe, spark)  # the initial load: several buckets of 1 MiB of jsonl
    table.run(f"INSERT INTO {table.name} VALUES (40001, 'new')")
    ingest_until_caught_up(pipe.cfg, timeout_s=60)
    later = dt.datetime.fromisoformat(utc_now().replace("Z", "+00:00")) + dt.timedelta(hours=1)
    built = pipe.build(spark, pipe.decide(later, force=True))
    assert built.details["mode"] == "incremental" and built.details["buckets"] > 3
    assert built.details["rewritten"] == 1 and built.details["regenerated"] == 0
    pipe.commit(built.artifact)
    reader = ArchiveReader(pipe.destinations[0], pipe.cfg.key_prefix, formats=["parquet"], key_fields=("id",))
    rec = reader.reconstruct_as_of(built.artifact.to_position, pipe.manifest())
    assert rec is not None and len(rec.rows) == 40001 and max(r["id"] for r in rec.rows) == 40001
