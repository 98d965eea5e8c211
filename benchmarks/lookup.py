"""get(key) on a large archive on local disk: latency and bytes read, against DuckDB on the snapshot's parquet.

Why: the point of get(key) is that one row costs a small read, not a rebuild. This builds (or
reuses, from `--dir`) an archive of `--rows` rows the way the pipeline does (a change buffer, the
Spark snapshot job with jsonl + protobuf + parquet, assembled onto a local destination, committed),
plus one diff after the snapshot (`--changes` updates and a tenth as many deletes), then, in one run:

- this project: `lookup.get` for `--lookups` random keys at the head (present, updated, deleted
  and never-existing keys), each one cold (manifest, key index, one range of the jsonl snapshot,
  the diff after it), wall time and bytes read;
- the peer: DuckDB answering the same key from the snapshot's parquet object
  (`SELECT * FROM read_parquet(?) WHERE id = ?`), one query per key on one connection.

For every key the diff did not touch, both answers must be the same row (the benchmark fails
otherwise). Prints the table and writes the section `## Lookup: get(key) against DuckDB (N rows)`
of docs/benchmarks.md (each size keeps its own section). The issue's target is for 10,000,000 rows:
p50 ≤ 0.1 s and bytes read ≤ 1% of the snapshot; the table says whether this run met it.

Run: `.venv/bin/python benchmarks/lookup.py [--rows 1000000] [--lookups 200] [--dir DIR]`
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402

from benchmarks.pipeline import machine_facts  # noqa: E402
from benchmarks.report import DOCS, write_section  # noqa: E402
from resources.buffer import BufferReader, ChangeBuffer  # noqa: E402
from resources.destinations.local import LocalDestination  # noqa: E402
from resources.subscribers.events import (  # noqa: E402
    ChangeEvent,
    Column,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from snapshot_assets.archive import lookup  # noqa: E402
from snapshot_assets.archive.changes import Action  # noqa: E402
from snapshot_assets.archive.errors import ArchiveError  # noqa: E402
from snapshot_assets.archive.formats import FORMATS  # noqa: E402
from snapshot_assets.archive.key_index import index_key  # noqa: E402
from snapshot_assets.archive.manifest import DIFF, SNAPSHOT, Artifact, Manifest, utc_now  # noqa: E402
from snapshot_assets.archive.positions import comparator, format_lsn  # noqa: E402
from snapshot_assets.archive.reader import ArchiveReader, artifact_key  # noqa: E402

SECTION = "## Lookup: get(key) against DuckDB ({rows:,} rows)"
TABLE = "public.bench_lookup"
PREFIX = "bench_lookup/"
FORMATS_ = ("jsonl", "protobuf", "parquet")
COMPARED = ("id", "name", "email", "balance", "active")  # the columns both answers hold alike
TARGET_ROWS = 10_000_000
TARGET_P50_S = 0.1
TARGET_SHARE = 0.01
COLUMNS = (Column("id", "int8", False, True, 1, 1, type_oid=20), Column("name", "text", ordinal=2, type_oid=25),
           Column("email", "text", ordinal=3, type_oid=25), Column("score", "float8", ordinal=4, type_oid=701),
           Column("active", "bool", ordinal=5, type_oid=16), Column("balance", "int8", ordinal=6, type_oid=20),
           Column("updated_at", "text", ordinal=7, type_oid=25))


def make_row(i: int, version: int = 0) -> dict[str, Any]:
    """The generated row of key `i` (about 150 bytes of jsonl)."""
    return {"id": i, "name": f"user {i}" + "." * version, "email": f"user{i}@example.com",
            "score": (i % 10007) / 7.0 + version, "active": i % 3 == 0, "balance": (i * 7919) % 1000003 + version,
            "updated_at": f"2024-01-01T00:00:{i % 60:02d}Z"}


@dataclass
class Archive:
    dest: LocalDestination
    snapshot: Artifact
    head: str
    changed: set[int]  # keys the diff after the snapshot touched
    build_s: float


def build(work: Path, rows: int, changes: int, seed: int) -> Archive:
    """The archive: an initial load of `rows` rows, a snapshot, one diff of `changes` updates and deletes."""
    from snapshot_assets.pipeline.commit import commit_artifact
    from snapshot_assets.spark.assemble import assemble
    from snapshot_assets.spark.bases import BufferSnapshotBase, EmptyBase
    from snapshot_assets.spark.diff import build_diff
    from snapshot_assets.spark.session import LOCAL_DEFAULTS, classic_session
    from snapshot_assets.spark.snapshot import build_snapshot

    started = time.monotonic()
    rng = random.Random(seed)
    updated = rng.sample(range(rows), changes)
    deleted = set(updated[: changes // 10])
    with ChangeBuffer(work / "buffer", TABLE, seal_interval=3600.0, seal_changes=1_000_000) as buffer:
        buffer.append(SchemaEvent(TableSchema(TABLE, COLUMNS)))
        buffer.append(ResyncBegin("initial load"))
        for i in range(rows):
            buffer.append(SnapshotRow(make_row(i)))
        buffer.append(ResyncEnd(format_lsn(0x1000), rows))
        lsn, committed = 0x1000, _dt.datetime(2026, 11, 1, tzinfo=_dt.UTC)
        for n, i in enumerate(updated):  # one transaction per change, a second apart
            lsn += 0x40
            action = Action.DELETE if i in deleted else Action.UPDATE
            buffer.append(ChangeEvent(format_lsn(lsn), action, make_row(i), None if action is Action.DELETE
                                      else make_row(i, 1), commit_time=committed + _dt.timedelta(seconds=n)))
            buffer.append(TxEnd(format_lsn(lsn)))
        head = format_lsn(lsn)
        buffer.seal()
    reader = BufferReader(work / "buffer", TABLE)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    first = format_lsn(0x1000)
    spark = classic_session("local[2]", {**LOCAL_DEFAULTS, "spark.driver.memory": "6g"}, "bench-lookup")
    dest = LocalDestination(work / "archive")
    try:
        m = Manifest(table=TABLE)
        columns = [c.definition() for c in COLUMNS]
        for epoch, built in (
            (1, build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], first, ("id",),
                               FORMATS_, work / "staging", work / "state" / "epoch=1")),
            (1, build_diff(spark, reader.segments(first, head), EmptyBase(first), head, ("id",), ("jsonl", "protobuf"),
                           work / "staging-diff", work / "delta")),
        ):
            refs = assemble(built, [dest], PREFIX, epoch)
            kind = SNAPSHOT if built.kind == "snapshot" else DIFF
            art = Artifact(kind=kind, epoch=epoch, from_position=built.from_position, to_position=built.to_position,
                           created_at=utc_now(), formats=refs, row_count=built.count if kind == SNAPSHOT else 0,
                           change_count=built.count if kind == DIFF else 0)
            m = commit_artifact([dest], PREFIX, TABLE, art, cmp=comparator("lsn"), columns=columns).manifest
    finally:
        spark.stop()
    snap = m.latest_snapshot()
    assert snap is not None
    (work / "changed.txt").write_text("\n".join(map(str, updated)))
    return Archive(dest, snap, m.head_position, set(updated), time.monotonic() - started)


def reuse(work: Path, rows: int) -> Archive | None:
    """The archive a previous run left in `work`, when it holds `rows` rows."""
    dest = LocalDestination(work / "archive")
    try:
        m = ArchiveReader(dest, PREFIX).load_manifest()
    except (ArchiveError, OSError):  # no usable archive: build one
        return None
    snap = m.latest_snapshot()
    if snap is None or snap.row_count != rows or not (work / "changed.txt").exists():
        return None
    changed = {int(k) for k in (work / "changed.txt").read_text().split()}
    return Archive(dest, snap, m.head_position, changed, 0.0)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def kib(values: Iterable[int]) -> str:
    """The median of `values` in KiB, as the table prints it."""
    return f"{statistics.median(values) / 1024:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--changes", type=int, default=1000, help="updates in the diff after the snapshot")
    parser.add_argument("--dir", type=Path, help="working directory; an archive of --rows rows there is reused")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    work = args.dir or Path(f".bench-lookup-{args.rows}")
    work.mkdir(parents=True, exist_ok=True)
    archive = reuse(work, args.rows)
    reused = archive is not None
    if archive is None:
        print(f"building an archive of {args.rows:,} rows in {work} ...", flush=True)
        archive = build(work, args.rows, args.changes, args.seed)
    snap = archive.snapshot
    parquet = archive.dest.path(artifact_key(PREFIX, snap, FORMATS["parquet"]))
    parquet_glob = str(parquet / "*.parquet") if parquet.is_dir() else str(parquet)
    index = archive.dest.get(index_key(PREFIX, snap.epoch, snap.to_position))
    index_bytes = len(index.data) if index is not None else 0

    rng = random.Random(args.seed + 1)
    keys = [rng.randrange(int(args.rows * 1.01)) for _ in range(args.lookups)]
    ours: list[float] = []
    shares: list[float] = []
    totals: list[int] = []
    parts: list[tuple[int, int, int, int]] = []  # (index, range, diffs, versions) per lookup
    con = duckdb.connect()
    peer: list[float] = []
    mismatches = 0
    for key in keys:
        began = time.perf_counter()
        result = lookup.get(archive.dest, PREFIX, [str(key)])
        ours.append(time.perf_counter() - began)
        read = result.bytes_read
        totals.append(read.total)
        parts.append((read.index, read.ranges + read.scanned, read.diffs, read.versions))
        shares.append((read.index + read.ranges + read.scanned + read.versions) / snap.formats["jsonl"].size_bytes)
        if result.found and not result.exact:
            print(f"key {key}: no exact version", file=sys.stderr)
            return 1
        began = time.perf_counter()
        cursor = con.execute("SELECT * FROM read_parquet(?, hive_partitioning = false) WHERE id = ?",
                             [parquet_glob, key])
        found = cursor.fetchall()
        peer.append(time.perf_counter() - began)
        names = [d[0] for d in cursor.description or ()]
        theirs = {n: v for n, v in zip(names, found[0], strict=True) if n in COMPARED} if found else None
        ours_row = {n: v for n, v in (result.row or {}).items() if n in COMPARED} if result.row else None
        if key not in archive.changed and theirs != ours_row:
            mismatches += 1
    if mismatches:
        print(f"{mismatches} lookups disagree with DuckDB", file=sys.stderr)
        return 1
    p50, p95 = percentile(ours, 50), percentile(ours, 95)
    d50, d95 = percentile(peer, 50), percentile(peer, 95)
    jsonl = snap.formats["jsonl"].size_bytes
    share_max = max(shares)
    at_target = args.rows >= TARGET_ROWS
    verdict_p50 = ("met" if p50 <= TARGET_P50_S else "NOT met") if at_target else f"not applicable ({args.rows:,} rows)"
    verdict_share = ("met" if share_max <= TARGET_SHARE else "NOT met") if at_target else \
        f"not applicable ({args.rows:,} rows)"
    lines = [
        SECTION.format(rows=args.rows), "",
        f"Machine: {machine_facts()}, load average {os.getloadavg()[0]:.1f} at the end. "
        f"Produced by `benchmarks/lookup.py --rows {args.rows} --lookups {args.lookups}`"
        + (" on an archive a previous run built." if reused else
           f"; building the archive took {archive.build_s:.0f} s."),
        "",
        f"One snapshot of {args.rows:,} rows (jsonl {jsonl / 2**20:,.1f} MiB, parquet "
        f"{snap.formats['parquet'].size_bytes / 2**20:,.1f} MiB, key index {index_bytes / 1024:,.0f} KiB) and one "
        f"diff after it ({args.changes:,} keys updated or deleted). {args.lookups} random keys at the head (about 1% "
        "never existed), each lookup cold: manifest, key index, one range of the jsonl snapshot and one of its "
        "versions object, the diff (and its versions object when it changed the key): every row found comes with "
        "its exact version. "
        "Seconds are wall time on a machine other work shares.",
        "",
        "| | this project: get(key) | DuckDB: parquet `WHERE id = ?` | ratio (p50) | target (10M rows) |",
        "|---|---:|---:|---:|---|",
        f"| p50 | {p50 * 1000:.1f} ms | {d50 * 1000:.1f} ms | {p50 / d50:.2f}× | ≤ 100 ms: {verdict_p50} |",
        f"| p95 | {p95 * 1000:.1f} ms | {d95 * 1000:.1f} ms | {p95 / d95:.2f}× | |",
        f"| bytes read of the snapshot (max) | {share_max * 100:.3f}% | | | ≤ 1%: {verdict_share} |",
        f"| bytes read per lookup (median; the manifest not counted) | {kib(totals)} KiB: index "
        f"{kib(p[0] for p in parts)} + snapshot range {kib(p[1] for p in parts)} + diff {kib(p[2] for p in parts)}"
        f" + versions {kib(p[3] for p in parts)}"
        " | | | |",
        "",
        "Every key the diff did not touch got the same row from both. DuckDB reads the parquet footer and the "
        "row groups whose statistics admit the key; get(key) also applies the diff after the snapshot.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_section(DOCS, SECTION.format(rows=args.rows), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
