"""Acceptance of co-refresh groups (seed 003): a ledger over two tables, archived by cuts.

A private PostgreSQL cluster (tests/pg) holds `ledger_accounts` (balances) and `ledger_transfers`
(amounts in flight). Every workload transaction moves an amount between rows, within one table or
across both, so the sum over both tables is the same after every transaction. Both tables are
ingested by the real `snapshotter ingest` (one replication slot per table) and archived by the
real `snapshotter cut --group ledger` (Spark builds, manifest compare-and-swap), as processes.

The oracle is the source itself: a logical slot of its own (pgoutput, both tables) is peeked for
the commit LSN of every workload transaction (its Begin message carries it, matched by xid), and a
Python model keeps each table after every transaction, so the source at any position P is the
model after the last transaction committed at or before P, exact. The model is checked against
`SELECT` after every round.

What is shown:
- the first cut puts both first snapshots at one position (the initial load at a common W0);
- a round where only accounts change still cuts: the idle table's ingest follows the source's
  keepalives, so the watermark does not stall on it;
- cut runs are SIGKILLed at random moments, and a later cut carries on;
- a member whose build fails holds the cut back (the group manifest keeps the previous cut),
  although the other member committed its diff to the new position; there, reading each table
  "as of" that position on its own breaks the ledger's invariant, while the group read (newest cut
  at or before it) keeps it; after the fault is repaired the next cut is published;
- at every published cut, both tables rebuilt at the cut sum to the invariant and each equals the
  source at the cut position; the Spark reconstruct of the group at the newest cut gives the same
  rows; the accounts table re-bases on its own policy within the group.
"""

from __future__ import annotations

import io
import itertools
import json
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg2.extensions
import pytest

from resources.buffer import BufferReader
from snapshot_assets import cli
from snapshot_assets.archive.positions import compare_lsn, format_lsn, parse_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.config import SnapshotterConfig, load_config
from snapshot_assets.groups.cut import GroupPipeline
from snapshot_assets.groups.read import GroupReader, read_group, reconstruct_group_to_paths
from snapshot_assets.spark.connect_server import stop_local_connect_server
from tests.e2e.conftest import e2e_env
from tests.pg.conftest import PgCluster

pytestmark = pytest.mark.slow

SEED: Final = 3003
ACCOUNTS: Final = "ledger_accounts"
TRANSFERS: Final = "ledger_transfers"
ORACLE: Final = "ledger_oracle"
INITIAL_ACCOUNTS: Final = 8
INITIAL_BALANCE: Final = 1_000
INITIAL_TRANSFERS: Final = 4
INITIAL_AMOUNT: Final = 50
INVARIANT: Final = INITIAL_ACCOUNTS * INITIAL_BALANCE + INITIAL_TRANSFERS * INITIAL_AMOUNT
# Per round: its workload ("mixed": across and within tables; "accounts": accounts only, transfers idle).
ROUNDS: Final = ("mixed", "accounts", "mixed")
TX_PER_ROUND: Final = 12
KILL_ROUNDS: Final = (0, 1)  # the round's first cut run is SIGKILLed at a random moment
BREAK_ROUND: Final = 2  # the transfers build fails: the cut is held back, then recovered
RUN_TIMEOUT_S: Final = 240.0
SPARK_READY: Final = "Spark session ready"  # what a run logs once its Spark session is open
WAIT_S: Final = 90.0


@dataclass
class Ledger:
    """The workload's model of both tables and, per transaction, its xid and the state after it."""

    accounts: dict[int, int] = field(default_factory=dict)
    transfers: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (account, amount)
    log: list[tuple[int, dict[int, int], dict[int, tuple[int, int]]]] = field(default_factory=list)
    initial: tuple[dict[int, int], dict[int, tuple[int, int]]] = ({}, {})

    def total(self) -> int:
        return sum(self.accounts.values()) + sum(a for _, a in self.transfers.values())


def rows_of(accounts: dict[int, int], transfers: dict[int, tuple[int, int]]) -> dict[str, set[tuple[int, ...]]]:
    return {f"public.{ACCOUNTS}": {(i, b) for i, b in accounts.items()},
            f"public.{TRANSFERS}": {(i, a, x) for i, (a, x) in transfers.items()}}


def archived_rows(table: str, rows: list[dict[str, Any]]) -> set[tuple[int, ...]]:
    if table.endswith(ACCOUNTS):
        return {(int(r["id"]), int(r["balance"])) for r in rows}
    return {(int(r["id"]), int(r["account"]), int(r["amount"])) for r in rows}


def ledger_sum(tables: dict[str, set[tuple[int, ...]]]) -> int:
    return sum(t[-1] for rows in tables.values() for t in rows)


def setup_source(conn: psycopg2.extensions.connection, ledger: Ledger) -> None:
    with conn.cursor() as cur:
        for stmt in (f"DROP TABLE IF EXISTS {ACCOUNTS}, {TRANSFERS}",
                     f"CREATE TABLE {ACCOUNTS} (id int PRIMARY KEY, balance bigint NOT NULL)",
                     f"CREATE TABLE {TRANSFERS} (id int PRIMARY KEY, account int NOT NULL, amount bigint NOT NULL)"):
            cur.execute(stmt)
        for i in range(INITIAL_ACCOUNTS):
            cur.execute(f"INSERT INTO {ACCOUNTS} VALUES (%s, %s)", (i, INITIAL_BALANCE))
            ledger.accounts[i] = INITIAL_BALANCE
        for j in range(INITIAL_TRANSFERS):
            cur.execute(f"INSERT INTO {TRANSFERS} VALUES (%s, %s, %s)", (j, j, INITIAL_AMOUNT))
            ledger.transfers[j] = (j, INITIAL_AMOUNT)
        cur.execute(f"CREATE PUBLICATION {ORACLE} FOR TABLE {ACCOUNTS}, {TRANSFERS}")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (ORACLE,))
    ledger.initial = (dict(ledger.accounts), dict(ledger.transfers))


def transaction(conn: psycopg2.extensions.connection, ledger: Ledger, rng: random.Random, kind: str) -> None:
    """One transaction moving an amount: across the tables (either way, or into a new transfer row)
    when `kind` is mixed and the dice say so, else between two accounts."""
    accounts, transfers = dict(ledger.accounts), dict(ledger.transfers)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT txid_current()")
        xid = int(cur.fetchone()[0])
        roll = rng.random() if kind == "mixed" else 1.0
        a = rng.choice(sorted(accounts))
        if roll < 0.45:  # account -> transfer row (a new one now and then)
            x = rng.randint(1, 40)
            j = rng.choice(sorted(transfers)) if rng.random() < 0.7 else max(transfers) + 1
            account, amount = transfers.get(j, (a, 0))
            transfers[j] = (account, amount + x)
            accounts[a] -= x
            cur.execute(f"INSERT INTO {TRANSFERS} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                        "amount = EXCLUDED.amount", (j, account, amount + x))
        elif roll < 0.6:  # transfer row -> account
            j = rng.choice(sorted(transfers))
            account, amount = transfers[j]
            y = rng.randint(0, amount)
            transfers[j] = (account, amount - y)
            accounts[account] += y
            cur.execute(f"UPDATE {TRANSFERS} SET amount = %s WHERE id = %s", (amount - y, j))
            a = account
        else:  # account -> account
            b = rng.choice([k for k in sorted(accounts) if k != a])
            x = rng.randint(1, 40)
            accounts[a] -= x
            accounts[b] += x
            cur.execute(f"UPDATE {ACCOUNTS} SET balance = %s WHERE id = %s", (accounts[b], b))
        cur.execute(f"UPDATE {ACCOUNTS} SET balance = %s WHERE id = %s", (accounts[a], a))
    ledger.accounts, ledger.transfers = accounts, transfers
    ledger.log.append((xid, dict(accounts), dict(transfers)))
    assert ledger.total() == INVARIANT


def commit_lsns(conn: psycopg2.extensions.connection) -> dict[int, int]:
    """xid -> commit LSN of every transaction the oracle slot has seen (pgoutput Begin: 'B', final LSN)."""
    with conn.cursor() as cur:
        cur.execute("SELECT xid::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                    "'proto_version', '1', 'publication_names', %s)", (ORACLE, ORACLE))
        found = {}
        for xid, data in cur.fetchall():
            raw = bytes(data)
            if raw[:1] == b"B":
                found[int(xid)] = struct.unpack(">Q", raw[1:9])[0]
        return found


class Source:
    """The source at any position, from the model and the oracle slot's commit LSNs."""

    def __init__(self, conn: psycopg2.extensions.connection, ledger: Ledger) -> None:
        self.conn, self.ledger = conn, ledger

    def last_commit(self) -> int:
        lsns = commit_lsns(self.conn)
        return lsns[self.ledger.log[-1][0] % 2**32]

    def at(self, position: str) -> dict[str, set[tuple[int, ...]]]:
        lsns = commit_lsns(self.conn)
        state = self.ledger.initial
        for xid, accounts, transfers in self.ledger.log:
            if compare_lsn(format_lsn(lsns[xid % 2**32]), position) <= 0:
                state = (accounts, transfers)
        return rows_of(*state)

    def check_model(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT id, balance FROM {ACCOUNTS}")
            accounts = {i: b for i, b in cur.fetchall()}
            cur.execute(f"SELECT id, account, amount FROM {TRANSFERS}")
            transfers = {i: (a, x) for i, a, x in cur.fetchall()}
        assert rows_of(accounts, transfers) == rows_of(self.ledger.accounts, self.ledger.transfers)


def write_config(path: Path, work: Path, dsn: str) -> None:
    def table(name: str, churn: int) -> str:
        return f"""
    {{ source {{ type = postgres, dsn = "{dsn}", table = {name}, slot = {name}_slot, publication = {name}_pub }}
      diff.interval = 1s
      snapshot {{ max_churn_records = {churn} }}
      destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
      formats {{ snapshot = [jsonl], diff = [jsonl] }} }}"""

    path.write_text(f"""snapshotter {{
  buffer {{ path = "{work / 'buffer'}", seal_interval = 200ms }}
  spark {{ conf {{ "spark.driver.memory" = "1g" }}, local_server_idle_timeout = 5m }}
  tables = [{table(ACCOUNTS, 25)}{table(TRANSFERS, 0)}
  ]
  groups = [ {{ name = ledger, tables = [ public.{ACCOUNTS}, public.{TRANSFERS} ] }} ]
}}
""")


def snapshotter(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("snapshotter")), *args]


def cut(config: Path, work: Path, log: Path, *, expect_ok: bool = True) -> str:
    with log.open("ab") as err:
        done = subprocess.run(snapshotter("cut", "--group", "ledger", "--config", str(config)), cwd=work,
                              env=e2e_env(), stdout=subprocess.PIPE, stderr=err, timeout=RUN_TIMEOUT_S, check=False)
    out = done.stdout.decode(errors="replace")
    if expect_ok and done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        pytest.fail(f"snapshotter cut exited {done.returncode}:\n{out}\n{tail}")
    if not expect_ok:
        assert done.returncode == 1, out
    return out


def killed_cut(config: Path, work: Path, log: Path, rng: random.Random) -> bool:
    """A cut run SIGKILLed at a random moment after its Spark session is ready (building a member,
    committing it, publishing); False when it finished first."""
    ready = log.read_text(errors="replace").count(SPARK_READY) if log.exists() else 0
    with log.open("ab") as err:
        proc = subprocess.Popen(snapshotter("cut", "--group", "ledger", "--config", str(config)), cwd=work,
                                env=e2e_env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while log.read_text(errors="replace").count(SPARK_READY) == ready and proc.poll() is None:
            assert time.monotonic() < deadline, "the cut run never opened its Spark session"
            time.sleep(0.1)
        try:
            proc.wait(timeout=rng.uniform(0.5, 12.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
    return False


def wait_durable(config: SnapshotterConfig, target: int) -> None:
    """Until both buffers hold everything through `target` (the idle one through keepalives)."""
    deadline = time.monotonic() + WAIT_S
    readers = [BufferReader(t.buffer.path, t.name) for t in config.tables]
    while True:
        durable = [r.durable_position() for r in readers]
        if all(d is not None and compare_lsn(d, format_lsn(target)) >= 0 for d in durable):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the buffers did not reach {format_lsn(target)} in {WAIT_S}s: {durable}")
        time.sleep(0.2)


def check_cut_reads(config: SnapshotterConfig, source: Source, at: str | None = None) -> str:
    """The group read at `at`: the invariant holds and each table is the source at the cut."""
    got = read_group(config, "ledger", at)
    tables = {name: archived_rows(name, rec.rows) for name, rec in got.tables.items()}
    assert ledger_sum(tables) == INVARIANT, f"cut {got.cut.position}: the ledger sums to {ledger_sum(tables)}"
    assert tables == source.at(got.cut.position), f"cut {got.cut.position} is not the source at that position"
    for name, member in got.cut.tables.items():
        assert compare_lsn(member.to_position, got.cut.position) <= 0
        assert got.tables[name].position == member.to_position
    return got.cut.position


@pytest.fixture
def ingest(tmp_path: Path, pg_cluster: PgCluster) -> Iterator[tuple[Path, Path, Source]]:
    work = tmp_path
    conn = pg_cluster.connect()  # autocommit: a slot is created outside a transaction that wrote
    ledger = Ledger()
    setup_source(conn, ledger)
    conn.autocommit = False
    config = work / "ledger.conf"
    write_config(config, work, pg_cluster.dsn())
    log = work / "ingest.log"
    with log.open("ab") as err:
        proc = subprocess.Popen(snapshotter("ingest", "--config", str(config)), cwd=work, env=e2e_env(),
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield work, config, Source(conn, ledger)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stop_local_connect_server(work / ".snapshotter" / "spark-connect")
        conn.rollback()
        conn.autocommit = True
        with conn.cursor() as cur:
            for slot in (ORACLE, f"{ACCOUNTS}_slot", f"{TRANSFERS}_slot"):
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s AND NOT active", (slot,))
            cur.execute(f"DROP TABLE IF EXISTS {ACCOUNTS}, {TRANSFERS}")
            for pub in (ORACLE, f"{ACCOUNTS}_pub", f"{TRANSFERS}_pub"):
                cur.execute(f"DROP PUBLICATION IF EXISTS {pub}")
        conn.close()


def test_ledger_cuts_keep_the_invariant(ingest: tuple[Path, Path, Source]) -> None:
    work, config_path, source = ingest
    config = load_config(config_path)
    rng = random.Random(SEED)
    log = work / "runs.log"
    group = GroupPipeline.of(config, "ledger")
    accounts, transfers = (pipe for pipe in group.members)

    # The initial load of both tables: the first cut puts both first snapshots at one position.
    deadline = time.monotonic() + WAIT_S
    while (copies := [p.buffer().latest_resync() for p in group.members]) and None in copies:
        assert time.monotonic() < deadline, "the initial loads did not finish"
        time.sleep(0.2)
    wait_durable(config, max(parse_lsn(c.end_position) or 0 for c in copies if c is not None))
    assert "cut at" in cut(config_path, work, log)
    first = group.manifest().cuts[0]
    for pipe in group.members:
        (snap,) = pipe.manifest().artifacts
        assert snap.is_snapshot and snap.to_position == first.position
    check_cut_reads(config, source)

    for number, kind in enumerate(ROUNDS):
        for _ in range(TX_PER_ROUND):
            transaction(source.conn, source.ledger, rng, kind)
        source.check_model()
        wait_durable(config, source.last_commit())
        before = group.manifest().last
        assert before is not None
        if number in KILL_ROUNDS:
            print(f"round {number}: cut run killed: {killed_cut(config_path, work, log, rng)}")
        if number == BREAK_ROUND:
            staging = Path(transfers.staging.uri)
            staging.parent.mkdir(parents=True, exist_ok=True)
            staging.write_text("in the way of the transfers build")
            try:
                failed = cut(config_path, work, log, expect_ok=False)
            finally:
                staging.unlink()
            assert "ledger: no cut" not in failed
            assert f"is held back: public.{TRANSFERS} failed (diff to " in log.read_text(errors="replace")
            # Held back: accounts committed its diff to the new position, the group still reads the old cut.
            assert group.manifest().last == before
            head = accounts.manifest().head_position
            assert compare_lsn(head, before.position) > 0
            assert transfers.manifest().head_position == before.tables[transfers.name].to_position
            alone = {pipe.name: archived_rows(pipe.name, as_of(pipe.destinations[0], pipe.cfg.key_prefix, head))
                     for pipe in group.members}
            assert ledger_sum(alone) != INVARIANT, "the per-table as-of read happened to keep the invariant"
            assert check_cut_reads(config, source, head) == before.position
        if kind == "accounts":
            transfers_head = transfers.manifest().head_position
        started = time.monotonic()
        out = cut(config_path, work, log)  # a killed run that had finished leaves nothing for this one
        print(f"round {number} ({kind}): {out.strip()} in {time.monotonic() - started:.1f}s")
        newest = check_cut_reads(config, source)
        assert compare_lsn(newest, format_lsn(source.last_commit())) >= 0, "the cut does not cover the round"
        if kind == "accounts":  # the idle member did not stall the cut, and wrote nothing
            assert transfers.manifest().head_position == transfers_head

    # Every cut ever published, and the members' manifests on their own.
    cuts = group.manifest().cuts
    assert len(cuts) == len(ROUNDS) + 1
    assert all(compare_lsn(a.position, b.position) < 0 for a, b in itertools.pairwise(cuts))
    for c in cuts:
        assert check_cut_reads(config, source, c.position) == c.position
    for pipe in group.members:
        pipe.manifest().validate(compare_lsn)
    assert len(list(accounts.manifest().snapshots())) > 1, "accounts never re-based inside the group"

    # The command line: `reconstruct --group` at a position between two cuts reads the older cut.
    between = format_lsn((parse_lsn(cuts[2].position) or 0) - 1)
    stdout = io.StringIO()
    assert cli.main(["reconstruct", "--group", "ledger", "--config", str(config_path), "--at", between], stdout) == 0
    printed = json.loads(stdout.getvalue())
    assert printed["position"] == cuts[1].position
    assert {name: archived_rows(name, t["rows"]) for name, t in printed["tables"].items()} == source.at(
        cuts[1].position)
    early = format_lsn((parse_lsn(cuts[0].position) or 0) - 1)
    assert cli.main(["reconstruct", "--group", "ledger", "--config", str(config_path), "--at", early], stdout) == 1

    # The Spark reconstruct of the group at the newest cut: the same tables.
    from snapshot_assets.spark.session import CONNECT_MODE, open_spark

    runtime = open_spark(config.spark, state_dir=work / ".snapshotter" / "spark-connect")
    try:
        with pytest.MonkeyPatch.context() as mode:  # the suite's process may also hold a classic session
            if runtime.is_connect:
                mode.setenv(CONNECT_MODE, "1")
            at_cut, done = reconstruct_group_to_paths(runtime.spark, config, "ledger", None, work / "out", "jsonl")
    finally:
        runtime.stop()
    assert at_cut.position == cuts[-1].position
    reader = GroupReader.of(config, "ledger")
    for name, result in done.items():
        table_reader, _ = reader.reader(name)
        rows = [row for part in result.parts for row in _jsonl_rows(part)]
        assert archived_rows(name, rows) == source.at(at_cut.position)[name]
        assert table_reader.key_fields == ("id",)


def as_of(dest: Any, key_prefix: str, position: str) -> list[dict[str, Any]]:
    """A table read on its own "as of" `position` (its newest boundary at or before it)."""
    rec = ArchiveReader(dest, key_prefix, key_fields=("id",)).reconstruct_as_of(position)
    assert rec is not None
    return rec.rows


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
