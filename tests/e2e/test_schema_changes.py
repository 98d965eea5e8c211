"""Acceptance, end to end: ALTER TABLE on a live PostgreSQL table while `snapshotter run --once` archives it.

Rounds like tests/e2e/test_postgres_rounds.py (whose run, history and comparison helpers this
module uses): a workload of random transactions on a private PostgreSQL cluster, then the real
command in a subprocess. In the middle of the workload the table changes shape: ADD COLUMN with a
DEFAULT (every existing row reads it at the source without any change being sent), DROP COLUMN
inside a transaction that also writes rows, column type changes int -> bigint -> text, and an ADD
COLUMN without DEFAULT as the very last statement of a round, so that the next run resumes from a
position before the ALTER and only the buffer knows which shape its rows have. In three rounds a
first `run --once` is killed with SIGKILL after a random delay (wherever it is by then: ingest,
the re-sync, Spark or the commit) and the command is simply run again.

The oracle is the source itself. Each workload transaction ends with `SELECT to_jsonb(t)` of the
whole table, the column list from the catalog, and `pg_current_wal_insert_lsn()` (B_i); with one
writer, the table at any committed position P is the one read by the last transaction with
B_i <= P. After every round, for EVERY artifact boundary in jsonl, protobuf and parquet, the archive
rebuilt at that position equals that table (so the head equals `SELECT *` whenever the round ended
with a row change), and every diff applied on its own epoch's snapshot gives the table at its end.
Per artifact: no diff spans an ALTER TABLE; every parquet object has the columns of the table at its
position (one schema per object); the snapshot after each schema change was written for the
trigger `schema_change`; the manifest's `columns` name the columns and type OIDs of the table at
the head.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg2.extensions
import pyarrow.parquet as pq
from psycopg2 import sql

from resources.destinations.factory import build_destination
from snapshot_assets.archive.formats import FORMATS as FORMAT_REGISTRY
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.positions import compare_lsn, parse_lsn
from snapshot_assets.archive.reader import artifact_key
from snapshot_assets.config import load_config
from tests.e2e.conftest import SCENARIO, e2e_env
from tests.e2e.test_postgres_rounds import (
    FORMATS,
    RUN_TIMEOUT_S,
    Archive,
    History,
    as_state,
    check_boundaries,
    drop_archived_table,
    run_once,
    write_config,
)
from tests.pg.conftest import PgCluster

pytestmark = SCENARIO

SEED: Final = 8086
TABLE: Final = "e2e_schema"
INITIAL_ROWS: Final = 40
TX: Final = 6  # random transactions before and after each change
ABSENT: Final = "__snapshotter_absent__"

Shape = tuple[tuple[str, int], ...]  # (column name, type OID) in table order


@dataclass(frozen=True)
class Change:
    """One ALTER TABLE of the workload: its statement and the statements run with it (same transaction)."""

    ddl: str
    with_rows: bool = False


# Round number -> the schema changes made in its middle; the last entry of round 5 ends the round.
CHANGES: Final[dict[int, tuple[Change, ...]]] = {
    2: (Change("ALTER TABLE {t} ADD COLUMN extra int DEFAULT 5"),),
    3: (Change("ALTER TABLE {t} DROP COLUMN label", with_rows=True),),
    4: (Change("ALTER TABLE {t} ALTER COLUMN qty TYPE bigint"),
        Change("ALTER TABLE {t} ALTER COLUMN qty TYPE text USING qty::text")),
    5: (Change("ALTER TABLE {t} ADD COLUMN tag text"),),
}
ROUNDS: Final = 7
DDL_LAST: Final = frozenset({5})  # rounds that end with the ALTER itself (no row change after it)
KILLED_ROUNDS: Final = frozenset({2, 4, 6})


@dataclass
class SchemaHistory(History):
    """`History` plus the table's shape after each transaction and which transactions altered it."""

    shapes: list[Shape] = field(default_factory=list)
    alters: list[int] = field(default_factory=list)


class Workload:
    """Random inserts, updates and deletes in whatever shape the table has now, and the ALTERs."""

    def __init__(self, conn: psycopg2.extensions.connection, seed: int) -> None:
        self.conn = conn
        self.rng = random.Random(seed)
        self.history = SchemaHistory()
        self.table = sql.Identifier(TABLE)

    def _shape(self, cur: Any) -> Shape:
        cur.execute("SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", (TABLE,))
        return tuple((name, oid) for name, oid in cur.fetchall())

    def _value(self, type_oid: int) -> Any:
        if self.rng.random() < 0.15:
            return None
        number = self.rng.randint(-10**6, 10**6)
        return str(number) + self.rng.choice(("", "é", " x")) if type_oid == 25 else number

    def _row_values(self, shape: Shape) -> dict[str, Any]:
        return {name: self._value(oid) for name, oid in shape if name != "id"}

    def _insert(self, cur: Any, shape: Shape, ids: set[int]) -> None:
        ident = self.rng.randint(1, 10**6)
        while ident in ids:
            ident = self.rng.randint(1, 10**6)
        values = self._row_values(shape)
        cur.execute(sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, {})").format(
            self.table, sql.SQL(", ").join(map(sql.Identifier, values)),
            sql.SQL(", ").join(sql.Placeholder() * len(values))), [ident, *values.values()])
        ids.add(ident)

    def _update(self, cur: Any, shape: Shape, ids: set[int]) -> None:
        values = self._row_values(shape)
        chosen = self.rng.sample(sorted(values), self.rng.randint(1, len(values)))
        cur.execute(sql.SQL("UPDATE {} SET {} WHERE id = %s").format(
            self.table, sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(n)) for n in chosen)),
            [*(values[n] for n in chosen), self.rng.choice(sorted(ids))])

    def _delete(self, cur: Any, ids: set[int]) -> None:
        ident = self.rng.choice(sorted(ids))
        cur.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table), [ident])
        ids.discard(ident)

    def rows(self, cur: Any) -> None:
        """1-3 random row changes in the table's current shape."""
        shape = self._shape(cur)
        cur.execute(sql.SQL("SELECT id FROM {}").format(self.table))
        ids = {int(ident) for (ident,) in cur.fetchall()}
        for _ in range(self.rng.randint(1, 3)):
            step = self.rng.choices(("insert", "update", "delete"), (3 if len(ids) < 50 else 1, 3,
                                                                    1 if len(ids) > 25 else 0))[0]
            if step == "insert" or not ids:
                self._insert(cur, shape, ids)
            elif step == "update":
                self._update(cur, shape, ids)
            else:
                self._delete(cur, ids)

    def transaction(self, body: Callable[[Any], None], *, alters: bool = False) -> None:
        """Run `body`, then read the table, its shape and B_i as the transaction's last statements."""
        with self.conn.cursor() as cur:
            body(cur)
            cur.execute(sql.SQL("SELECT to_jsonb(t) FROM {} t").format(self.table))
            state = as_state([row for (row,) in cur.fetchall()])
            shape = self._shape(cur)
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            bound = parse_lsn(cur.fetchone()[0])
        self.conn.commit()
        assert bound is not None
        if alters:
            self.history.alters.append(len(self.history.states))
        self.history.states.append(state)
        self.history.bounds.append(bound)
        self.history.shapes.append(shape)

    def setup(self) -> None:
        def create(cur: Any) -> None:
            cur.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, qty int, label text)").format(self.table))
            cur.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(self.table))
            shape = self._shape(cur)
            ids: set[int] = set()
            for _ in range(INITIAL_ROWS):
                self._insert(cur, shape, ids)

        self.transaction(create)

    def alter(self, change: Change) -> None:
        def body(cur: Any) -> None:
            if change.with_rows:
                self.rows(cur)  # changes of the old shape before the ALTER, in the same transaction
            cur.execute(sql.SQL(change.ddl.format(t="{}")).format(self.table))
            if change.with_rows:
                self.rows(cur)

        self.transaction(body, alters=True)

    def round(self, number: int) -> None:
        changes = CHANGES.get(number, ())
        for _ in range(TX):
            self.transaction(self.rows)
        for change in changes:
            self.alter(change)
            if number not in DDL_LAST:
                for _ in range(TX):
                    self.transaction(self.rows)


def killed_run(config: Path, work: Path, log: Path, delay: float) -> None:
    """`snapshotter run --once`, SIGKILLed after `delay` seconds unless it finished before."""
    command = [str(Path(sys.executable).with_name("snapshotter")), "run", "--once", "--config", str(config)]
    with log.open("ab") as err:
        proc = subprocess.Popen(command, cwd=work, env=e2e_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=RUN_TIMEOUT_S)


def parquet_columns(archive: Archive, art: Artifact) -> list[set[str]]:
    """The row columns of each parquet object of `art` (diffs: the fields of their row structs)."""
    key = artifact_key(archive.table.key_prefix, art, FORMAT_REGISTRY["parquet"])
    objects = [o.key for o in archive.dest.list(key + "/")] or [key]
    found = []
    for name in objects:
        with archive.dest.open_read(name) as f:
            schema = pq.read_schema(f)
        if art.is_snapshot:
            found.append({n for n in schema.names if n != ABSENT})
        else:
            structs = [schema.field(n).type for n in ("old", "new") if n in schema.names]
            found.append({f.name for t in structs if hasattr(t, "num_fields") for f in t if f.name != ABSENT})
    return found


def check_round(archive: Archive, history: SchemaHistory, *, ended_with_rows: bool) -> Manifest:
    manifest = archive.reader().load_manifest()
    manifest.validate(compare_lsn)
    assert manifest.artifacts and manifest.artifacts[0].is_snapshot
    assert all(sorted(a.formats) == sorted(FORMATS) for a in manifest.artifacts), "an artifact lacks a format"
    head = history.index_at(manifest.head_position)
    if ended_with_rows:
        assert head == len(history.states) - 1, f"head {manifest.head_position} does not cover the round"
    check_boundaries(archive, manifest, history)
    for art in manifest.artifacts:
        end = history.index_at(art.to_position)
        columns = {name for name, _ in history.shapes[end]}
        if not art.is_snapshot:
            start = history.index_at(art.from_position or "")
            assert not [i for i in history.alters if start < i <= end], f"{art.describe()} spans an ALTER TABLE"
        for found in parquet_columns(archive, art):
            assert not found or found == columns, f"{art.describe()}: parquet columns {found}, table {columns}"
    described = [(c["Name"], c["TypeOID"]) for c in manifest.columns or []]
    assert described == list(history.shapes[head]), f"manifest columns {described}"
    assert all(set(c) >= {"Name", "Type", "Nullable", "PrimaryKey", "OrdinalPosition", "PrimaryKeyOrdinal",
                          "DefaultValue", "MaxLength", "TypeOID"} for c in manifest.columns or [])
    return manifest


def test_schema_changes_while_archiving(pg_cluster: PgCluster, workdir: Path) -> None:
    started = time.monotonic()
    config = workdir / "snapshotter.conf"
    write_config(config, pg_cluster.dsn(), workdir, table=TABLE, max_churn=0)
    table = load_config(config, env={}).tables[0]
    archive = Archive(table, build_destination(table.destinations[0]))
    log = workdir / "runs.log"
    rng = random.Random(SEED)

    conn = pg_cluster.connect()
    conn.autocommit = False
    workload = Workload(conn, SEED)
    outputs: list[str] = []
    heads: list[str] = []
    try:
        workload.setup()
        for number in range(ROUNDS + 1):
            if number:
                workload.round(number)
            if number in KILLED_ROUNDS:
                killed_run(config, workdir, log, rng.uniform(1.0, 12.0))
            outputs.append(run_once(config, workdir, log))
            manifest = check_round(archive, workload.history, ended_with_rows=number not in DDL_LAST)
            if heads:
                assert compare_lsn(manifest.head_position, heads[-1]) >= 0, "the head moved back"
            heads.append(manifest.head_position)
            if (number in CHANGES and number not in DDL_LAST) or number - 1 in DDL_LAST:
                # A snapshot after this round's last ALTER (the one before it, for the round after
                # an ALTER that ended its round): no diff continued into the new shape.
                altered = workload.history.bounds[workload.history.alters[-1]]
                snap = manifest.latest_snapshot()
                assert snap is not None and (parse_lsn(snap.to_position) or 0) > altered, number
    finally:
        drop_archived_table(conn, TABLE)

    text = "".join(outputs)
    # Snapshots are written for schema changes only (the policy has no re-base threshold); a killed
    # first run may have committed its round's snapshot itself, so the rerun's output may lack it.
    triggers = [re.findall(r"snapshot@\S+ \((\w+)\)", out) for out in outputs]
    assert triggers[0] == ["initial"], text
    assert all(set(found) <= {"schema_change"} for found in triggers[1:]), text
    assert "schema_change" in triggers[3], text  # a round without a kill
    final = archive.reader().load_manifest()
    assert any(not a.is_snapshot for a in final.artifacts), "no diff was written"
    print(text)
    print(f"{ROUNDS} rounds, {len(workload.history.states) - 1} transactions, {len(final.artifacts)} artifacts, "
          f"{time.monotonic() - started:.0f}s")
