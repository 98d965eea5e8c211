"""Re-base cost on a live PostgreSQL table: `snapshotter run --once` against DuckDB and delta-rs.

Why: a user who wants a table's history in object storage could instead COPY it out and let
DuckDB write jsonl + parquet, and re-base by anti-joining the changed keys out of the last base;
or keep a Delta table and MERGE the changes into it. This measures the product as users run it
(`snapshotter run --once`, a subprocess, wall time) against those peers, in one run, on one table:

- a private PostgreSQL cluster (the test suite's), a table of `--rows` rows with the 8 columns of
  the generator's `users` table (bigint key, text, text, double, boolean, bigint, timestamptz,
  jsonb), REPLICA IDENTITY DEFAULT, bulk-loaded with `generate_series` in SQL;
- the initial snapshot (slot, initial copy, build of jsonl + protobuf + parquet), against
  `COPY ... TO` (psycopg2 `copy_expert` into a file) + DuckDB writing jsonl + parquet, in
  `--repeat` pairs (the peer, then ours as a new user's first run: its own slot, buffer, archive
  and Spark server); the ratio is the median of the pairs' ratios, since this host's speed drifts
  by tens of percent between minutes and a pair's two runs are seconds apart;
- the fixed cost: a `run --once` with nothing to do;
- three workloads, each followed by a diff run (`run --once`: ingest + diff) and a forced re-base
  (`run --once --force-snapshot --no-ingest`; once, whatever `--repeat`: a second forced re-base
  at the same position would find every bucket unchanged and re-base nothing):
  (a) uniform churn of 10% of the rows: 7% updates, 1% deletes, 2% inserts;
  (b) the same number of changes, all among the newest 2% of keys (updated 3.5 times on average,
      1% deleted), plus 2% inserts;
  (c) 100 hot keys spread over the key space, updated 1,000 times each (1,000 transactions);
  against, per workload, DuckDB re-basing its own previous base (base anti-join changed keys,
  union the changed rows, write jsonl + parquet) and delta-rs MERGE of the same
  changes into a Delta table (upsert + delete). The peers' change files (the changed keys and the
  current rows of those keys) are exported from PostgreSQL untimed, as the product's re-base
  reads changes its buffer already holds (`--no-ingest`).

Memory: the peak RSS of each run process with its children (every process of its session, sampled
every 0.2 s from /proc), and of the local Spark Connect server the first run starts and the others
reuse: its JVM's VmHWM (reset before each run) and its session (JVM + Python workers, sampled as
proportional set size, since forked workers share their daemon's pages and a sum of RSS would count
them once per worker).
Every step records the 1-minute load average at its start and its maximum during the step, since
other work may share the machine. Where the time goes comes from the run's own log: process start
(launch to the first log line: interpreter and imports; a run with `--no-ingest` logs first once it
has imported Dagster), ingest (catch-up to the source position), the Spark session, the Spark build
(the build's own log line), the rest of the artifact step (assembly and upload), the manifest step
(commit), and the remainder (importing Dagster and the code location after the ingest, which a run
does only once it has something to write; Dagster's run bookkeeping; the decision).

Prints the table and writes the section `## Re-base: run --once against DuckDB and delta-rs (N rows)`
of docs/benchmarks.md (only that section: each table size keeps its own, so 1M and 10M sit side by
side). Where the issue sets a target for the size (1,000,000 and 10,000,000 rows), the table says
whether it is met.

Run: `.venv/bin/python benchmarks/rebase.py [--rows 1000000] [--repeat 1]`
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402
import psycopg2.extensions  # noqa: E402
import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from benchmarks.ingest import private_cluster  # noqa: E402
from benchmarks.pipeline import (  # noqa: E402
    _status_kb,
    machine_facts,
    mib,
    reset_peak_rss,
    session_pss_kb,
    session_rss_kb,
)
from benchmarks.report import DOCS, write_section  # noqa: E402
from snapshot_assets.config import SparkConfig, load_config  # noqa: E402
from snapshot_assets.pipeline.table import TablePipeline  # noqa: E402
from snapshot_assets.spark.connect_server import (  # noqa: E402
    class_archive,
    local_server_info,
    pyspark_home,
    stop_local_connect_server,
)
from snapshot_assets.spark.server_memory import (  # noqa: E402
    DEFAULT_OVERHEAD,
    HEAP_KEY,
    OVERHEAD_KEY,
    memory_budget_mib,
)
from snapshot_assets.spark.session import LOCAL_DEFAULTS, warm_local_server  # noqa: E402
from tests.e2e.conftest import e2e_env  # noqa: E402
from tests.pg.conftest import PgCluster  # noqa: E402

SECTION = "## Re-base: run --once against DuckDB and delta-rs ({rows:,} rows)"
TABLE = "bench_rebase"
TOUCHED = "bench_touched"  # the keys a workload changed (not published: the peers' change list)
STATE_SUBDIR = Path(".snapshotter") / "spark-connect"
RUN_TIMEOUT_S = 4 * 3600.0
SAMPLE_S = 0.2
COLUMNS = ("id BIGINT, name VARCHAR, email VARCHAR, score DOUBLE, active BOOLEAN, balance BIGINT, "
           "updated_at TIMESTAMPTZ, tags JSON")
PG_COLUMNS = ("id bigint PRIMARY KEY, name text, email text, score double precision, active boolean, "
              "balance bigint, updated_at timestamp with time zone, tags jsonb")
CHUNK_IDS = 200_000  # id range per transaction of the bulk statements


def row_sql(i: str) -> str:
    """The generated row of key `i` (an SQL expression): every column filled, values vary by key."""
    return (f"{i}, 'user ' || {i}, 'user' || {i} || '@example.com', ({i} % 10007) / 7.0, {i} % 3 = 0, "
            f"({i} * 7919) % 1000003, timestamptz '2024-01-01 00:00:00+00' + {i} * interval '1 second', "
            f"jsonb_build_object('tier', {i} % 5, 'tags', jsonb_build_array('t' || ({i} % 10)))")


UPDATE_SET = ("name = name || '.', score = score + 0.5, balance = balance + 1, "
              "updated_at = updated_at + interval '1 minute'")


# ---- measuring a process ----------------------------------------------------------------------------


class Watch:
    """Samples, on a thread, the memory of a session and the 1-minute load average, until stopped.

    `session` names the session to sample, asked at every sample: a process that starts during the
    step (the Spark Connect server the first run launches) is sampled from when it appears. `peak_kb`
    is the peak of the session's summed RSS; with `proportional`, `peak_kb` sums PSS instead and
    `peak_others_kb` is the peak of the session without its leader (the server's Python workers
    without its JVM), both per sample.
    """

    def __init__(self, session: Callable[[], int | None] = lambda: None, *, proportional: bool = False) -> None:
        self.session = session
        self.proportional = proportional
        self.peak_kb = 0
        self.peak_others_kb = 0
        self.load_start = os.getloadavg()[0]
        self.load_max = self.load_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, session: int) -> None:
        if not self.proportional:
            self.peak_kb = max(self.peak_kb, session_rss_kb(session))
            return
        tree, others = session_pss_kb(session)
        self.peak_kb = max(self.peak_kb, tree)
        self.peak_others_kb = max(self.peak_others_kb, others)

    def _run(self) -> None:
        while True:
            session = self.session()
            if session is not None:
                self._sample(session)
            self.load_max = max(self.load_max, os.getloadavg()[0])
            if self._stop.wait(SAMPLE_S):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Step:
    """One measured step: seconds, memory, load, and (for runs) where the time went."""

    seconds: float
    load_start: float
    load_max: float
    peak_kb: int = 0  # the run process and its children
    server_jvm_kb: int = 0  # the Spark Connect server's JVM (VmHWM over the step)
    server_tree_kb: int = 0  # its session: JVM + Python workers (sampled, PSS)
    server_workers_kb: int = 0  # its session without the JVM: the Python workers (sampled, PSS)
    phases: dict[str, float] = field(default_factory=dict)
    output: str = ""

    @property
    def load_text(self) -> str:
        return f"{self.load_start:.1f}–{self.load_max:.1f}"


def timed(work: Any) -> Step:
    """Run `work()` in this process and time it, with the machine's load."""
    watch = Watch()
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    watch.stop()
    return Step(seconds, watch.load_start, watch.load_max)


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_MARKS = {
    "ingest_from": re.compile(r": catching up to "),
    "ingest_to": re.compile(r": buffer durable at "),
    "session": re.compile(r"Spark session ready in ([\d.]+)s"),
    "build": re.compile(r"(?:^|\s)(?:diff \(|snapshot at ).* in ([\d.]+)s$"),
    "step": re.compile(r'Finished execution of step "(\w+)" in ([\dhms.]+)\.'),
}
_DURATION_PART = re.compile(r"([\d.]+)(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration_s(text: str) -> float:
    """Dagster's step durations (`210ms`, `12.3s`, `1m7s`) in seconds."""
    return sum(float(value) * _UNIT_S[unit] for value, unit in _DURATION_PART.findall(text))


def phases(log_text: str, launched: float, wall: float) -> dict[str, float]:
    """Where a run's wall time went, from its log (see the module doc); absent phases are left out."""
    out: dict[str, float] = {}
    first: float | None = None
    ingest: dict[str, float] = {}
    steps: dict[str, float] = {}
    for line in log_text.splitlines():
        stamp = _STAMP.match(line)
        when = _dt.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if stamp else None
        if first is None and when is not None:
            first = when
        for name in ("ingest_from", "ingest_to"):
            if when is not None and _MARKS[name].search(line):
                ingest[name] = when
        if match := _MARKS["session"].search(line):
            out["session"] = out.get("session", 0.0) + float(match.group(1))
        if match := _MARKS["build"].search(line):
            out["spark build"] = out.get("spark build", 0.0) + float(match.group(1))
        if match := _MARKS["step"].search(line):
            steps[match.group(1)] = steps.get(match.group(1), 0.0) + duration_s(match.group(2))
    if first is not None:
        out["process start"] = max(0.0, first - launched)
    if len(ingest) == 2:
        out["ingest"] = ingest["ingest_to"] - ingest["ingest_from"]
    artifact = steps.get("snapshot", 0.0) + steps.get("diff", 0.0)
    if artifact:
        out["upload"] = max(0.0, artifact - out.get("spark build", 0.0) - out.get("session", 0.0))
    if "manifest" in steps:
        out["commit"] = steps["manifest"]
    checks = sum(v for k, v in steps.items() if k not in ("snapshot", "diff", "manifest"))
    if checks:
        out["asset checks"] = checks
    out["other (Dagster, decide)"] = max(0.0, wall - sum(out.values()))
    return out


# ---- the product ------------------------------------------------------------------------------------


class Product:
    """`snapshotter run --once` on the benchmark table, as users run it."""

    def __init__(self, work: Path, cluster: PgCluster, bucket_size: str = "", slot: str = f"{TABLE}_slot") -> None:
        self.work = work
        self.slot = slot
        state = f"state.bucket_size = {bucket_size}" if bucket_size else ""
        self.config = work / "snapshotter.conf"
        self.config.write_text(f"""
snapshotter {{
  source {{ type = postgres, dsn = {json.dumps(cluster.dsn())}, schema = public, table = {TABLE},
           slot = {slot}, publication = {TABLE}_pub }}
  key_fields = [id]
  retention.keep_epochs = 2
  destinations = [ {{ type = local, path = {json.dumps(str(work / "archive"))} }} ]
  formats {{ snapshot = [jsonl, protobuf, parquet], diff = [jsonl, protobuf, parquet] }}
  buffer {{ path = {json.dumps(str(work / "buffer"))} }}
  {state}
}}
""")
        self.logs = work / "logs"
        self.logs.mkdir()
        self.runs = 0

    @property
    def server_pid(self) -> int | None:
        info = local_server_info(self.work / STATE_SUBDIR)
        return info.pid if info else None

    def run(self, *flags: str) -> Step:
        """One `snapshotter run --once` in its own session (so its process tree is one session)."""
        self.runs += 1
        log = self.logs / f"run-{self.runs:02d}.log"
        # --verbose: Dagster's event log on stderr (this run's log), where the time breakdown is read from
        command = [str(Path(sys.executable).with_name("snapshotter")), "run", "--once", "--verbose", "--config",
                   str(self.config), *flags]
        server = self.server_pid
        if server is not None:
            reset_peak_rss(server)
        server_watch = Watch(lambda: self.server_pid, proportional=True)  # the server runs in a session of its own
        with log.open("wb") as err:
            launched = time.time()
            started = time.perf_counter()
            proc = subprocess.Popen(command, cwd=self.work, env=e2e_env(), stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=True)
            watch = Watch(lambda: proc.pid)
            out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
            seconds = time.perf_counter() - started
        watch.stop()
        server_watch.stop()
        text = log.read_text(errors="replace")
        if proc.returncode != 0:
            tail = "\n".join(text.splitlines()[-30:])
            raise RuntimeError(f"snapshotter run --once {' '.join(flags)} exited {proc.returncode}:\n{tail}")
        server = self.server_pid  # the first run starts it: its VmHWM then covers its whole life
        jvm = _status_kb(server, "VmHWM") if server is not None else 0
        return Step(seconds, watch.load_start, watch.load_max, watch.peak_kb, jvm, server_watch.peak_kb,
                    server_watch.peak_others_kb, phases(text, launched, seconds), out.decode(errors="replace").strip())

    def pipeline(self) -> TablePipeline:
        return TablePipeline(load_config(str(self.config)).tables[0])

    def stop(self) -> None:
        stop_local_connect_server(self.work / STATE_SUBDIR)


# ---- the source and the peers -----------------------------------------------------------------------


class Source:
    """The PostgreSQL table and the workloads on it; every workload records the keys it changed."""

    def __init__(self, cluster: PgCluster, rows: int) -> None:
        self.cluster = cluster
        self.rows = rows
        self.next_id = rows + 1

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        conn = self.cluster.connect()
        conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def chunked(self, statement: str, lo: int, hi: int) -> None:
        """`statement` (with `{lo}`/`{hi}` bounds on id) over [lo, hi) in transactions of CHUNK_IDS ids."""
        body = statement.format(lo="c", hi=f"c + {CHUNK_IDS}")
        self.sql(f"DO $$ DECLARE c bigint := {lo}; BEGIN WHILE c < {hi} LOOP {body}; COMMIT; "
                 f"c := c + {CHUNK_IDS}; END LOOP; END $$")

    def create(self) -> None:
        self.sql(f"CREATE TABLE {TABLE} ({PG_COLUMNS})")  # REPLICA IDENTITY DEFAULT: the primary key
        self.sql(f"CREATE UNLOGGED TABLE {TOUCHED} (id bigint PRIMARY KEY)")
        self.chunked(f"INSERT INTO {TABLE} SELECT {row_sql('i')} FROM generate_series({{lo}}, "
                     f"least({{hi}}, {self.rows + 1}) - 1) i", 1, self.rows + 1)
        self.sql(f"VACUUM ANALYZE {TABLE}")

    def insert(self, count: int) -> None:
        lo, self.next_id = self.next_id, self.next_id + count
        self.sql(f"INSERT INTO {TOUCHED} SELECT generate_series({lo}, {self.next_id - 1})")
        self.chunked(f"INSERT INTO {TABLE} SELECT {row_sql('i')} FROM generate_series({{lo}}, "
                     f"least({{hi}}, {self.next_id}) - 1) i", lo, self.next_id)

    def uniform(self) -> None:
        """(a) 7% updates, 1% deletes (by key modulo 100: spread evenly over the key space), 2% inserts."""
        self.sql(f"TRUNCATE {TOUCHED}")
        self.sql(f"INSERT INTO {TOUCHED} SELECT id FROM {TABLE} WHERE id % 100 < 8")
        self.chunked(f"UPDATE {TABLE} SET {UPDATE_SET} WHERE id >= {{lo}} AND id < {{hi}} AND id % 100 < 7",
                     1, self.next_id)
        self.chunked(f"DELETE FROM {TABLE} WHERE id >= {{lo}} AND id < {{hi}} AND id % 100 = 7", 1, self.next_id)
        self.insert(self.rows * 2 // 100)

    def recent(self) -> None:
        """(b) 10% of the rows' worth of changes, all among the newest 2% of keys, inserts included:
        3 updates of each, a 4th of the newest half, deletes of every other, then 2% new keys."""
        self.sql(f"TRUNCATE {TOUCHED}")
        newest = self.rows * 2 // 100
        (lo,), = self.sql(f"SELECT min(id) FROM (SELECT id FROM {TABLE} ORDER BY id DESC LIMIT {newest}) s")
        (mid,), = self.sql(f"SELECT min(id) FROM (SELECT id FROM {TABLE} ORDER BY id DESC LIMIT {newest // 2}) s")
        self.sql(f"INSERT INTO {TOUCHED} SELECT id FROM {TABLE} WHERE id >= {lo}")
        for _ in range(3):
            self.sql(f"UPDATE {TABLE} SET {UPDATE_SET} WHERE id >= {lo}")
        self.sql(f"UPDATE {TABLE} SET {UPDATE_SET} WHERE id >= {mid}")
        self.sql(f"DELETE FROM {TABLE} WHERE id >= {lo} AND id % 2 = 0")
        self.insert(self.rows * 2 // 100)

    def hot(self) -> None:
        """(c) 100 keys spread over the key space, each updated 1,000 times (1,000 transactions)."""
        self.sql(f"TRUNCATE {TOUCHED}")
        self.sql(f"INSERT INTO {TOUCHED} SELECT id FROM {TABLE} WHERE id % 100 = 50 "
                 f"AND id % {max(100, self.rows // 100)} = 50 ORDER BY id LIMIT 100")
        self.sql(f"DO $$ BEGIN FOR k IN 1..1000 LOOP UPDATE {TABLE} SET balance = balance + 1, "
                 f"updated_at = updated_at + interval '1 second' WHERE id IN (SELECT id FROM {TOUCHED}); "
                 f"COMMIT; END LOOP; END $$")

    def copy_out(self, query: str, path: Path) -> None:
        """`COPY (query) TO STDOUT` as CSV into `path`, through psycopg2's copy_expert."""
        conn = self.cluster.connect()
        try:
            with conn.cursor() as cur, path.open("wb") as out:
                cur.copy_expert(f"COPY ({query}) TO STDOUT WITH (FORMAT csv, HEADER)", out)
        finally:
            conn.close()

    def count(self) -> int:
        (n,), = self.sql(f"SELECT count(*) FROM {TABLE}")
        return int(n)


def csv_rows(path: Path) -> str:
    return f"read_csv({str(path)!r}, header = true, columns = {csv_columns()})"


def csv_columns() -> str:
    pairs = (c.strip().split(" ", 1) for c in COLUMNS.split(","))
    return "{" + ", ".join(f"'{name}': '{kind}'" for name, kind in pairs) + "}"


class DuckPeer:
    """DuckDB: COPY out + jsonl + parquet for the initial snapshot; base anti-join changes for re-bases."""

    def __init__(self, work: Path, source: Source) -> None:
        self.dir = work / "duckdb"
        self.dir.mkdir()
        self.source = source
        self.base = self.dir / "base-0.parquet"
        self.generation = 0

    def initial(self) -> tuple[Step, Step]:
        """(COPY out, DuckDB writes); the parquet written is the base of the first re-base."""
        csv = self.dir / "initial.csv"
        copy = timed(lambda: self.source.copy_out(f"SELECT * FROM {TABLE}", csv))
        write = timed(lambda: self._write(f"SELECT * FROM {csv_rows(csv)}", self.base))
        return copy, write

    def _write(self, query: str, parquet: Path) -> None:
        con = duckdb.connect()
        try:
            con.execute(f"CREATE TEMP TABLE snap AS {query}")
            con.execute(f"COPY snap TO {str(parquet.with_suffix('.jsonl'))!r} (FORMAT json)")
            con.execute(f"COPY snap TO {str(parquet)!r} (FORMAT parquet)")
        finally:
            con.close()

    def rebase(self, keys: Path, rows: Path) -> Step:
        """The previous base without the changed keys, plus the changed keys' current rows."""
        self.generation += 1
        target = self.dir / f"base-{self.generation}.parquet"
        query = (f"SELECT * FROM read_parquet({str(self.base)!r}) b ANTI JOIN "
                 f"read_csv({str(keys)!r}, header = true, columns = {{'id': 'BIGINT'}}) k USING (id) "
                 f"UNION ALL SELECT * FROM {csv_rows(rows)}")
        step = timed(lambda: self._write(query, target))
        self.base = target
        return step

    def rows(self) -> int:
        con = duckdb.connect()
        try:
            (n,), = con.execute(f"SELECT count(*) FROM read_parquet({str(self.base)!r})").fetchall()
            return int(n)
        finally:
            con.close()


def arrow(query: str) -> pa.Table:
    relation = duckdb.sql(query)
    if relation is None:
        raise RuntimeError(f"DuckDB returned no result for {query}")
    return relation.to_arrow_table()


class DeltaPeer:
    """delta-rs: a Delta table written from the initial copy, then MERGE of each workload's changes."""

    def __init__(self, work: Path) -> None:
        self.path = str(work / "delta")

    def initial(self, csv: Path) -> Step:
        table = arrow(f"SELECT * REPLACE (tags::VARCHAR AS tags) FROM {csv_rows(csv)}")
        return timed(lambda: write_deltalake(self.path, table))

    def merge(self, keys: Path, rows: Path) -> Step:
        """Upsert the changed rows, delete the changed keys that are gone: one MERGE."""
        source = arrow(
            f"SELECT r.* REPLACE (r.tags::VARCHAR AS tags), r.id IS NULL AS _gone, k.id AS _key FROM "
            f"read_csv({str(keys)!r}, header = true, columns = {{'id': 'BIGINT'}}) k "
            f"LEFT JOIN {csv_rows(rows)} r USING (id)")

        def work() -> None:
            (DeltaTable(self.path).merge(source=source, predicate="t.id = s._key", source_alias="s", target_alias="t")
             .when_matched_delete(predicate="s._gone")
             .when_matched_update(predicate="NOT s._gone", updates={c: f"s.{c}" for c in _names()})
             .when_not_matched_insert(predicate="NOT s._gone", updates={c: f"s.{c}" for c in _names()})
             .execute())
        return timed(work)

    def rows(self) -> int:
        return int(DeltaTable(self.path).to_pyarrow_dataset().count_rows())


def _names() -> list[str]:
    return [c.strip().split(" ", 1)[0] for c in COLUMNS.split(",")]


# ---- the benchmark ----------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    description: str
    diff: Step
    merge: Step
    rebase: Step
    peer_rebase: Step
    changed_keys: int
    diff_bytes: dict[str, int]


def median_step(steps: list[Step]) -> Step:
    return sorted(steps, key=lambda s: s.seconds)[len(steps) // 2]


def artifact_sizes(product: Product) -> tuple[dict[str, int], int]:
    """(bytes per format, rows or changes) of the manifest head's artifact."""
    m = product.pipeline().manifest()
    art = m.artifacts[-1]
    return ({fid: ref.size_bytes for fid, ref in art.formats.items()},
            art.row_count if art.kind == "snapshot" else art.change_count)


def check(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(f"{what}: {got:,} rows, the source has {expected:,}")


@dataclass
class Initial:
    """The initial snapshot's pairs: each a peer run (COPY out, DuckDB writes) and then ours, on the
    same table. The host's speed drifts by tens of percent between minutes; a pair's two runs are
    seconds apart, so the median of the pairs' ratios is the figure that holds."""

    ours: list[Step]
    copies: list[Step]
    writes: list[Step]

    @property
    def peers(self) -> list[float]:
        return [c.seconds + w.seconds for c, w in zip(self.copies, self.writes, strict=True)]

    @property
    def ratio(self) -> float:
        ratios = sorted(o.seconds / p for o, p in zip(self.ours, self.peers, strict=True))
        return ratios[len(ratios) // 2]


def prime_class_archive() -> float | None:
    """When the host has no class-data archive yet, start a local Spark Connect server as a run does
    and stop it, which writes one; the seconds its start took (None: nothing to prime).

    Why: the first server a host ever starts has no archive to map and boots about 3 s slower; it
    writes the archive as it ends. Without this, the first pairs of a fresh host's run would each
    pay that once-per-host cost (their servers overlap, so none maps the other's), and the median
    would report it as every initial snapshot's."""
    archive = class_archive(pyspark_home())
    if archive is None or archive.is_file():
        return None
    scratch = Path(tempfile.mkdtemp(prefix="bench-rebase-prime-"))
    started = time.perf_counter()
    try:
        warm = warm_local_server(SparkConfig(), scratch)
        if warm is not None:
            warm.join()
        seconds = time.perf_counter() - started
    finally:
        stop_local_connect_server(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    if not archive.is_file():
        raise RuntimeError(f"a server started and stopped without writing the class-data archive {archive}")
    return seconds


def fresh_initial(work: Path, cluster: PgCluster, source: Source, bucket_size: str, index: int) -> Step:
    """One more initial snapshot of the table, as a new user's first run: its own slot, buffer,
    archive and Spark Connect server (stopped, and the slot dropped, after)."""
    folder = work / f"initial-{index}"
    folder.mkdir()
    product = Product(folder, cluster, bucket_size, slot=f"{TABLE}_slot_{index}")
    try:
        step = product.run()
        check(f"initial snapshot {index}", artifact_sizes(product)[1], source.rows)
        return step
    finally:
        product.stop()
        source.sql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                   f"WHERE slot_name = '{product.slot}'")
        shutil.rmtree(folder, ignore_errors=True)


def run_workload(name: str, description: str, apply: Any, source: Source, product: Product, duck: DuckPeer,
                 delta: DeltaPeer, work: Path) -> Workload:
    print(f"workload {name}: {description} (load {os.getloadavg()[0]:.1f})", flush=True)
    started = time.perf_counter()
    apply()
    print(f"  source workload applied in {time.perf_counter() - started:.1f} s", flush=True)
    keys, rows = work / f"{name}-keys.csv", work / f"{name}-rows.csv"
    source.copy_out(f"SELECT id FROM {TOUCHED}", keys)
    source.copy_out(f"SELECT t.* FROM {TABLE} t JOIN {TOUCHED} USING (id)", rows)
    (changed,), = source.sql(f"SELECT count(*) FROM {TOUCHED}")
    expected = source.count()
    diff = product.run()
    if "diff@" not in diff.output:
        raise RuntimeError(f"workload {name}: the run wrote no diff: {diff.output}")
    diff_bytes, _ = artifact_sizes(product)
    print(f"  diff run {diff.seconds:.1f} s ({diff.output})", flush=True)
    merge = delta.merge(keys, rows)
    check(f"delta-rs after {name}", delta.rows(), expected)
    # Once: a second forced re-base at the same position would re-base nothing (every bucket reused).
    rebase = product.run("--force-snapshot", "--no-ingest")
    _, count = artifact_sizes(product)
    check(f"the re-base after {name}", count, expected)
    peer = duck.rebase(keys, rows)
    check(f"DuckDB's re-base after {name}", duck.rows(), expected)
    print(f"  re-base {rebase.seconds:.1f} s vs DuckDB {peer.seconds:.2f} s, delta-rs MERGE "
          f"{merge.seconds:.2f} s", flush=True)
    return Workload(name, description, diff, merge, rebase, peer, int(changed), diff_bytes)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b > 0 else "—"


def phase_text(step: Step) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in step.phases.items() if v >= 0.05)


TARGETS: dict[int, dict[str, float]] = {
    1_000_000: {"initial": 5.0, "a": 5.0, "b": 3.0, "c": 3.0},
    10_000_000: {"initial": 2.0, "a": 1.0, "b": 0.2, "c": 0.2},
}
"""The issue's targets: this project / the peer, per table size (initial snapshot; re-base per workload)."""


def target_text(rows: int, step: str, ours: float, peer: float) -> str:
    target = TARGETS.get(rows, {}).get(step)
    if target is None or peer <= 0:
        return "—"
    return f"≤ {target:g}×: {'met' if ours / peer <= target else 'NOT met'}"


def size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def row(label: str, ours: Step, peer_label: str, peer: float, target: str) -> str:
    return (f"| {label} | {ours.seconds:.1f} s | {peer_label} | {peer:.2f} | {ratio(ours.seconds, peer)} | {target} | "
            f"{mib(ours.peak_kb)} | {mib(ours.server_jvm_kb)} / {mib(ours.server_tree_kb)} | {ours.load_text} |")


def initial_row(rows: int, ours: Step, copy: Step, duck_write: Step, peer: float, pair_ratio: float) -> str:
    """The initial snapshot's row: medians of ours and of the peer, and the median of the pairs' ratios
    (the ratio column and the target's verdict)."""
    target = TARGETS.get(rows, {}).get("initial")
    verdict = "—" if target is None else f"≤ {target:g}×: {'met' if pair_ratio <= target else 'NOT met'}"
    return (f"| initial snapshot (slot, copy, 3 formats) | {ours.seconds:.1f} s | COPY TO ({copy.seconds:.1f} s) + "
            f"DuckDB jsonl + parquet ({duck_write.seconds:.1f} s) | {peer:.2f} | {pair_ratio:.1f}× | {verdict} | "
            f"{mib(ours.peak_kb)} | {mib(ours.server_jvm_kb)} / {mib(ours.server_tree_kb)} | {ours.load_text} |")


def server_memory_text(steps: list[Step]) -> str:
    """The server-memory target: the JVM's peak over every step against heap + overhead."""
    budget = memory_budget_mib(LOCAL_DEFAULTS)
    jvm = max(x.server_jvm_kb for x in steps)
    workers = max(x.server_workers_kb for x in steps)
    verdict = "no budget: the heap is Spark's default" if budget is None else (
        f"against its configured {budget:,} MiB (heap + overhead): {'met' if jvm <= budget * 1024 else 'NOT met'}")
    return (f"Spark Connect server peak RSS: the JVM's VmHWM over every step peaked at {mib(jvm)} {verdict}. "
            f"Its Python workers (the server's processes but its JVM, summed as proportional set size: a page "
            f"n of them share counts 1/n to each) peaked at {mib(workers)}: they hold one bucket at a time "
            f"each, not the table.")


def render(args: argparse.Namespace, facts: str, initial: Initial, delta_init: Step, fixed: list[Step],
           workloads: list[Workload], sizes: dict[str, int], elapsed: float) -> str:
    ours = median_step(initial.ours)
    copy, duck_write = median_step(initial.copies), median_step(initial.writes)
    peer_initial = sorted(initial.peers)[len(initial.peers) // 2]
    fixed_step = median_step(fixed)
    steps = [*initial.ours, *fixed, *(x for w in workloads for x in (w.diff, w.rebase))]
    busiest = max(x.load_max for x in steps)
    cores = os.cpu_count() or 1
    lines = [
        SECTION.format(rows=args.rows), "",
        f"Machine: {facts}. Produced by `benchmarks/rebase.py --rows {args.rows} --repeat {args.repeat}` in "
        f"{elapsed / 60:.0f} min; the Spark Connect server's JVM is held to spark.driver.memory "
        f"({LOCAL_DEFAULTS.get(HEAP_KEY, 'Spark default')}, its heap) + spark.driver.memoryOverhead "
        f"({LOCAL_DEFAULTS.get(OVERHEAD_KEY, DEFAULT_OVERHEAD)}).",
        "",
        f"A PostgreSQL table of {args.rows:,} rows (8 columns, REPLICA IDENTITY DEFAULT). Seconds are wall "
        f"time; the ratio is this project / the peer; the initial snapshot is the median of {args.repeat} "
        f"pair(s) (the peer, then ours; the ratio: the median of the pairs' ratios), the fixed cost the median "
        f"of {args.repeat} run(s), each re-base one run. "
        "Load is the 1-minute load average at the start of the step – its maximum during it."
        + (f" Other work shared the {cores} cores during this run (load up to {busiest:.1f}): every figure "
           "here is slower than on an idle machine." if busiest > cores else ""),
        "",
        "| step | this project | peer | peer s | ratio | target | run peak RSS | server JVM peak RSS / tree peak PSS "
        "| load |",
        "|---|---:|---|---:|---:|---|---:|---:|---|",
        initial_row(args.rows, ours, copy, duck_write, peer_initial, initial.ratio),
        f"| fixed cost (`run --once`, nothing to do) | {fixed_step.seconds:.1f} s | | | | | {mib(fixed_step.peak_kb)} "
        f"| | {fixed_step.load_text} |",
    ]
    for w in workloads:
        lines.append(row(f"({w.name}) diff run (ingest + diff)", w.diff, "delta-rs MERGE", w.merge.seconds, "—"))
        lines.append(row(f"({w.name}) re-base (`--force-snapshot --no-ingest`)", w.rebase,
                         "DuckDB base anti-join changes → jsonl + parquet", w.peer_rebase.seconds,
                         target_text(args.rows, w.name, w.rebase.seconds, w.peer_rebase.seconds)))
    lines += ["", server_memory_text(steps), "",
        "Workloads: " + "; ".join(f"({w.name}) {w.description}: {w.changed_keys:,} keys changed, diff "
                                  f"{size_text(w.diff_bytes.get('jsonl', 0))} jsonl" for w in workloads) + ".",
        f"delta-rs wrote the initial Delta table in {delta_init.seconds:.1f} s. Snapshot sizes: "
        + ", ".join(f"{fid} {size_text(size)}" for fid, size in sizes.items()) + ". The run-process RSS target "
        "(10,000,000 rows within 10% of 1,000,000) compares the sections of two runs.",
        "",
        "Where the time of each run went (seconds, from the run's log: process start = launch to the first log "
        "line, which a re-base without ingest writes after importing Dagster; ingest = catch-up to the source "
        "position; session = Spark session; spark build = the build's Spark job; upload = the rest of the "
        "artifact step; commit = the manifest step; asset checks = the manifest's checks; other = importing "
        "Dagster and the code location (only a run with something to write does), Dagster's run bookkeeping, "
        "the decision and the remainder):",
        "",
        f"- initial snapshot: {phase_text(ours)}",
        f"- fixed cost: {phase_text(fixed_step)}",
    ]
    for w in workloads:
        lines.append(f"- ({w.name}) diff: {phase_text(w.diff)}; re-base: {phase_text(w.rebase)}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def workspace(keep: bool) -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="bench-rebase-"))
    try:
        yield work
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=1,
                   help="initial snapshots (ours and the peer's, in pairs) and fixed-cost runs")
    p.add_argument("--keep", action="store_true", help="keep the working directory (logs, archive)")
    p.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    p.add_argument("--bucket-size", default="",
                   help="the state's bucket_size (default: the product's); implies --no-docs")
    args = p.parse_args(argv)
    if args.rows < 10_000 or args.repeat < 1:
        p.error("--rows must be at least 10,000 and --repeat at least 1")
    started = time.perf_counter()
    archive = class_archive(pyspark_home())
    primed = prime_class_archive()
    if primed is not None:
        jvm = (f"; no JVM class-data archive on the host at the start: a server started ({primed:.1f} s, a host's "
               "first start) and stopped before the measurements wrote it, and every measured server maps it, as "
               "every server after a host's first does")
    elif archive is not None and archive.is_file():
        jvm = "; the Spark Connect server's JVM maps the class-data archive an earlier server wrote"
    else:
        jvm = "; no JVM class-data archive (no JVM found to name one)"
    facts = machine_facts() + jvm
    print(f"{facts}\nload average at start: {os.getloadavg()[0]:.1f}", flush=True)
    with workspace(args.keep) as work, private_cluster() as cluster:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups on a kill
        source = Source(cluster, args.rows)
        product = Product(work, cluster, args.bucket_size)
        try:
            load = timed(source.create)
            print(f"loaded {args.rows:,} rows in {load.seconds:.1f} s", flush=True)
            duck, delta = DuckPeer(work, source), DeltaPeer(work)
            initial = Initial([], [], [])
            for index in range(args.repeat):
                copy, duck_write = duck.initial()
                initial.copies.append(copy)
                initial.writes.append(duck_write)
                if index == 0:  # the product whose archive the workloads continue
                    initial.ours.append(product.run())
                    sizes, count = artifact_sizes(product)
                    check("the initial snapshot", count, args.rows)
                else:
                    initial.ours.append(fresh_initial(work, cluster, source, args.bucket_size, index))
                print(f"initial snapshot {initial.ours[-1].seconds:.1f} s vs COPY {copy.seconds:.1f} s + DuckDB "
                      f"{duck_write.seconds:.1f} s", flush=True)
            delta_init = delta.initial(duck.dir / "initial.csv")
            fixed = [product.run() for _ in range(args.repeat)]
            print(f"fixed cost {median_step(fixed).seconds:.1f} s", flush=True)
            workloads = [
                run_workload("a", "uniform churn of 10% (7% updates, 1% deletes, 2% inserts)", source.uniform,
                             source, product, duck, delta, work),
                run_workload("b", "the same number of changes among the newest 2% of keys, plus 2% inserts",
                             source.recent, source, product, duck, delta, work),
                run_workload("c", "100 hot keys updated 1,000 times each", source.hot, source, product, duck, delta,
                             work),
            ]
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            product.stop()
    section = render(args, facts, initial, delta_init, fixed, workloads, sizes, time.perf_counter() - started)
    print()
    print(section)
    if not (args.no_docs or args.bucket_size):
        write_section(DOCS, SECTION.format(rows=args.rows), section)
        print(f"wrote the section to {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
