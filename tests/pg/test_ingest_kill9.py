"""Acceptance: `snapshotter ingest` from PostgreSQL, killed with SIGKILL at random moments, loses and
duplicates nothing.

The real service (`snapshotter ingest --config FILE`, the console script next to this Python) reads
one table of the private cluster (tests/pg/conftest.py) by logical replication into the change
buffer. A random workload runs serially on one connection: inserts, updates, deletes, TRUNCATEs,
primary-key changes on a composite key (tenant text, id bigint), TOASTed values (> 8 KB of random
hex, stored out of line) that are sometimes rewritten and sometimes left alone, and every common
type (bigint beyond 2^53, numeric, float8 with NaN/Infinity, bool, unicode text, timestamptz, date,
bytea, nested jsonb, int[]/text[], NULLs). Meanwhile the service is killed with SIGKILL and
restarted, at least `KILLS` times, during start-up, resume, appends and seals.

Why the check is per transaction and not just the final table: a lost transaction can be masked
by a later one (an update overwritten, a row deleted again), and a duplicated one is invisible in
a final state. So the workload keeps a Python model of the table and records its state after every
committed transaction (S_0 before the workload, S_1..S_N); every workload transaction changes at
least one row, so the source yields exactly one transaction end per workload transaction. At the
end the buffer must hold the initial snapshot (equal to S_0) followed by exactly N position groups,
in seq order with contiguous seqs, each group's commit LSN inside the WAL bounds observed around
that transaction, and replaying group j must give exactly S_j. The model itself is checked against
`SELECT *` at the end, so the test cannot agree with itself about a wrong table.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg2.extensions
import pytest
from psycopg2 import sql

from resources.buffer import BufferReader
from resources.subscribers import pgtypes
from snapshot_assets.archive import gojson
from snapshot_assets.archive.algebra import TableState, apply
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.archive.positions import compare_lsn, format_lsn, parse_lsn
from tests.buffer.helpers import buffer_rows
from tests.pg.conftest import PgCluster

KILLS: Final = 22
SEED: Final = 4711
INITIAL_ROWS: Final = 60
CATCH_UP_S: Final = 240.0  # generous: a loaded 2-core machine can take minutes; a real stall still fails
TARGET_ROWS: Final = (40, 140)  # the workload steers the table size into this band
TX_PAUSE_S: Final = (0.0, 0.012)  # between transactions: ~150 tx/s, thousands over the test
KEY: Final = ("tenant", "id")
SNAPSHOT: Final = "SNAPSHOT"

# Non-key columns: name, SQL type, cast applied to the parameter (so text literals land typed).
_COLUMNS: Final = (
    ("n", "bigint", ""), ("amount", "numeric", "::numeric"), ("ratio", "float8", ""),
    ("flag", "bool", ""), ("label", "text", ""), ("at", "timestamptz", "::timestamptz"),
    ("day", "date", "::date"), ("blob", "bytea", ""), ("doc", "jsonb", "::jsonb"),
    ("ints", "int[]", "::int[]"), ("tags", "text[]", "::text[]"), ("big", "text", ""),
)
_NAMES: Final = tuple(name for name, _, _ in _COLUMNS)
_CAST: Final = {name: cast for name, _, cast in _COLUMNS}
# Tenants: unicode, quotes, the empty string, and a decimal beyond 2^53 (keys canonicalise it).
_TENANTS: Final = ("acme", "Ünïcode ✓", "o'brien \"q\"", "東京", "😀", "", "9007199254740993")
_ID_POOLS: Final = ((0, 2_000), (2**53 - 50, 2**53 + 50), (2**63 - 100, 2**63 - 1), (-(2**63) + 1, -(2**63) + 100))
_CHARS: Final = "abcxyz XYZ019 ,{}\"'\\\n\t\x01é✓𝄞東😀\u2028<&>"
_FLOAT_SPECIALS: Final = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


# --- values: the SQL parameter and what the source must report for it ---------------------------


class Values:
    """Random column values, each as (SQL parameter, expected row value in the source's mapping).

    The expected values follow the source's documented type mapping (resources/subscribers/pgtypes)
    but are computed here from the Python value, independently of PostgreSQL's text output.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def text(self, longest: int = 24) -> str:
        return "".join(self.rng.choice(_CHARS) for _ in range(self.rng.randint(0, longest)))

    def n(self) -> tuple[Any, Any]:
        value = self.rng.choice((self.rng.randint(-(2**63), 2**63 - 1), 2**53 + 1, -(2**53) - 3, 0))
        return value, value

    def amount(self) -> tuple[Any, Any]:
        if self.rng.random() < 0.05:
            return "NaN", "NaN"
        whole = str(self.rng.randrange(10 ** self.rng.randint(1, 30)))
        scale = self.rng.randint(0, 25)
        digits = whole + ("." + "".join(self.rng.choice("0123456789") for _ in range(scale)) if scale else "")
        if self.rng.random() < 0.4 and digits.strip("0.") != "":  # PostgreSQL prints -0 as 0
            digits = "-" + digits
        return digits, digits  # no typmod: numeric prints exactly the digits and scale it was given

    def ratio(self) -> tuple[Any, Any]:
        if self.rng.random() < 0.1:
            name = self.rng.choice(sorted(_FLOAT_SPECIALS))
            return _FLOAT_SPECIALS[name], name
        value = self.rng.choice((self.rng.uniform(-1e6, 1e6), self.rng.random() * 1e-300, 1e308, 0.1))
        return value, value

    def flag(self) -> tuple[Any, Any]:
        value = self.rng.random() < 0.5
        return value, value

    def label(self) -> tuple[Any, Any]:
        value = self.text()
        return value, value

    def at(self) -> tuple[Any, Any]:
        if self.rng.random() < 0.05:
            return "infinity", "infinity"
        stamp = dt.datetime(1900, 1, 1) + dt.timedelta(seconds=self.rng.randrange(300 * 365 * 86400))
        micros = self.rng.choice((0, self.rng.randrange(1_000_000)))
        fraction = f".{micros:06d}".rstrip("0") if micros else ""
        text = stamp.strftime("%Y-%m-%d %H:%M:%S") + fraction
        return text + "+00", text.replace(" ", "T") + "Z"

    def day(self) -> tuple[Any, Any]:
        value = (dt.date(1900, 1, 1) + dt.timedelta(days=self.rng.randrange(300 * 365))).isoformat()
        return value, value

    def blob(self) -> tuple[Any, Any]:
        value = self.rng.randbytes(self.rng.randint(0, 40))
        return value, base64.b64encode(value).decode("ascii")

    def _json(self, depth: int) -> Any:
        kind = self.rng.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return None
        if kind == 1:
            return self.rng.random() < 0.5
        if kind == 2:
            return self.rng.choice((self.rng.randint(-1000, 1000), 2**70 + 3, -(2**53) - 1))
        if kind == 3:
            return round(self.rng.uniform(-1000, 1000), 3)  # no exponent: jsonb would print the digits
        if kind == 4:
            return self.text(8)
        if kind == 5:
            return [self._json(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self.text(5): self._json(depth + 1) for _ in range(self.rng.randint(0, 3))}

    def doc(self) -> tuple[Any, Any]:
        value = {"k": self._json(0), "nested": {"list": [self._json(1), self._json(1)]}}
        return json.dumps(value), value

    def ints(self) -> tuple[Any, Any]:
        if self.rng.random() < 0.1:
            value: list[Any] = [[1, None], [3, 4]]
        else:
            value = [self.rng.choice((None, self.rng.randint(-(2**31), 2**31 - 1)))
                     for _ in range(self.rng.randint(0, 5))]
        return value, value

    def tags(self) -> tuple[Any, Any]:
        pool = ("NULL", "", "a,b", "{x}", 'q"t', "back\\slash", " spaced ", "ü✓")
        value = [self.rng.choice((None, self.rng.choice(pool), self.text(6))) for _ in range(self.rng.randint(0, 4))]
        return value, value

    def big(self) -> tuple[Any, Any]:
        # > 8 KB of random hex: incompressible enough, and SET STORAGE EXTERNAL keeps it out of line.
        value = self.rng.randbytes(self.rng.randint(4_200, 6_000)).hex()
        return value, value

    def column(self, name: str) -> tuple[Any, Any]:
        """A value for one column: NULL sometimes (rarely for `big`, which is mostly present)."""
        if self.rng.random() < (0.3 if name == "big" else 0.1):
            return None, None
        generate: Callable[[], tuple[Any, Any]] = getattr(self, name)
        return generate()


# --- the workload ------------------------------------------------------------------------------


@dataclass
class _Tx:
    """One transaction being planned: its statements and the table state once it commits."""

    state: TableState
    statements: list[bytes] = field(default_factory=list)


class Workload:
    """Random transactions on one connection, each applied to a Python model of the table.

    `states[j]` is the table after the j-th workload transaction (`states[0]`: before the first);
    `bounds[j]` is `pg_current_wal_lsn()` read right after it committed, in the same round trip, so
    the commit LSN of transaction j lies in [bounds[j-1], bounds[j]).
    """

    def __init__(self, conn: Any, table: str, noise_table: str, seed: int) -> None:
        self.conn = conn
        self.table = sql.Identifier(table)
        self.noise = sql.Identifier(noise_table)
        self.rng = random.Random(seed)
        self.values = Values(self.rng)
        self.states: list[TableState] = [{}]
        self.bounds: list[int] = []
        self.noise_transactions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def model(self) -> TableState:
        return self.states[-1]

    # statements

    def _sql(self, tx: _Tx, query: sql.Composable, params: Sequence[Any]) -> None:
        with self.conn.cursor() as cur:
            tx.statements.append(cur.mogrify(query, params))

    def _fresh_key(self, tx: _Tx) -> tuple[str, int]:
        while True:
            low, high = self.rng.choice(_ID_POOLS)
            key = (self.rng.choice(_TENANTS), self.rng.randint(low, high))
            if typed_key(dict(zip(KEY, key, strict=True)), KEY) not in tx.state:
                return key

    def _where(self, row: Row) -> tuple[sql.Composable, list[Any]]:
        return sql.SQL("tenant = %s AND id = %s"), [row["tenant"], row["id"]]

    def insert(self, tx: _Tx, key: tuple[str, int] | None = None) -> TypedKey:
        tenant, ident = key or self._fresh_key(tx)
        generated = [self.values.column(name) for name in _NAMES]
        row: Row = {"tenant": tenant, "id": ident, **{n: e for n, (_, e) in zip(_NAMES, generated, strict=True)}}
        placeholders = sql.SQL(", ").join(sql.SQL("%s" + _CAST[n]) for n in _NAMES)
        self._sql(tx, sql.SQL("INSERT INTO {} (tenant, id, {}) VALUES (%s, %s, {})").format(
            self.table, sql.SQL(", ").join(map(sql.Identifier, _NAMES)), placeholders),
            [tenant, ident, *(p for p, _ in generated)])
        typed = typed_key(row, KEY)
        tx.state[typed] = row
        return typed

    def _pick(self, tx: _Tx, key: TypedKey | None) -> tuple[TypedKey, Row]:
        """The row of `key`, or of a random key."""
        key = self.rng.choice(list(tx.state)) if key is None else key
        return key, tx.state[key]

    def update(self, tx: _Tx, key: TypedKey | None = None, *, new_key: bool = False, columns: int = 3) -> TypedKey:
        """Update some columns; `big` only sometimes, so unchanged TOASTed values are common."""
        old_key, old = self._pick(tx, key)
        chosen = self.rng.sample([n for n in _NAMES if n != "big"], self.rng.randint(0 if new_key else 1, columns))
        if self.rng.random() < 0.25:
            chosen.append("big")
        sets = {name: self.values.column(name) for name in chosen}
        assignments = [sql.SQL("{} = %s" + _CAST[n]).format(sql.Identifier(n)) for n in sets]
        params = [p for p, _ in sets.values()]
        new = {**old, **{n: e for n, (_, e) in sets.items()}}
        if new_key:
            tenant, ident = self._fresh_key(tx)
            if self.rng.random() < 0.3:  # change only one key column
                tenant, ident = (old["tenant"], ident) if self.rng.random() < 0.5 else (tenant, old["id"])
                if typed_key({"tenant": tenant, "id": ident}, KEY) in tx.state:
                    tenant, ident = self._fresh_key(tx)
            assignments += [sql.SQL("tenant = %s"), sql.SQL("id = %s")]
            params += [tenant, ident]
            new.update(tenant=tenant, id=ident)
        where, where_params = self._where(old)
        self._sql(tx, sql.SQL("UPDATE {} SET {} WHERE {}").format(self.table, sql.SQL(", ").join(assignments), where),
                  [*params, *where_params])
        del tx.state[old_key]
        typed = typed_key(new, KEY)
        tx.state[typed] = new
        return typed

    def delete(self, tx: _Tx, key: TypedKey | None = None) -> tuple[str, int]:
        key, row = self._pick(tx, key)
        where, params = self._where(row)
        self._sql(tx, sql.SQL("DELETE FROM {} WHERE {}").format(self.table, where), params)
        del tx.state[key]
        return row["tenant"], row["id"]

    def truncate(self, tx: _Tx) -> None:
        self._sql(tx, sql.SQL("TRUNCATE {}").format(self.table), [])
        tx.state.clear()

    # transactions

    def plan(self) -> _Tx:
        """One random transaction; it always changes at least one row of the table."""
        tx = _Tx(dict(self.model))
        roll = self.rng.random()
        if roll < 0.01 and tx.state:  # TRUNCATE, usually refilled in the same transaction
            self.truncate(tx)
            for _ in range(self.rng.randint(0, 8)):
                self.insert(tx)
        elif roll < 0.04 and tx.state:  # a large transaction: kills land inside its stream
            for _ in range(self.rng.randint(20, 80)):
                self.update(tx, columns=1)
        elif roll < 0.08 and tx.state:  # one key several times: delete + re-insert, insert + update + delete
            self.insert(tx, self.delete(tx))
            key = self.update(tx, self.insert(tx), new_key=self.rng.random() < 0.5)
            key = self.update(tx, key)
            if self.rng.random() < 0.5:
                self.delete(tx, key)
        else:
            for _ in range(self.rng.randint(1, 4)):
                self._random_step(tx)
        return tx

    def _random_step(self, tx: _Tx) -> None:
        low, high = TARGET_ROWS
        size = len(tx.state)
        weights = {"insert": 3.0 if size < low else 0.0 if size >= high else 1.0,
                   "update": 3.0, "pk": 0.7, "delete": 0.0 if size <= low // 2 else 1.0}
        if not size:
            weights = {"insert": 1.0}
        step = self.rng.choices(list(weights), list(weights.values()))[0]
        if step == "insert":
            self.insert(tx)
        elif step == "update":
            self.update(tx)
        elif step == "pk":
            self.update(tx, new_key=True)
        else:
            self.delete(tx)

    def commit(self, tx: _Tx) -> None:
        """Run the transaction in one round trip and record its state and WAL bound."""
        query = b"BEGIN; " + b"; ".join(tx.statements) + b"; COMMIT; SELECT pg_current_wal_lsn()"
        with self.conn.cursor() as cur:
            cur.execute(query)
            (lsn,) = cur.fetchone()
        self.states.append(tx.state)
        self.bounds.append(_lsn(lsn))

    def seed(self, rows: int) -> None:
        """The table before ingest starts (S_0): one transaction, recorded as the start state."""
        tx = _Tx({})
        for _ in range(rows):
            self.insert(tx)
        self.commit(tx)
        self.states, self.bounds = [tx.state], []

    def mark(self) -> None:
        """The lower WAL bound of the first workload transaction."""
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()")
            (lsn,) = cur.fetchone()
        self.bounds = [_lsn(lsn)]

    def _noise(self) -> None:
        """A transaction on an unpublished table: the source must yield nothing for it."""
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("UPDATE {} SET v = v + 1").format(self.noise))
        self.noise_transactions += 1

    # the background thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.rng.random() < 0.03:
                    self._noise()
                self.commit(self.plan())
                time.sleep(self.rng.uniform(*TX_PAUSE_S))
        except BaseException as exc:  # re-raised in the test thread by check_running()
            self.error = exc

    def start(self) -> None:
        self.mark()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self._thread.start()

    def check_running(self) -> None:
        if self.error is not None:
            raise AssertionError("the workload failed") from self.error

    def stop(self) -> int:
        """Finish the current transaction and stop; returns N, the number of workload transactions."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        return len(self.states) - 1


# --- the ingest service ------------------------------------------------------------------------


class IngestProcess:
    """`snapshotter ingest --config FILE` as a child process; every run's output goes to one log."""

    def __init__(self, config: Path, log: Path) -> None:
        self.command = [str(Path(sys.executable).with_name("snapshotter")), "ingest", "--config", str(config)]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        with self.log.open("ab") as out:  # the child keeps its own descriptor
            out.write(f"\n=== run {self.runs} ===\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)

    def running(self) -> subprocess.Popen[bytes]:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"ingest exited by itself with status {self.proc.returncode}:\n{self.tail()}")
        return self.proc

    def kill(self) -> None:
        proc = self.running()
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        proc = self.running()
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        """Kill a run still going (a failed test), so no ingest outlives the test."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _lsn(text: str) -> int:
    value = parse_lsn(text)
    assert value is not None, text
    return value


def _wait(condition: Callable[[], bool], timeout: float, what: str, ingest: IngestProcess) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        ingest.running()
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{ingest.tail()}")
        time.sleep(0.02)


# --- reading the buffer back -------------------------------------------------------------------


def _row(text: str | None) -> Row | None:
    return None if text is None else dict(gojson.loads(text))


def _transactions(changes: Sequence[dict[str, Any]]) -> Iterator[tuple[str, list[Change]]]:
    """Buffer change rows (in seq order) grouped by position: one group per source transaction."""
    group: list[Change] = []
    position = ""
    for r in changes:
        if r["position"] != position and group:
            yield position, group
            group = []
        position = r["position"]
        group.append(Change(Action(r["action"]), "", old=_row(r["old"]), new=_row(r["new"])))
    if group:
        yield position, group


def _difference(got: TableState, want: TableState) -> str:
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    changed = [(k, {c: (got[k].get(c), v) for c, v in want[k].items() if got[k].get(c) != v})
               for k in want if k in got and got[k] != want[k]]
    return f"missing {missing[:3]}, extra {extra[:3]}, differing (got, want) {str(changed[:2])[:1500]}"


def verify_buffer(root: Path, table: str, workload: Workload) -> int:
    """The buffer holds S_0 as its one snapshot, then exactly transactions 1..N; returns the changes."""
    rows = buffer_rows(root, table)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)), "seqs must be contiguous from 1"
    reader = BufferReader(root, table)
    assert [s.kind for s in reader.all_segments()].count("snapshot") == 1, "exactly one snapshot: no re-sync"
    snapshot = [r for r in rows if r["action"] == SNAPSHOT]
    changes = rows[len(snapshot):]
    assert all(r["action"] != SNAPSHOT for r in changes), "the snapshot comes first"

    state: TableState = {}
    for r in snapshot:
        image = _row(r["new"])
        assert image is not None
        state[typed_key(image, KEY)] = image
    assert state == workload.states[0], f"initial load: {_difference(state, workload.states[0])}"
    snapshot_position = _lsn(snapshot[0]["position"])
    assert snapshot_position < workload.bounds[0]

    n = len(workload.states) - 1
    previous = snapshot_position
    count = 0
    for j, (position, group) in enumerate(_transactions(changes), start=1):
        count = j
        assert j <= n, f"the buffer holds more transactions than the {n} committed (a duplicate at {position}?)"
        lsn = _lsn(position)
        assert lsn > previous, f"transaction {j} at {position} is not after the previous one"
        assert workload.bounds[j - 1] <= lsn < workload.bounds[j], (
            f"transaction {j} at {position} is not the workload's transaction {j}: a loss or a duplicate")
        apply(state, group, KEY)
        want = workload.states[j]
        assert state == want, f"after transaction {j} at {position}: {_difference(state, want)}"
        previous = lsn
    assert count == n, f"the buffer holds {count} of the {n} committed transactions"
    assert reader.durable_position() is not None and _lsn(reader.durable_position() or "") == previous
    return len(changes)


def select_table(cluster: PgCluster, table: str) -> TableState:
    """`SELECT *` mapped the way the source maps values (every column read as its output text)."""
    conn = cluster.connect()
    try:
        with conn.cursor() as cur:
            for name, value in pgtypes.SESSION_SETTINGS.items():  # the source's output settings
                cur.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(sql.Identifier(table)))
            assert cur.description is not None
            oids = [column.type_code for column in cur.description]
            names = [column.name for column in cur.description]
            raw = psycopg2.extensions.new_type(tuple(set(oids)), "RAW_TEXT", lambda value, _cur: value)
            psycopg2.extensions.register_type(raw, cur)
            cur.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            converters = pgtypes.Converters(lambda _oid: None)
            out: TableState = {}
            for values in cur.fetchall():
                row = {name: pgtypes.convert(value, converters(oid))
                       for name, oid, value in zip(names, oids, values, strict=True)}
                out[typed_key(row, KEY)] = row
            return out
    finally:
        conn.close()


# --- the test ----------------------------------------------------------------------------------


def _config(path: Path, dsn: str, table: str, buffer: Path, archive: Path) -> Path:
    path.write_text(f"""snapshotter {{
  source {{ type = postgres, dsn = {json.dumps(dsn)}, schema = public, table = {table},
           slot = {table}, publication = {table} }}
  key_fields = [tenant, id]
  destinations = [ {{ type = local, path = {json.dumps(str(archive))} }} ]
  buffer {{ path = {json.dumps(str(buffer))}, seal_interval = 50ms, seal_changes = 150 }}
}}
""")
    return path


@pytest.mark.slow
def test_ingest_killed_at_random_holds_exactly_the_source_history(pg_cluster: PgCluster, tmp_path: Path) -> None:
    """~5,000 random transactions while `snapshotter ingest` is SIGKILLed 22 times: the buffer is S_0..S_N."""
    table = f"k9_{uuid.uuid4().hex[:12]}"
    buffer_table = f"public.{table}"
    conn = pg_cluster.connect()
    with conn.cursor() as cur:
        columns = ", ".join(f"{name} {kind}" for name, kind, _ in _COLUMNS)
        cur.execute(f"CREATE TABLE {table} (tenant text NOT NULL, id bigint NOT NULL, {columns}, "
                    "PRIMARY KEY (tenant, id))")
        cur.execute(f"ALTER TABLE {table} ALTER COLUMN big SET STORAGE EXTERNAL, REPLICA IDENTITY FULL")
        cur.execute(f"CREATE TABLE {table}_noise (id int PRIMARY KEY, v int)")
        cur.execute(f"INSERT INTO {table}_noise VALUES (1, 0)")
    workload = Workload(conn, table, f"{table}_noise", SEED)
    workload.seed(INITIAL_ROWS)

    root = tmp_path / "buffer"
    config = _config(tmp_path / "snapshotter.conf", pg_cluster.dsn(), table, root, tmp_path / "archive")
    ingest = IngestProcess(config, tmp_path / "ingest.log")
    reader = BufferReader(root, buffer_table)

    def durable() -> str | None:
        return reader.durable_position() if (root / buffer_table).exists() else None

    started = time.monotonic()
    ingest.start()
    _wait(lambda: durable() is not None, CATCH_UP_S, "the initial load to be durable", ingest)
    workload.start()

    rng = random.Random(SEED)
    durables: list[str] = []
    try:
        for _ in range(KILLS):
            before = durable()
            if rng.random() < 0.25:  # anywhere: start-up, recovery, slot acquisition, resume
                time.sleep(rng.uniform(0.0, 1.0))
            else:  # once streaming again, so most kills land among appends and seals
                _wait(lambda: durable() != before, 30, "progress after a restart", ingest)  # noqa: B023
                time.sleep(rng.uniform(0.0, 0.4))
            workload.check_running()
            ingest.kill()
            now = durable()
            assert now is not None
            assert not durables or compare_lsn(now, durables[-1]) >= 0, "the durable position went backwards"
            durables.append(now)
            ingest.start()
        n = workload.stop()
        workload.check_running()
        last = format_lsn(workload.bounds[-2])  # the last transaction's commit LSN is at or after it
        _wait(lambda: compare_lsn(durable() or "", last) >= 0, CATCH_UP_S,
              "ingest to catch up with the last transaction", ingest)
        assert ingest.terminate() == 0, ingest.tail()
    finally:
        workload.stop()
        ingest.close()
    elapsed = time.monotonic() - started

    assert select_table(pg_cluster, table) == workload.model, "the workload's model drifted from the table"
    changes = verify_buffer(root, buffer_table, workload)
    assert len(set(durables)) >= KILLS // 2, "too few kills landed after progress"
    print(f"\n{KILLS} kills, {n} transactions ({changes} changes, {workload.noise_transactions} unpublished), "
          f"{elapsed:.1f}s")
    with conn.cursor() as cur:  # the walsender may still hold the slot a moment; the cluster goes anyway
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND NOT active", (table,))
        cur.execute(f"DROP PUBLICATION {table}; DROP TABLE {table}, {table}_noise")
    conn.close()
