"""Format and reader throughput, with peers measured in the same run.

For each artifact format: encode N snapshot rows (streaming writer), decode them back, and the
bytes written. Peers: the standard library's `json.dumps` (fast, but not Go-compatible: it is
the floor a Go-exact encoder is compared against) and pyarrow's bulk `write_table` (what a
columnar writer costs without row-at-a-time streaming). Then a Python-path reconstruction of a
snapshot + diffs archive per format. Prints a table and writes docs/benchmarks.md.

Run: `.venv/bin/python benchmarks/bench_formats.py [--rows 200000]`
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.report import DOCS, write_section  # noqa: E402
from resources.destinations.local import LocalDestination  # noqa: E402
from snapshot_assets.archive.changes import Action, Change, Row  # noqa: E402
from snapshot_assets.archive.formats import FORMATS  # noqa: E402
from snapshot_assets.archive.keys import laredo_row_key  # noqa: E402
from snapshot_assets.archive.positions import compare_sequence  # noqa: E402
from snapshot_assets.archive.reader import ArchiveReader  # noqa: E402
from snapshot_assets.archive.writer import ArtifactWriter  # noqa: E402
from snapshot_assets.pipeline.commit import commit_artifact  # noqa: E402

SECTION = "## Formats: encode, decode and Python-path reconstruction"


def make_rows(n: int, seed: int = 7) -> list[Row]:
    rnd = random.Random(seed)
    return [
        {
            "id": i,
            "name": f"user-{i}",
            "email": f"user{i}@example.com",
            "score": round(rnd.random() * 1000, 3),
            "active": rnd.random() < 0.8,
            "balance": rnd.randint(-(2**40), 2**40),
            "created_at": f"2026-06-{1 + i % 28:02d}T12:00:00Z",
            "tags": ["a", "b"] if i % 3 == 0 else [],
        }
        for i in range(n)
    ]


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def bench_format(fid: str, rows: list[Row]) -> tuple[float, float, int]:
    fmt = FORMATS[fid]

    def write() -> bytes:
        buf = io.BytesIO()
        w = fmt.snapshot_writer(buf)
        for r in rows:
            w.write(r)
        w.close()
        return buf.getvalue()

    wt, data = timed(write)
    assert isinstance(data, bytes)
    rt, count = timed(lambda: sum(1 for _ in fmt.read_snapshot(io.BytesIO(data))))
    assert count == len(rows)
    return wt, rt, len(data)


def peer_json(rows: list[Row]) -> tuple[float, float, int]:
    wt, data = timed(lambda: "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n"
                                     for r in rows).encode())
    assert isinstance(data, bytes)
    rt, _ = timed(lambda: [json.loads(line) for line in data.splitlines()])
    return wt, rt, len(data)


def peer_arrow(rows: list[Row]) -> tuple[float, float, int]:
    def write() -> bytes:
        table = pa.Table.from_pylist(rows)
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()

    wt, data = timed(write)
    assert isinstance(data, bytes)
    rt, _ = timed(lambda: pq.read_table(io.BytesIO(data)).to_pylist())
    return wt, rt, len(data)


def changes(rows: list[Row], n: int, seed: int) -> Iterator[Change]:
    rnd = random.Random(seed)
    for r in rnd.sample(rows, n):
        new = {**r, "score": r["score"] + 1}
        yield Change(Action.UPDATE, laredo_row_key(new, ["id"]), r, new)


def bench_reconstruct(fid: str, rows: list[Row], n_diffs: int, per_diff: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        dest = LocalDestination(tmp)
        writer = ArtifactWriter([dest], "t/", snapshot_formats=[fid], diff_formats=[fid])
        commit_artifact([dest], "t/", "public.t", writer.write_snapshot(1, "1", rows), cmp=compare_sequence)
        for d in range(n_diffs):
            diff = writer.write_diff(1, str(d + 1), str(d + 2), changes(rows, per_diff, d))
            commit_artifact([dest], "t/", "public.t", diff, cmp=compare_sequence)
        reader = ArchiveReader(dest, "t/", cmp=compare_sequence)
        t, rec = timed(reader.reconstruct_as_of)
        assert rec is not None and len(rec.rows) == len(rows)  # type: ignore[attr-defined]
        return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--out", default=str(DOCS))
    args = ap.parse_args()
    rows = make_rows(args.rows)
    n = len(rows)

    results: list[tuple[str, float, float, int]] = []
    for fid in ("jsonl", "protobuf", "parquet"):
        results.append((fid, *bench_format(fid, rows)))
    results.append(("peer: stdlib json (not Go-exact)", *peer_json(rows)))
    results.append(("peer: pyarrow bulk parquet", *peer_arrow(rows)))
    peers = {"jsonl": "peer: stdlib json (not Go-exact)", "protobuf": "peer: stdlib json (not Go-exact)",
             "parquet": "peer: pyarrow bulk parquet"}
    by_name = {r[0]: r for r in results}

    lines = [
        SECTION,
        "",
        f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f}; produced by `benchmarks/bench_formats.py --rows {n}`.",
        "",
        f"Snapshot encode / decode of {n:,} rows, one stream, single core:",
        "",
        "| format | write rows/s | read rows/s | bytes/row | write vs peer | read vs peer |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, wt, rt, size in results:
        ratio_w = ratio_r = "—"
        if name in peers:
            peer = by_name[peers[name]]
            ratio_w = f"{peer[1] / wt:.2f}×"
            ratio_r = f"{peer[2] / rt:.2f}×"
        lines.append(f"| {name} | {n / wt:,.0f} | {n / rt:,.0f} | {size / n:.1f} | {ratio_w} | {ratio_r} |")
    lines += ["", "Ratios are throughput relative to the peer in the same run (1.00× = as fast; below 1 = slower).",
              ""]

    n_diffs, per_diff = 10, max(1, n // 20)
    lines += [f"Python-path reconstruction (`snapshotter reconstruct`): a snapshot of {n:,} rows + {n_diffs} diffs "
              f"× {per_diff:,} updates:", "",
              "| format | seconds | rows/s folded |", "|---|---:|---:|"]
    for fid in ("jsonl", "protobuf", "parquet"):
        t = bench_reconstruct(fid, rows, n_diffs, per_diff)
        lines.append(f"| {fid} | {t:.2f} | {(n + n_diffs * per_diff) / t:,.0f} |")
    lines += ["", "Large tables are folded by Spark (pipeline issue); this is the path of "
              "`snapshotter reconstruct`.", ""]

    text = "\n".join(lines)
    print(text)
    write_section(Path(args.out), SECTION, text)


if __name__ == "__main__":
    main()
