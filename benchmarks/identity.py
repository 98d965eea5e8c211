"""What REPLICA IDENTITY DEFAULT saves the source, and what filling its gaps costs the archive.

Why: users cannot be asked for `REPLICA IDENTITY FULL` (it logs the whole old row, detoasted, with
every UPDATE and DELETE); the archive completes DEFAULT-identity changes itself, in the Spark build,
from its own previous images. Two measurements, in one run:

1. Source (PostgreSQL, a private cluster): N UPDATEs of a small column on rows that also hold a
   large out-of-line value (random bytes as hex, which do not compress), once on a table with
   REPLICA IDENTITY FULL and once with DEFAULT: WAL bytes written, and the time `pg_recvlogical`
   (C, libpq: the peer every logical consumer is measured against) takes to stream them.
2. Archive (Spark, local[2]): the real diff job (`build_diff`: explode, image completion, fold,
   delta, every format) over a window of M changes to a table of R rows from the generator, with
   changes shaped as FULL (complete images: no base join) and as DEFAULT (before-images and
   unchanged `email`/`tags` filled from the layered state). The ratio is the price of the fill.

Prints a table and writes the section `## Replica identity: WAL saved, fill cost` of docs/benchmarks.md.
Run: `.venv/bin/python benchmarks/identity.py [--updates 20000] [--rows 200000] [--changes 50000]`
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ingest import _lsn, _sql, private_cluster  # noqa: E402
from benchmarks.report import DOCS, write_section  # noqa: E402
from resources.buffer import BufferReader, ChangeBuffer  # noqa: E402
from resources.subscribers.events import TxEnd  # noqa: E402
from resources.subscribers.generator import KEY_FIELDS, GeneratorSubscriber  # noqa: E402
from snapshot_assets.archive.positions import format_lsn  # noqa: E402
from snapshot_assets.spark.bases import LayeredBase, choose_base  # noqa: E402
from snapshot_assets.spark.diff import build_diff  # noqa: E402
from snapshot_assets.spark.session import LOCAL_DEFAULTS, classic_session  # noqa: E402
from snapshot_assets.spark.snapshot import build_snapshot  # noqa: E402

SECTION = "## Replica identity: WAL saved, fill cost"
FORMATS = ("jsonl", "protobuf", "parquet")


def source_side(updates: int, value_bytes: int) -> list[tuple[str, int, float]]:
    """(identity, WAL bytes, pg_recvlogical seconds) for the same UPDATE workload under each identity."""
    out = []
    with private_cluster() as cluster:
        for identity in ("full", "default"):
            table, slot = f"ident_{identity}", f"ident_{identity}_slot"
            _sql(cluster, f"CREATE TABLE {table} (id bigint PRIMARY KEY, n int, big text)")
            if identity == "full":
                _sql(cluster, f"ALTER TABLE {table} REPLICA IDENTITY FULL")
            _sql(cluster, f"INSERT INTO {table} SELECT i, 0, (SELECT string_agg(md5(random()::text || i || j), '') "
                          f"FROM generate_series(1, {value_bytes // 32}) j) FROM generate_series(1, 1000) i")
            _sql(cluster, f"CREATE PUBLICATION {table}_pub FOR TABLE {table}")
            _sql(cluster, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", slot)
            (start,), = _sql(cluster, "SELECT pg_current_wal_lsn()::text")
            _sql(cluster, f"DO $$ BEGIN FOR k IN 1..{updates} LOOP UPDATE {table} SET n = n + 1 "
                          f"WHERE id = 1 + k % 1000; COMMIT; END LOOP; END $$")
            (end,), = _sql(cluster, "SELECT pg_current_wal_lsn()::text")
            command = [str(cluster.bindir / "pg_recvlogical"), "-d", cluster.dsn(), "--slot", slot, "--start",
                       "--endpos", format_lsn(_lsn(end)), "--no-loop", "-o", "proto_version=1",
                       "-o", f"publication_names={table}_pub", "-f", "/dev/null"]
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, timeout=900)
            out.append((identity, _lsn(end) - _lsn(start), time.perf_counter() - started))
    return out


def _prepared(spark: Any, identity: str, rows: int, changes: int, root: Path) -> tuple[BufferReader, str, str, Any]:
    """A buffer of the generator's stream shaped for `identity`, and the STATE of its initial load."""
    gen = GeneratorSubscriber("public.users", seed=3, rows=rows, changes=changes, pk_change=0.02,
                              tx_size=(5, 20), identity=identity)
    last = ""
    with ChangeBuffer(root / "buffer", "public.users", seal_interval=3600.0, seal_changes=100_000) as buf:
        for event in gen.events(None):
            buf.append(event)
            if isinstance(event, TxEnd):
                last = event.position
        buf.seal()
    reader = BufferReader(root / "buffer", "public.users")
    start = gen.initial_position
    base, segments = choose_base(reader, start)
    snap = build_snapshot(spark, base, segments, start, KEY_FIELDS, ("parquet",), root / "s", root / "state")
    return reader, start, last, snap.details["state"]


def archive_side(rows: int, changes: int, repeats: int, work: Path) -> dict[str, list[float]]:
    """Diff build seconds per identity, runs alternating FULL, DEFAULT, FULL, ... so that load from
    other work falls on both alike; also the net change count (equal for both)."""
    conf = {**LOCAL_DEFAULTS, "spark.sql.shuffle.partitions": "4", "spark.driver.memory": "3g",
            "spark.ui.showConsoleProgress": "false"}
    spark = classic_session("local[2]", conf, "identity-bench")
    spark.sparkContext.setLogLevel("ERROR")
    times: dict[str, list[float]] = {"full": [], "default": [], "count": []}
    try:
        prepared = {identity: _prepared(spark, identity, rows, changes, work / identity)
                    for identity in ("full", "default")}
        for run in range(repeats + 1):  # run 0 warms the JVM and the Python workers up, not counted
            for identity, (reader, start, last, state) in prepared.items():
                began = time.perf_counter()
                built = build_diff(spark, reader.segments(start, last), LayeredBase(state, ()), last, KEY_FIELDS,
                                   FORMATS, work / identity / f"d{run}", work / identity / f"delta{run}")
                if run:
                    times[identity].append(time.perf_counter() - began)
                    times["count"].append(built.count)
    finally:
        spark.stop()
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=20_000)
    p.add_argument("--value-bytes", type=int, default=16_384)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--changes", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    source = source_side(args.updates, args.value_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        archive = archive_side(args.rows, args.changes, args.repeats, Path(tmp))
    (_, wal_full, rl_full), (_, wal_default, rl_default) = source
    t_full, t_default = statistics.median(archive["full"]), statistics.median(archive["default"])
    ratio = statistics.median(d / f for f, d in zip(archive["full"], archive["default"], strict=True))
    n_net = archive["count"][0]
    lines = [
        SECTION, "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {load:.1f} at the start "
        f"(other work shared the cores). Run: `{' '.join(['benchmarks/identity.py', *(argv or sys.argv[1:])])}`.",
        "",
        f"Source: {args.updates:,} single-row UPDATEs of an int column on 1,000 rows that each hold a "
        f"{args.value_bytes:,}-byte incompressible text value (stored out of line).",
        "",
        "| replica identity | WAL written | WAL per UPDATE | pg_recvlogical stream time |",
        "|---|---:|---:|---:|",
        f"| FULL | {wal_full / 2**20:.1f} MiB | {wal_full / args.updates:,.0f} B | {rl_full:.2f} s |",
        f"| DEFAULT | {wal_default / 2**20:.1f} MiB | {wal_default / args.updates:,.0f} B | {rl_default:.2f} s |",
        f"| FULL / DEFAULT | {wal_full / wal_default:.1f}× | | {rl_full / rl_default:.1f}× |",
        "",
        f"Archive: the diff job over {args.changes:,} generator changes ({n_net:,} net) on a {args.rows:,}-row "
        "table (jsonl + protobuf + parquet, Spark local[2]), the same stream shaped for each identity; "
        f"{args.repeats} runs of each after a warm-up, alternating; medians, and the median of the "
        "pairwise ratios.",
        "",
        "| changes shaped as | diff build (median) | runs |",
        "|---|---:|---|",
        f"| FULL (complete images, no base join) | {t_full:.1f} s | {', '.join(f'{t:.1f}' for t in archive['full'])} |",
        f"| DEFAULT (images filled from the state) | {t_default:.1f} s | "
        f"{', '.join(f'{t:.1f}' for t in archive['default'])} |",
        f"| DEFAULT / FULL | {ratio:.2f}× | |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_section(DOCS, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
