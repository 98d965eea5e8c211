"""Acceptance, end to end: a live PostgreSQL table archived by `snapshotter run --once` in rounds.

A first run archives the freshly created table (the initial load); then each round runs a random
workload of transactions on a private PostgreSQL cluster (tests/pg), then the real command
(`snapshotter run --once --config FILE`, the console script next to this Python, in a subprocess:
logical replication into the change buffer, the re-base policy, Spark, the manifest commit); a
last run with nothing new at the source writes nothing. The table is as users have it: REPLICA
IDENTITY DEFAULT (or USING INDEX on the primary key), a bigint key with values beyond 2^53, and
bigint, numeric, jsonb, timestamptz, bytea and text columns with NULLs, where the text, jsonb and
bytea values are often larger than 8 kB of random (incompressible) bytes, so PostgreSQL stores
them out of line and an UPDATE that leaves them alone does not resend them; the archive fills them
from its own previous images. The workload inserts, updates (most leaving the large values alone),
changes primary keys of such rows, deletes them, and TRUNCATEs once mid-round (inside a diff's
window). In some rounds a `run --once` is killed with SIGKILL at a random moment first, and the
next one must carry on from whatever it left; once the working state (snapshot STATE + diff
deltas) is deleted, and the next run must rebuild the base from the archive and the buffer.

The oracle. Inside every workload transaction the LAST statement before COMMIT reads
`pg_current_wal_insert_lsn()` (B_i), and a Python model keeps the table state S_i after it. With a
single writer B_i <= commit_lsn_i < B_{i+1}, so the source table at any committed position P is
S_k with k = max{i : B_i <= P}. The model is checked against `SELECT *` after every round, so the
test cannot agree with itself about a wrong table.

After every round: the manifest validates (chain contiguous); its head covers every transaction of
the round; epochs and the head only grow across rounds; for EVERY artifact boundary (each snapshot
and diff `to_position`) the archive rebuilt at that position equals the source table at that
position, in jsonl, protobuf and parquet each (protobuf carries integers beyond ±2^53 as decimal
strings, its documented mapping); and every diff, applied on its own epoch's snapshot, gives the
source table at its end (a diff that a later snapshot supersedes is checked too); and every `old`
image in every diff is the complete row as of the diff's `from` (under the default identity the
source sends only the key). By the end the policy (max_churn_records) has re-based at least once.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg2.extensions
import pytest
from psycopg2 import sql

from resources.destinations.base import Destination
from resources.destinations.factory import build_destination
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.positions import compare_lsn, parse_lsn
from snapshot_assets.archive.reader import ArchiveReader, ReplayPlan
from snapshot_assets.config import TableConfig, load_config
from snapshot_assets.spark.diff import INSERTS_ONLY_NOTE
from tests.e2e.conftest import SCENARIO, e2e_env
from tests.pg.conftest import PgCluster

pytestmark = SCENARIO

SEED: Final = 20240611
ROUNDS: Final = 5
TX_PER_ROUND: Final = 25
INITIAL_ROWS: Final = 60
TRUNCATE_ROUND: Final = 3  # a diff round: the TRUNCATE lands inside a diff window
MAX_CHURN: Final = 90  # ~50-70 changes a round: diffs and re-bases alternate
TABLE: Final = "e2e_rounds"
KEY: Final = ("id",)
FORMATS: Final = ("jsonl", "protobuf", "parquet")
RUN_TIMEOUT_S: Final = 240.0
MAX_SAFE_INT: Final = 2**53
LARGE: Final = 8_192  # bytes; values beyond it, random so they do not compress, live out of line
KILL_ROUNDS: Final = (1, 3)  # diff rounds whose first run is SIGKILLed at a random moment; the re-bases
# (rounds 2, 4) run unkilled, so the runs that decide them print their trigger
LOST_STATE_ROUND: Final = 3  # the working state is deleted first: the run rebuilds it from the archive + buffer
_LARGE_COLUMNS: Final = ("doc", "blob", "note")

_COLUMNS: Final = (("big", "bigint", ""), ("amount", "numeric", "::numeric"), ("doc", "jsonb", "::jsonb"),
                   ("at", "timestamptz", "::timestamptz"), ("blob", "bytea", ""), ("label", "text", ""),
                   ("note", "text", ""))
_NAMES: Final = tuple(name for name, _, _ in _COLUMNS)
_CAST: Final = {name: cast for name, _, cast in _COLUMNS}
_ID_POOLS: Final = ((1, 5_000), (2**53 - 40, 2**53 + 40), (2**63 - 60, 2**63 - 1), (-(2**63), -(2**63) + 60))
_CHARS: Final = "abcxyz XYZ019 ,{}\"'\\\n\té✓東😀<&>"

State = dict[TypedKey, Row]


# --- values: the SQL parameter and the row value the archive must hold (the source's mapping) ------


class Values:
    """Random column values as (SQL parameter, expected archive value), computed from the Python value."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def text(self, longest: int = 20) -> str:
        return "".join(self.rng.choice(_CHARS) for _ in range(self.rng.randint(0, longest)))

    def big(self) -> tuple[Any, Any]:
        value = self.rng.choice((self.rng.randint(-(2**63), 2**63 - 1), 2**53 + 1, -(2**53) - 7, 0, 42))
        return value, value

    def amount(self) -> tuple[Any, Any]:
        whole = str(self.rng.randrange(10 ** self.rng.randint(1, 28)))
        scale = self.rng.randint(0, 12)
        digits = whole + ("." + "".join(self.rng.choice("0123456789") for _ in range(scale)) if scale else "")
        if self.rng.random() < 0.4 and digits.strip("0.") != "":  # PostgreSQL prints -0 as 0
            digits = "-" + digits
        return digits, digits  # numeric without typmod prints exactly these digits

    def large_hex(self) -> str:
        """Random bytes as hex, larger than `LARGE`: incompressible, so stored out of line (TOAST)."""
        return self.rng.randbytes(self.rng.randint(LARGE // 2 + 64, LARGE)).hex()

    def doc(self) -> tuple[Any, Any]:
        value = {"n": self.rng.choice((self.rng.randint(-1000, 1000), 2**70 + 3, -(2**53) - 1)),
                 "s": self.text(8), "f": round(self.rng.uniform(-100, 100), 3), "ok": self.rng.random() < 0.5,
                 "list": [None, self.rng.randint(0, 9), {"deep": self.text(4)}]}
        if self.rng.random() < 0.5:
            value["payload"] = self.large_hex()
        return json.dumps(value), value

    def at(self) -> tuple[Any, Any]:
        stamp = dt.datetime(1950, 1, 1) + dt.timedelta(seconds=self.rng.randrange(150 * 365 * 86400))
        micros = self.rng.choice((0, self.rng.randrange(1_000_000)))
        fraction = f".{micros:06d}".rstrip("0") if micros else ""
        text = stamp.strftime("%Y-%m-%d %H:%M:%S") + fraction
        return text + "+00", text.replace(" ", "T") + "Z"

    def blob(self) -> tuple[Any, Any]:
        value = self.rng.randbytes(self.rng.choice((self.rng.randint(0, 32), self.rng.randint(LARGE + 1, 2 * LARGE))))
        return value, base64.b64encode(value).decode("ascii")

    def label(self) -> tuple[Any, Any]:
        value = self.text()
        return value, value

    def note(self) -> tuple[Any, Any]:
        value = self.large_hex()
        return value, value

    def column(self, name: str) -> tuple[Any, Any]:
        if self.rng.random() < 0.12:
            return None, None
        generate: Callable[[], tuple[Any, Any]] = getattr(self, name)
        return generate()


def expected_from_db(record: tuple[Any, ...]) -> Row:
    """A `SELECT id, big, amount::text, doc, at, blob, label, note` row as the archive must hold it."""
    ident, big, amount, doc, at, blob, label, note = record
    stamp = None
    if at is not None:
        utc = at.astimezone(dt.UTC)
        fraction = f".{utc.microsecond:06d}".rstrip("0") if utc.microsecond else ""
        stamp = utc.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"
    return {"id": ident, "big": big, "amount": amount, "doc": doc, "at": stamp,
            "blob": None if blob is None else base64.b64encode(bytes(blob)).decode("ascii"),
            "label": label, "note": note}


# --- the workload ------------------------------------------------------------------------------


@dataclass
class History:
    """`states[i]` is the table after transaction i; `bounds[i]` its B_i (states[0]: the setup)."""

    states: list[State] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)

    def index_at(self, position: str) -> int:
        lsn = parse_lsn(position)
        assert lsn is not None, position
        candidates = [i for i, b in enumerate(self.bounds) if b <= lsn]
        assert candidates, f"{position} is before the setup transaction"
        return candidates[-1]

    def at(self, position: str) -> State:
        return self.states[self.index_at(position)]


class Workload:
    """Random transactions on one connection, each applied to the model and bounded by B_i."""

    def __init__(self, conn: psycopg2.extensions.connection, seed: int, identity: str) -> None:
        self.conn = conn
        self.identity = identity
        self.rng = random.Random(seed)
        self.values = Values(self.rng)
        self.history = History()
        self.table = sql.Identifier(TABLE)
        self.pk_changes = self.truncates = self.toast_untouched = 0
        self.truncate_index = -1

    @property
    def model(self) -> State:
        return self.history.states[-1] if self.history.states else {}

    def _fresh_id(self, state: State) -> int:
        while True:
            low, high = self.rng.choice(_ID_POOLS)
            ident = self.rng.randint(low, high)
            if (ident,) not in state:
                return ident

    def _insert(self, cur: Any, state: State, ident: int | None = None) -> None:
        ident = self._fresh_id(state) if ident is None else ident
        generated = {name: self.values.column(name) for name in _NAMES}
        placeholders = sql.SQL(", ").join(sql.SQL("%s" + _CAST[n]) for n in _NAMES)
        cur.execute(sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, {})").format(
            self.table, sql.SQL(", ").join(map(sql.Identifier, _NAMES)), placeholders),
            [ident, *(p for p, _ in generated.values())])
        state[(ident,)] = {"id": ident, **{n: e for n, (_, e) in generated.items()}}

    def _update(self, cur: Any, state: State, *, new_key: bool = False) -> None:
        key = self.rng.choice(list(state))
        old = state[key]
        small = [n for n in _NAMES if n not in _LARGE_COLUMNS]
        chosen = self.rng.sample(small, self.rng.randint(0 if new_key else 1, 3))
        for name in _LARGE_COLUMNS:
            if self.rng.random() < 0.15:
                chosen.append(name)
            elif old[name] is not None:
                self.toast_untouched += 1
        sets = {name: self.values.column(name) for name in chosen}
        assignments = [sql.SQL("{} = %s" + _CAST[n]).format(sql.Identifier(n)) for n in sets]
        params: list[Any] = [p for p, _ in sets.values()]
        new = {**old, **{n: e for n, (_, e) in sets.items()}}
        if new_key:
            new["id"] = self._fresh_id(state)
            assignments.append(sql.SQL("id = %s"))
            params.append(new["id"])
            self.pk_changes += 1
        cur.execute(sql.SQL("UPDATE {} SET {} WHERE id = %s").format(self.table, sql.SQL(", ").join(assignments)),
                    [*params, old["id"]])
        del state[key]
        state[(new["id"],)] = new

    def _delete(self, cur: Any, state: State) -> int:
        key = self.rng.choice(list(state))
        cur.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table), [state[key]["id"]])
        ident: int = state.pop(key)["id"]
        return ident

    def transaction(self, body: Callable[[Any, State], None]) -> None:
        """Run `body` as one transaction; its last statement reads B_i; the model commits with it."""
        state = dict(self.model)
        with self.conn.cursor() as cur:
            body(cur, state)
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            bound = parse_lsn(cur.fetchone()[0])
        self.conn.commit()
        assert bound is not None
        self.history.states.append(state)
        self.history.bounds.append(bound)

    def setup(self) -> None:
        def create(cur: Any, state: State) -> None:
            columns = sql.SQL(", ").join(sql.SQL(f"{{}} {kind}").format(sql.Identifier(n)) for n, kind, _ in _COLUMNS)
            cur.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, {})").format(self.table, columns))
            if self.identity == "index":
                cur.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {}").format(
                    self.table, sql.Identifier(f"{TABLE}_pkey")))
            for _ in range(INITIAL_ROWS):
                self._insert(cur, state)

        self.transaction(create)

    def random_transaction(self, cur: Any, state: State) -> None:
        roll = self.rng.random()
        if roll < 0.08 and state:  # the same key twice in one transaction
            ident = self._delete(cur, state)
            self._insert(cur, state, ident)
            self._update(cur, state, new_key=self.rng.random() < 0.5)
            return
        for _ in range(self.rng.randint(1, 4)):
            size = len(state)
            weights = {"insert": 3.0 if size < 40 else 0.0 if size > 120 else 1.0, "update": 3.0,
                       "pk": 0.8, "delete": 0.0 if size < 20 else 1.0}
            step = self.rng.choices(list(weights), list(weights.values()))[0] if size else "insert"
            if step == "insert":
                self._insert(cur, state)
            elif step == "update":
                self._update(cur, state)
            elif step == "pk":
                self._update(cur, state, new_key=True)
            else:
                self._delete(cur, state)

    def truncate_transaction(self, cur: Any, state: State) -> None:
        """TRUNCATE, then refill some rows (one of them reusing a key that existed before) in the same transaction."""
        before = list(state)
        cur.execute(sql.SQL("TRUNCATE {}").format(self.table))
        state.clear()
        self._insert(cur, state, before[0][0] if before else None)
        for _ in range(self.rng.randint(5, 15)):
            self._insert(cur, state)
        self.truncates += 1
        self.truncate_index = len(self.history.states)  # the index this transaction's state will get

    def round(self, number: int) -> None:
        truncate_at = TX_PER_ROUND // 2 if number == TRUNCATE_ROUND else -1
        for i in range(TX_PER_ROUND):
            self.transaction(self.truncate_transaction if i == truncate_at else self.random_transaction)

    def table_now(self) -> State:
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT id, big, amount::text, doc, at, blob, label, note FROM {}").format(self.table))
            rows = [expected_from_db(r) for r in cur.fetchall()]
        self.conn.commit()
        return {typed_key(r, KEY): r for r in rows}


# --- comparing ---------------------------------------------------------------------------------


def protobuf_view(value: Any) -> Any:
    """A value as protobuf's documented mapping carries it: integers beyond ±2^53 as decimal strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value) if abs(value) > MAX_SAFE_INT else value
    if isinstance(value, dict):
        return {k: protobuf_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [protobuf_view(v) for v in value]
    return value


def first_difference(got: State, expected: State, fid: str) -> str | None:
    view: Callable[[Any], Any] = protobuf_view if fid == "protobuf" else (lambda v: v)
    if got.keys() != expected.keys():
        missing, extra = expected.keys() - got.keys(), got.keys() - expected.keys()
        return f"keys differ: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}"
    for key in expected:
        want = view(expected[key])
        if got[key] != want:
            cols = [c for c in want if got[key].get(c) != want[c]] or sorted(set(got[key]) ^ set(want))
            return f"row {key}: columns {cols}: got {[got[key].get(c) for c in cols]!r:.300}, " \
                   f"expected {[want.get(c) for c in cols]!r:.300}"
    return None


def as_state(rows: Iterator[Row] | list[Row]) -> State:
    out: State = {}
    for row in rows:
        key = typed_key(row, KEY)
        assert key not in out, f"duplicate key {key} in a rebuilt table"
        out[key] = row
    return out


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Archive:
    table: TableConfig
    dest: Destination

    def reader(self, fid: str | None = None) -> ArchiveReader:
        return ArchiveReader(self.dest, self.table.key_prefix, formats=[fid] if fid else None, key_fields=KEY,
                             cmp=compare_lsn)


def write_config(path: Path, dsn: str, work: Path, *, table: str = TABLE, max_churn: int = MAX_CHURN) -> None:
    """The table's config file; `max_churn = 0` turns the churn re-base off."""
    path.write_text(f"""
snapshotter {{
  source {{
    type = postgres
    dsn = "{dsn}"
    schema = public
    table = {table}
    slot = {table}_slot
    publication = {table}_pub
  }}
  key_fields = [id]
  diff.interval = 1s
  snapshot {{ min_interval = 0s, max_churn_records = {max_churn} }}
  retention.keep_epochs = 0
  destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
  formats {{
    snapshot = [jsonl, protobuf, parquet]
    diff = [jsonl, protobuf, parquet]
  }}
  buffer {{ path = "{work / 'buffer'}", seal_interval = 200ms }}
}}
""")


def run_once(config: Path, work: Path, log: Path) -> str:
    """`snapshotter run --once --config FILE` as its own process; returns its stdout."""
    command = [str(Path(sys.executable).with_name("snapshotter")), "run", "--once", "--config", str(config)]
    with log.open("ab") as err:
        done = subprocess.run(command, cwd=work, env=e2e_env(), stdout=subprocess.PIPE, stderr=err,
                              timeout=RUN_TIMEOUT_S, check=False)
    out = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"snapshotter run --once exited {done.returncode}:\n{out}\n{tail}")
    return out


@dataclass
class Kill:
    """A `run --once` meant to be killed: when, and what it printed if it finished first."""

    delay: float
    output: str | None  # None: it was killed


def drop_archived_table(conn: psycopg2.extensions.connection, table: str) -> None:
    """Leave the shared cluster as the test found it: the table, its slot and publication gone."""
    conn.rollback()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND NOT active", (f"{table}_slot",))
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        cur.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(f"{table}_pub")))
    conn.close()


def killed_run(config: Path, work: Path, log: Path, rng: random.Random, typical_s: float) -> Kill:
    """Start `run --once` and SIGKILL it at a random moment of a run of typical length `typical_s`
    (ingest, Spark build, upload or commit), so the kill lands inside however fast the machine is."""
    command = [str(Path(sys.executable).with_name("snapshotter")), "run", "--once", "--config", str(config)]
    delay = rng.uniform(0.1, 0.8) * typical_s
    with log.open("ab") as err, tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(command, cwd=work, env=e2e_env(), stdout=out, stderr=err)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return Kill(delay, None)
        out.seek(0)
        return Kill(delay, out.read().decode(errors="replace"))


def check_archive(archive: Archive, history: History, *, complete: bool = True) -> Manifest:
    """Every assertion that must hold after a round (after a killed run: all but the head covering
    the round); returns the manifest checked."""
    manifest = archive.reader().load_manifest()
    manifest.validate(compare_lsn)
    assert manifest.artifacts and manifest.artifacts[0].is_snapshot
    assert all(sorted(a.formats) == sorted(FORMATS) for a in manifest.artifacts), "an artifact lacks a format"
    assert not complete or history.index_at(manifest.head_position) == len(history.states) - 1, (
        f"head {manifest.head_position} does not cover the round's last transaction")
    check_boundaries(archive, manifest, history)
    return manifest


def check_boundaries(archive: Archive, manifest: Manifest, history: History) -> None:
    """In every format: the archive rebuilt at every artifact boundary equals the source there, every
    diff folded on its own epoch's snapshot (those a later snapshot supersedes included) too, and
    every diff's `old` images are the rows as of its `from`."""
    boundaries = list(dict.fromkeys(a.to_position for a in manifest.artifacts))
    for fid in FORMATS:
        reader = archive.reader(fid)
        for position in boundaries:
            rec = reader.reconstruct_as_of(position, manifest)
            assert rec is not None and rec.position == position
            problem = first_difference(as_state(rec.rows), history.at(position), fid)
            assert problem is None, f"{fid} at {position}: {problem}"
        snapshot: Artifact | None = None
        diffs: list[Artifact] = []
        for art in manifest.artifacts:
            if art.is_snapshot:
                snapshot, diffs = art, []
                continue
            diffs.append(art)
            assert snapshot is not None
            state = reader.fold(ReplayPlan(snapshot, tuple(diffs), art.to_position))
            problem = first_difference(as_state(list(state.rows())), history.at(art.to_position), fid)
            assert problem is None, f"{fid}, epoch {art.epoch} chain to {art.to_position}: {problem}"
            check_old_images(reader, art, history, fid)


def check_old_images(reader: ArchiveReader, diff: Artifact, history: History, fid: str) -> None:
    """Every `old` of a diff is the complete row as of its `from` (not the key-only image the source sent)."""
    olds = [c.old for c in reader.iter_diff(diff) if c.old is not None]
    start = history.at(diff.from_position or "")
    problem = first_difference(as_state(olds), {typed_key(o, KEY): start[typed_key(o, KEY)] for o in olds}, fid)
    assert problem is None, f"{fid}, diff to {diff.to_position}: an old image is not the row at its from: {problem}"


@pytest.mark.parametrize(("identity", "rounds"), [("default", ROUNDS), ("index", TRUNCATE_ROUND)])
def test_postgres_rounds(pg_cluster: PgCluster, workdir: Path, identity: str, rounds: int) -> None:
    """DEFAULT identity: every round, kills, lost state; USING INDEX: the rounds up to the TRUNCATE."""
    started = time.monotonic()
    config = workdir / "snapshotter.conf"
    write_config(config, pg_cluster.dsn(), workdir)
    table = load_config(config, env={}).tables[0]
    archive = Archive(table, build_destination(table.destinations[0]))
    log = workdir / "runs.log"

    conn = pg_cluster.connect()
    conn.autocommit = False
    workload = Workload(conn, SEED, identity)
    killer = random.Random(SEED + 1)
    kills: list[Kill] = []
    durations: list[float] = []
    epochs: list[int] = []
    heads: list[str] = []
    outputs: list[str] = []
    try:
        workload.setup()
        for number in range(rounds + 1):  # round 0: the initial load alone, of the setup's rows
            if number:
                workload.round(number)
            assert workload.table_now() == workload.model, f"round {number}: the model drifted from the table"
            if number == LOST_STATE_ROUND:
                shutil.rmtree(workdir / "buffer" / "_state")
            if number in KILL_ROUNDS:
                kill = killed_run(config, workdir, log, killer, min(durations))
                kills.append(kill)
                outputs.extend([kill.output] if kill.output is not None else [])
                check_archive(archive, workload.history, complete=False)
            began = time.monotonic()
            outputs.append(run_once(config, workdir, log))
            durations.append(time.monotonic() - began)
            manifest = check_archive(archive, workload.history)
            if heads:
                assert compare_lsn(manifest.head_position, heads[-1]) > 0, "the head did not advance"
                assert manifest.epoch >= epochs[-1], f"epoch went from {epochs[-1]} back to {manifest.epoch}"
            epochs.append(manifest.epoch)
            heads.append(manifest.head_position)
        # Nothing new at the source: the run writes nothing and the manifest stays as it was.
        idle = run_once(config, workdir, log)
        assert "nothing new" in idle, idle
        assert archive.reader().load_manifest().artifacts == manifest.artifacts
    finally:
        drop_archived_table(conn, TABLE)

    final = archive.reader().load_manifest()
    assert final.epoch >= 2 and sum(a.is_snapshot for a in final.artifacts) >= 2, "no re-base happened"
    assert any("(max_churn_records)" in out for out in outputs), outputs
    assert any(not a.is_snapshot for a in final.artifacts), "no diff was written"
    assert workload.truncates == 1 and workload.pk_changes > 0 and workload.toast_untouched > 0
    history = workload.history
    assert any(not a.is_snapshot and history.index_at(a.from_position or "") < workload.truncate_index
               <= history.index_at(a.to_position) for a in final.artifacts), "no diff holds the TRUNCATE"
    print("".join(outputs))
    print(f"{identity}: {rounds} rounds, {len(workload.history.states) - 1} transactions, epochs {epochs}, "
          f"{len(final.artifacts)} artifacts, runs killed after "
          f"{[round(k.delay, 1) for k in kills if k.output is None]} s "
          f"({sum(k.output is not None for k in kills)} finished first), "
          f"{workload.toast_untouched} updates left large values alone, {time.monotonic() - started:.0f}s")


APPEND_ROUNDS: Final = 2  # rounds of INSERTs only, then one mixed round


def _event_log(out: str) -> str:
    """The text of the event log a `run --once` names on its first line of output."""
    (line,) = [line for line in out.splitlines() if line.startswith("event log: ")]
    return Path(line.removeprefix("event log: ")).read_text(errors="replace")


def test_an_append_only_table_under_the_default_identity(pg_cluster: PgCluster, workdir: Path) -> None:
    """An append-only table (REPLICA IDENTITY DEFAULT, large out-of-line values, keys beyond 2^53):
    each diff window of INSERTs only has no before-image, the build leaves their typing out of the
    parquet diff (its run log says so), and every boundary rebuilt in every format equals the source;
    no diff holds an `old` image. A later round that updates and deletes (the source sends no old row
    for an UPDATE) types them again, and its `old` images are the rows as of the diff's `from`."""
    config = workdir / "snapshotter.conf"
    write_config(config, pg_cluster.dsn(), workdir, max_churn=0)
    table = load_config(config, env={}).tables[0]
    archive = Archive(table, build_destination(table.destinations[0]))
    log = workdir / "runs.log"
    conn = pg_cluster.connect()
    conn.autocommit = False
    workload = Workload(conn, SEED + 7, "default")

    def inserts(cur: Any, state: State) -> None:
        for _ in range(workload.rng.randint(1, 4)):
            workload._insert(cur, state)

    logs: list[str] = []
    try:
        workload.setup()
        run_once(config, workdir, log)  # the initial load
        for number in range(APPEND_ROUNDS + 1):
            for _ in range(TX_PER_ROUND):
                workload.transaction(inserts if number < APPEND_ROUNDS else workload.random_transaction)
            assert workload.table_now() == workload.model
            logs.append(_event_log(run_once(config, workdir, log)))
            manifest = check_archive(archive, workload.history)
    finally:
        drop_archived_table(conn, TABLE)

    diffs = [a for a in manifest.artifacts if not a.is_snapshot]
    assert len(diffs) == APPEND_ROUNDS + 1 and sum(a.is_snapshot for a in manifest.artifacts) == 1, manifest.artifacts
    assert all(INSERTS_ONLY_NOTE in text for text in logs[:APPEND_ROUNDS]), "an insert-only diff typed before-images"
    assert INSERTS_ONLY_NOTE not in logs[-1], "the mixed round's diff left its before-images untyped"
    for fid in FORMATS:
        reader = archive.reader(fid)
        for diff in diffs[:APPEND_ROUNDS]:
            changes = list(reader.iter_diff(diff))
            assert changes and all(c.action is Action.INSERT and c.old is None for c in changes), fid
        assert any(c.old is not None for c in reader.iter_diff(diffs[-1])), fid
