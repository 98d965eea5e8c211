"""Kill -9 anywhere, restart: nothing lost, nothing applied twice, no re-snapshot.

The ingest loop runs as a subprocess (`python -m resources.ingest`) on the generator source with a
fast seal cadence, so kills land in every phase: import, initial load, appending, sealing (footer,
fsync, rename, index rewrite), periodic re-syncs. After each kill the buffer must hold exactly the
generator's history up to its durable position; at the end, exactly the whole history, and its
replay must equal the generator's reference model.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resources.buffer import BufferReader
from resources.subscribers.generator import DEFAULT_MIX, GeneratorSubscriber
from snapshot_assets.archive.positions import compare_lsn
from tests.buffer.helpers import TABLE, buffer_rows, generator_history, replay, row_history

REPO = Path(__file__).resolve().parents[2]
SEED, ROWS, CHANGES, RATE, TRUNCATE, RESYNC_EVERY = 7, 300, 25_000, 1500, 0.002, 700
KILLS = 22


def start(root: Path, *, paced: bool = True) -> subprocess.Popen[str]:
    """The ingest process; pacing only spreads the stream over time, it never changes its content."""
    rate = ["--rate", str(RATE)] if paced else []
    return subprocess.Popen(
        [sys.executable, "-m", "resources.ingest", "--buffer", str(root), "--generator-seed", str(SEED),
         "--rows", str(ROWS), "--changes", str(CHANGES), *rate, "--truncate", str(TRUNCATE),
         "--resync-every", str(RESYNC_EVERY), "--seal-interval", "0.05", "--seal-changes", "300"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def durable_position(root: Path) -> str | None:
    return BufferReader(root, TABLE).durable_position() if (root / TABLE).exists() else None


def wait_for_progress(root: Path, before: str | None, proc: subprocess.Popen[str]) -> None:
    """Until the new process has made something durable (or died, or took far too long)."""
    deadline = time.monotonic() + 15
    while durable_position(root) == before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def check(root: Path, gen: GeneratorSubscriber, durable: str | None) -> None:
    rows = buffer_rows(root)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)), "seqs without gaps or repeats"
    assert row_history(rows) == generator_history(gen, durable) if durable else rows == []


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    gen = GeneratorSubscriber(TABLE, seed=SEED, rows=ROWS, changes=CHANGES,
                              mix={**DEFAULT_MIX, "truncate": TRUNCATE}, resync_every=RESYNC_EVERY)
    rng = random.Random(20240)
    durables: list[str | None] = []
    while len(durables) < KILLS:
        before = durable_position(tmp_path)
        proc = start(tmp_path)
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.0, 0.6))  # anywhere, start-up and recovery included
        else:  # once it is streaming, so most kills land among appends and seals
            wait_for_progress(tmp_path, before, proc)
            time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is not None:
            pytest.fail(f"the stream ended after {len(durables)} kills; lengthen it ({proc.communicate()})")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        durable = durable_position(tmp_path)
        if durables and durables[-1] is not None:
            assert durable is not None and compare_lsn(durable, durables[-1]) >= 0, "durable went backwards"
        durables.append(durable)
        check(tmp_path, gen, durable)
    assert len({d for d in durables if d is not None}) >= KILLS // 2, "kills landed mid-stream"

    proc = start(tmp_path, paced=False)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["finished"] and result["durable_position"] == gen.end_position()
    rows = buffer_rows(tmp_path)
    assert row_history(rows) == generator_history(gen)
    assert replay(rows) == gen.table_at(result["durable_position"])
    assert not list((tmp_path / TABLE).rglob(".tmp-*"))
