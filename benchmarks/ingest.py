"""Ingest throughput: PostgreSQL logical replication into the change buffer, against the raw slot.

One private cluster (the test fixture's own setup, tests/pg/conftest.py), one table, one workload
of N row changes written to the WAL *before* anything consumes it, so every consumer reads exactly
the same stream from its own replication slot (all slots are created before the workload):

- raw: `pg_recvlogical` (C, libpq) with pgoutput `proto_version=1` and the publication, writing to
  /dev/null, stopped by `--endpos` at the workload's end LSN: what the server and the wire can do.
- psycopg2 transport: the same messages through psycopg2's `read_message`, not decoded: the cost of
  the Python replication client alone.
- decode: `PostgresSubscriber.events()` consumed and dropped: + pgoutput decoding into change
  events (their images stay column text, typed only when read: `text_rows`).
- ingest: the real path, `PostgresSubscriber` → `run_ingest` → `ChangeBuffer` (keys, Parquet
  segments holding the column text, fsync, index, acknowledgements), built from a config as
  `snapshotter ingest` builds it; timed until the last change is durable. Typing and Go-JSON
  encoding of the images happen in the build (`segments.with_images`), not here.

The whole measurement runs twice, on a table with REPLICA IDENTITY DEFAULT (updates carry no old
row, deletes the old key) and on one with REPLICA IDENTITY FULL (updates and deletes carry the
whole old row: what the service requires of a table with TOASTable columns under
`unchanged_toast = "require-full"`). Prints the tables and writes the section
`## Ingest: PostgreSQL → change buffer` of docs/benchmarks.md (only that section; the others are
kept).

Run: `.venv/bin/python benchmarks/ingest.py [--changes 200000] [--tx-size 10]`
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import resource
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2.extras

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.report import DOCS, write_section  # noqa: E402
from resources.buffer import BufferReader, ChangeBuffer  # noqa: E402
from resources.ingest import run_ingest  # noqa: E402
from resources.subscribers.events import ChangeEvent, Event, ResyncEnd, TxEnd  # noqa: E402
from resources.subscribers.factory import build_subscriber  # noqa: E402
from snapshot_assets.archive.positions import format_lsn, parse_lsn  # noqa: E402
from snapshot_assets.config import TableConfig, parse_config  # noqa: E402
from tests.pg import conftest as pg_fixtures  # noqa: E402

SECTION = "## Ingest: PostgreSQL → change buffer"
IDENTITIES = ("DEFAULT", "FULL")
ROLES = ("ingest", "raw", "transport", "decode")


@dataclasses.dataclass(frozen=True)
class Names:
    """One identity's table, publication and slots (both runs share the cluster)."""

    identity: str

    @property
    def table(self) -> str:
        return f"bench_ingest_{self.identity.lower()}"

    @property
    def publication(self) -> str:
        return f"{self.table}_pub"

    def slot(self, role: str) -> str:
        return f"{self.table}_{role}"

# The workload is generated server-side (a procedure committing per transaction) so producing 200k
# changes takes seconds, not the minutes of a client round trip per statement. The live ids are
# always exactly [lo, hi): each transaction inserts at hi, updates a contiguous block inside the
# live range and deletes at lo, so every statement touches exactly the rows it counts.
_DDL = """
CREATE TABLE {table} (
  id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2), score float8, active bool,
  created_at timestamptz, tags text[], payload jsonb);
ALTER TABLE {table} REPLICA IDENTITY {identity};
CREATE PUBLICATION {publication} FOR TABLE {table};
CREATE PROCEDURE {table}_workload(transactions int, inserts int, updates int, deletes int, first_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
  lo bigint := 1;
  hi bigint := first_id;
  off bigint;
BEGIN
  FOR i IN 1..transactions LOOP
    INSERT INTO {table}
      SELECT g, 'user-' || g, g * 1.25, g / 7.0, g % 3 = 0, '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 s',
             ARRAY['tag-' || (g % 10), 'x'], jsonb_build_object('n', g, 'kind', 'new', 'flags', jsonb_build_array(1, 2))
      FROM generate_series(hi, hi + inserts - 1) g;
    hi := hi + inserts;
    off := lo + (i::bigint * 7919) % (hi - lo - updates + 1);
    UPDATE {table} SET name = 'user-' || id || '-' || i, score = score + 1, active = NOT active,
                       payload = jsonb_build_object('n', id, 'kind', 'updated', 'tx', i)
      WHERE id >= off AND id < off + updates;
    DELETE FROM {table} WHERE id >= lo AND id < lo + deletes;
    lo := lo + deletes;
    COMMIT;
  END LOOP;
END $$;
"""


@dataclasses.dataclass(frozen=True)
class Stamp:
    """A moment: wall clock, and the client's CPU time (every thread of this process plus its
    finished children, i.e. pg_recvlogical). CPU time is reported next to wall time because it
    does not grow when other work shares the machine's cores."""

    wall: float
    cpu: float

    @classmethod
    def now(cls) -> Stamp:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(time.perf_counter(), time.process_time() + children.ru_utime + children.ru_stime)


@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    changes: int
    start: Stamp
    end: Stamp

    @property
    def seconds(self) -> float:
        return self.end.wall - self.start.wall

    @property
    def cpu_seconds(self) -> float:
        return self.end.cpu - self.start.cpu

    @property
    def rate(self) -> float:
        return self.changes / self.seconds


@contextlib.contextmanager
def private_cluster() -> Iterator[pg_fixtures.PgCluster]:
    """The test suite's private cluster, through the fixture's own generator (no second copy of it)."""
    fixture: Callable[[], Iterator[pg_fixtures.PgCluster]] = pg_fixtures.pg_cluster.__wrapped__  # type: ignore[attr-defined]
    with contextlib.contextmanager(fixture)() as cluster:
        yield cluster


def _sql(cluster: pg_fixtures.PgCluster, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = cluster.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def _lsn(text: str) -> int:
    value = parse_lsn(text)
    if value is None:
        raise ValueError(f"not an LSN: {text!r}")
    return value


def _table_config(cluster: pg_fixtures.PgCluster, names: Names, buffer_root: Path, seal_interval: float,
                  seal_changes: int) -> TableConfig:
    """The table as `snapshotter ingest` would read it from its configuration file."""
    config = parse_config(f"""snapshotter {{
  source {{ type = postgres, dsn = {json.dumps(cluster.dsn())}, table = {names.table}, slot = {names.slot("ingest")},
           publication = {names.publication} }}
  destinations = [ {{ type = local, path = {json.dumps(str(buffer_root / "archive"))} }} ]
  buffer {{ path = {json.dumps(str(buffer_root))}, seal_interval = {seal_interval}s, seal_changes = {seal_changes} }}
}}""", file="<benchmark>", env={})
    return config.tables[0]


class _SealAtLast(ChangeBuffer):
    """The real buffer, plus: once the awaited boundary is appended, seal it at once and stop the loop.

    Why: after the workload's last transaction nothing else arrives, so its partial batch would
    wait up to `seal_interval` for a timed seal, and that idle wait is not throughput. Sealing right
    away is what a shutdown does; the measured end is "every change durable".
    """

    def __init__(self, table: TableConfig, *, ordering: str, stop: threading.Event,
                 is_last: Callable[[Event], bool]) -> None:
        super().__init__(table.buffer.path, table.name, ordering=ordering,
                         seal_interval=table.buffer.seal_interval.total_seconds(),
                         seal_changes=table.buffer.seal_changes)
        self._stop = stop
        self._is_last = is_last
        self.done_at: Stamp | None = None

    def append(self, event: Event) -> bool:
        durable = super().append(event)
        if self.done_at is None and self._is_last(event):
            durable = self.seal() or durable
            self.done_at = Stamp.now()
            self._stop.set()
        return durable


def ingest_until(table: TableConfig, is_last: Callable[[Event], bool], changes: int = 0) -> Result:
    """Run the real ingest loop until `is_last` is durable."""
    stop = threading.Event()
    subscriber = build_subscriber(table)
    started = Stamp.now()
    try:
        buffer = _SealAtLast(table, ordering=subscriber.ordering, stop=stop, is_last=is_last)
        with buffer:
            run_ingest(subscriber, buffer, stop=stop)
            if buffer.done_at is None:
                raise RuntimeError("the ingest loop ended before the last transaction")
            return Result("ingest (PostgresSubscriber → run_ingest → ChangeBuffer)", changes, started,
                          buffer.done_at)
    finally:
        subscriber.close()


def run_workload(cluster: pg_fixtures.PgCluster, names: Names, changes: int, tx_size: int,
                 first_id: int) -> tuple[int, int, int]:
    """Write the workload; returns (changes written, WAL start LSN, WAL end LSN)."""
    deletes = max(1, tx_size // 10)
    inserts = max(1, (tx_size - deletes + 1) // 2) if tx_size > 2 else 1
    updates = tx_size - inserts - deletes
    if updates < 0 or inserts < deletes:
        raise SystemExit("--tx-size must be at least 2")
    transactions = math.ceil(changes / tx_size)
    (start,), = _sql(cluster, "SELECT pg_current_wal_lsn()::text")
    conn = cluster.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CALL {names.table}_workload(%s, %s, %s, %s, %s)",
                        (transactions, inserts, updates, deletes, first_id))
            cur.execute("SELECT pg_current_wal_lsn()::text")
            (end,) = cur.fetchone()
    finally:
        conn.close()
    return transactions * tx_size, _lsn(start), _lsn(end)


def measure_raw(cluster: pg_fixtures.PgCluster, names: Names, end_lsn: int, changes: int) -> Result:
    """pg_recvlogical from its slot to /dev/null, stopped at the workload's end LSN."""
    command = [str(cluster.bindir / "pg_recvlogical"), "-d", cluster.dsn(), "--slot", names.slot("raw"), "--start",
               "--endpos", format_lsn(end_lsn), "--no-loop", "-o", "proto_version=1",
               "-o", f"publication_names={names.publication}", "-f", "/dev/null"]
    started = Stamp.now()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    ended = Stamp.now()
    if done.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({done.returncode}): {done.stderr}")
    return Result("pg_recvlogical (raw slot, C)", changes, started, ended)


def measure_transport(cluster: pg_fixtures.PgCluster, names: Names, last_commit: int, changes: int) -> Result:
    """psycopg2's replication protocol alone: every message read, none decoded."""
    conn = psycopg2.connect(cluster.dsn(), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = conn.cursor()
        started = Stamp.now()
        cur.start_replication(slot_name=names.slot("transport"), slot_type=psycopg2.extras.REPLICATION_LOGICAL,
                              options={"proto_version": "1", "publication_names": names.publication}, decode=False)
        while True:
            message = cur.read_message()
            if message is None:
                select.select([conn], [], [], 1.0)
                continue
            payload: bytes = message.payload
            # Commit: 'C', flags (1 byte), commit LSN (8 bytes, big-endian), ...
            if payload[:1] == b"C" and int.from_bytes(payload[2:10], "big") == last_commit:
                return Result("psycopg2 transport only (no decoding)", changes, started, Stamp.now())
    finally:
        conn.close()


def measure_decode(table: TableConfig, names: Names, start: str, changes: int) -> tuple[Result, str]:
    """`PostgresSubscriber.events()` drained until the workload's last transaction end."""
    source = dataclasses.replace(table.source, slot=names.slot("decode"))
    subscriber = build_subscriber(dataclasses.replace(table, source=source))
    seen = 0
    started = Stamp.now()
    try:
        for event in subscriber.events(start):
            if isinstance(event, ChangeEvent):
                seen += 1
            elif isinstance(event, TxEnd) and seen >= changes:
                if seen != changes:
                    raise RuntimeError(f"decoded {seen} changes, the workload wrote {changes}")
                return Result("decode only (PostgresSubscriber events)", changes, started,
                              Stamp.now()), event.position
    finally:
        subscriber.close()
    raise RuntimeError("the stream ended")


@dataclasses.dataclass(frozen=True)
class Run:
    """One identity's measurement: raw, transport, decode, ingest (in that order) and the buffer."""

    names: Names
    results: list[Result]
    wal_bytes: int
    buffer_stats: str

    @property
    def ratio(self) -> float:
        return self.results[-1].rate / self.results[0].rate


_OLD_ROW = {"DEFAULT": "updates carry no old row, deletes only the old key",
            "FULL": "updates and deletes carry the whole old row"}


def render_run(run: Run) -> list[str]:
    """One identity's table and where its client CPU goes."""
    raw, transport, decode, ingest = run.results
    lines = [
        f"### REPLICA IDENTITY {run.names.identity} ({_OLD_ROW[run.names.identity]}; {run.wal_bytes / 1e6:.1f} MB "
        "of WAL)",
        "",
        "| consumer | seconds | changes/s | vs raw | client CPU s | CPU µs/change |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {r.name} | {r.seconds:.2f} | {r.rate:,.0f} | {r.rate / raw.rate:.2f}× | {r.cpu_seconds:.2f} | "
              f"{r.cpu_seconds / r.changes * 1e6:.1f} |" for r in run.results]
    # Decoding and buffering run on two threads of one interpreter (the GIL), so their costs add up;
    # CPU time splits them without the noise of other work on the machine.
    split = {"the replication client": transport.cpu_seconds, "decoding": decode.cpu_seconds - transport.cpu_seconds,
             "the buffer (and the hand-over between the two threads)": ingest.cpu_seconds - decode.cpu_seconds}
    shares = ", ".join(f"{name} {cpu:.1f} s ({cpu / ingest.cpu_seconds:.0%})" for name, cpu in split.items())
    verdict = "met" if run.ratio >= 0.5 else "not met"
    ceiling = ingest.changes / ingest.cpu_seconds
    lines += ["", f"Ingest reaches {run.ratio:.0%} of the raw slot throughput in this run (goal: at least 50%: "
              f"{verdict}); the buffer: {run.buffer_stats}. Client CPU: {shares}. CPU bound (computed from CPU "
              f"time, not measured): at {ingest.cpu_seconds / ingest.changes * 1e6:.1f} µs of client CPU per change, "
              f"one otherwise idle core ingests at most {ceiling:,.0f} changes/s, "
              f"{ceiling / raw.rate:.2f}× this run's raw rate.", ""]
    return lines


def render(runs: list[Run], args: argparse.Namespace, server: str) -> str:
    """The Markdown section: one table per identity, and what the rows mean."""
    lines = [
        SECTION,
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at the end: "
        f"other work shares them), {platform.python_implementation()} {platform.python_version()}, "
        f"PostgreSQL {server}; produced by `benchmarks/ingest.py --changes {args.changes} "
        f"--tx-size {args.tx_size}`.",
        "",
        f"Workload: {args.changes:,} row changes in transactions of {args.tx_size} (inserts, updates, deletes of an "
        "8-column row: bigint key, text, numeric, float8, bool, timestamptz, text[], jsonb), written before any "
        "consumer starts; each consumer reads it from its own slot. The same workload runs on a table of each "
        "replica identity. Wall-clock rates move with the load other work puts on the shared cores; client CPU "
        "per change does not.",
        "",
    ]
    for run in runs:
        lines += render_run(run)
    lines += [
        "The buffer keeps each change's images as the column text pgoutput sent (Parquet list columns; the "
        "columns' converters are named in a dictionary-encoded column); the key is computed at ingest, and typing "
        "and Go-JSON encoding of the images happen in the build's tasks (`with_images`, the same `encode_change` "
        "ingest ran before). "
        f"Segments are sealed every {args.seal_changes:,} changes or {args.seal_interval:g} s and fsynced; "
        "the end is timed when the last change is durable (acknowledged to the slot only once sealed).",
        "",
        "What bounds it: decoding and the buffer run on two threads of one interpreter, so their CPU adds up "
        "(the CPU bound above); a decoder in a process of its own would leave the larger of the two as the "
        "bound, which this project does not do yet. Before the buffer kept text (Go-JSON of both images and "
        "typed values at ingest), the same script measured 17,308 changes/s, 0.09× pg_recvlogical's 183,370 "
        "(REPLICA IDENTITY FULL, load average 4.5), at 49.7 µs of client CPU per change.",
        "",
    ]
    return "\n".join(lines)


def measure_identity(cluster: pg_fixtures.PgCluster, names: Names, args: argparse.Namespace, tmp: Path) -> Run:
    """Table, initial load, slots, workload, then the four consumers, for one replica identity."""
    _sql(cluster, _DDL.format(table=names.table, identity=names.identity, publication=names.publication))
    _sql(cluster, f"CALL {names.table}_workload(1, %s, 0, 0, 1)", args.preload)  # before the slot: initial load
    table = _table_config(cluster, names, tmp / names.table, args.seal_interval, args.seal_changes)
    print(f"[{names.identity}] initial load of {args.preload:,} rows ...", flush=True)
    ingest_until(table, lambda e: isinstance(e, ResyncEnd))
    start = BufferReader(table.buffer.path, table.name).durable_position()
    assert start is not None
    for role in ROLES[1:]:
        _sql(cluster, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", names.slot(role))

    print(f"[{names.identity}] writing {args.changes:,} changes ...", flush=True)
    changes, wal_start, wal_end = run_workload(cluster, names, args.changes, args.tx_size, args.preload + 1)
    print(f"[{names.identity}] consuming ...", flush=True)
    raw = measure_raw(cluster, names, wal_end, changes)
    decode, last = measure_decode(table, names, start, changes)
    transport = measure_transport(cluster, names, _lsn(last), changes)
    ingest = ingest_until(table, lambda e: isinstance(e, TxEnd) and e.position == last, changes)
    stats = BufferReader(table.buffer.path, table.name).stats(start)
    if stats.changes != changes or stats.durable_position != last:
        raise RuntimeError(f"the buffer holds {stats.changes} changes through {stats.durable_position}, "
                           f"expected {changes} through {last}")
    return Run(names, [raw, transport, decode, ingest], wal_end - wal_start,
               f"{stats.segments} segments, {stats.bytes / 1e6:.1f} MB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=200_000, help="row changes in the workload (default 200000)")
    p.add_argument("--tx-size", type=int, default=10, help="changes per transaction (default 10)")
    p.add_argument("--preload", type=int, default=10_000, help="rows in the table before the workload")
    p.add_argument("--seal-changes", type=int, default=10_000, help="buffer.seal_changes (default: the config's)")
    p.add_argument("--seal-interval", type=float, default=1.0, help="buffer.seal_interval in seconds")
    p.add_argument("--identity", choices=IDENTITIES, action="append",
                   help="measure only this replica identity (repeatable; default: both)")
    p.add_argument("--docs", type=Path, default=DOCS, help="the Markdown file to write the section into")
    p.add_argument("--no-docs", action="store_true", help="only print the table")
    args = p.parse_args(argv)
    if args.changes < args.tx_size or args.preload < args.tx_size:
        p.error("--changes and --preload must be at least --tx-size")

    with private_cluster() as cluster, tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        server = _sql(cluster, "SHOW server_version")[0][0]
        runs = [measure_identity(cluster, Names(identity), args, Path(tmp))
                for identity in (args.identity or IDENTITIES)]

    section = render(runs, args, server)
    print()
    print(section)
    if not args.no_docs:
        write_section(args.docs, SECTION, section)
        print(f"wrote the section to {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
