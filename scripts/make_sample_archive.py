"""Regenerate examples/sample-archive: a small public.users archive in jsonl and protobuf.

Two epochs (a re-base in the middle), diffs with updates, inserts and deletes, an integer beyond
2^53 and an id of 1000000 (which laredo keys as `1e+06`). Timestamps are fixed so the output is
reproducible; run it from the repository root: `.venv/bin/python scripts/make_sample_archive.py`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from resources.destinations.local import LocalDestination  # noqa: E402
from snapshot_assets.archive.changes import Action, Change, Row  # noqa: E402
from snapshot_assets.archive.keys import laredo_row_key  # noqa: E402
from snapshot_assets.archive.positions import comparator  # noqa: E402
from snapshot_assets.archive.writer import ArtifactWriter  # noqa: E402
from snapshot_assets.pipeline.commit import commit_artifact  # noqa: E402

OUT = ROOT / "examples" / "sample-archive"
PREFIX = "users/"
FORMATS = ("jsonl", "protobuf")
BIG = 9007199254740993  # 2^53 + 1: a double cannot hold it


def row(id_: int, name: str, score: float, active: bool, **extra: object) -> Row:
    return {"id": id_, "name": name, "score": score, "active": active, **extra}


def change(action: Action, old: Row | None = None, new: Row | None = None) -> Change:
    return Change(action, laredo_row_key(new or old, ["id"]), old, new)


ALICE = row(1, "alice", 42.5, True, balance=BIG, tags=["admin", "ops"], meta={"tz": "UTC"})
BOB = row(2, "bob", 7.0, True, balance=10)
CAROL = row(3, "carol", 0.125, False, balance=-3)
DAVE = row(4, "dave", 1e-7, True, balance=0, note=None)
ROBERT = {**BOB, "name": "robert"}
ERIN = row(5, "erin", 99.0, False, balance=5, html="<b>&</b>")
ALICE2 = {**ALICE, "score": 43.75}
MILLION = row(1000000, "million", 1e21, True, balance=-BIG)
FRANK = row(6, "frank", 3.5, True, balance=6)
ERIN2 = {**ERIN, "active": True}


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    dest = LocalDestination(OUT)
    writer = ArtifactWriter([dest], PREFIX, snapshot_formats=FORMATS, diff_formats=FORMATS)
    steps = [
        writer.write_snapshot(1, "0/016B3748", [ALICE, BOB, CAROL, DAVE], created_at="2026-06-03T21:40:00Z"),
        writer.write_diff(1, "0/016B3748", "0/016B3800", [
            change(Action.UPDATE, BOB, ROBERT), change(Action.INSERT, None, ERIN), change(Action.DELETE, CAROL),
        ], created_at="2026-06-03T21:40:30Z"),
        writer.write_diff(1, "0/016B3800", "0/016B3900", [
            change(Action.UPDATE, ALICE, ALICE2), change(Action.INSERT, None, MILLION),
        ], created_at="2026-06-03T21:41:00Z"),
        # Re-base: dave was deleted after 0/016B3900; the snapshot carries that change.
        writer.write_snapshot(2, "0/016B3A00", [ALICE2, ROBERT, ERIN, MILLION], created_at="2026-06-03T21:41:30Z"),
        writer.write_diff(2, "0/016B3A00", "0/016B3B10", [
            change(Action.INSERT, None, FRANK), change(Action.UPDATE, ERIN, ERIN2),
        ], created_at="2026-06-03T21:42:00Z"),
    ]
    for art in steps:
        commit_artifact([dest], PREFIX, "public.users", art, cmp=comparator("lsn"), now=art.created_at)
    print(f"wrote {len(steps)} artifacts to {OUT}")


if __name__ == "__main__":
    main()
