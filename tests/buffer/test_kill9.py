"""Kill -9 anywhere, restart: nothing lost, nothing applied twice, no re-snapshot.

The ingest loop runs as a subprocess (`python -m resources.ingest`) on the generator source with a
fast seal cadence, so kills land in every phase: import, initial load, appending, sealing (footer,
fsync, rename, index rewrite), periodic re-syncs. After each kill the buffer must hold exactly the
generator's history up to its durable position; at the end, exactly the whole history, and its
replay must equal the generator's reference model.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from resources.buffer import BufferReader
from resources.buffer.object_storage import ObjectStorage
from resources.buffer.storage import BufferStorage
from resources.subscribers.generator import DEFAULT_MIX, GeneratorSubscriber
from resources.work_storage import WorkRoot
from snapshot_assets.archive.positions import compare_lsn
from tests.buffer.helpers import TABLE, buffer_rows, generator_history, replay, row_history

REPO = Path(__file__).resolve().parents[2]
SEED, ROWS, CHANGES, RATE, TRUNCATE, RESYNC_EVERY = 7, 300, 25_000, 1500, 0.002, 700
KILLS = 22
S3_KILLS, S3_LEASE_S = 8, 3  # each restart on S3 waits out the killed writer's lease


@dataclass
class Place:
    """Where the buffer lives: a local directory, or an S3 prefix (the writer's lock is then a lease)."""

    root: str
    env: dict[str, str]
    storage: Callable[[], BufferStorage | None]
    lease: float = S3_LEASE_S

    def durable_position(self) -> str | None:
        storage = self.storage()
        if storage is None and not (Path(self.root) / TABLE).exists():
            return None
        return BufferReader(self.root, TABLE, storage=storage).durable_position()

    def rows(self) -> list[dict[str, Any]]:
        return buffer_rows(self.root, TABLE, self.storage())


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "local":
        return Place(str(tmp_path), {}, lambda: None)
    bucket, moto = request.getfixturevalue("s3_bucket"), request.getfixturevalue("moto_server")
    work = WorkRoot.open(f"s3://{bucket}/k9", {"endpoint_url": moto})
    return Place(work.path, {"AWS_ENDPOINT_URL_S3": moto}, lambda: ObjectStorage(work.part(TABLE)))


def start(place: Place, *, paced: bool = True) -> subprocess.Popen[str]:
    """The ingest process; pacing only spreads the stream over time, it never changes its content."""
    rate = ["--rate", str(RATE)] if paced else []
    return subprocess.Popen(
        [sys.executable, "-m", "resources.ingest", "--buffer", place.root, "--generator-seed", str(SEED),
         "--rows", str(ROWS), "--changes", str(CHANGES), *rate, "--truncate", str(TRUNCATE),
         "--resync-every", str(RESYNC_EVERY), "--seal-interval", "0.05", "--seal-changes", "300",
         "--lease", str(place.lease)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **place.env})


def wait_for_progress(place: Place, before: str | None, proc: subprocess.Popen[str]) -> None:
    """Until the new process has made something durable (or died, or took far too long)."""
    deadline = time.monotonic() + 15 + place.lease
    while place.durable_position() == before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def check(place: Place, gen: GeneratorSubscriber, durable: str | None) -> None:
    rows = place.rows() if durable else []
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)), "seqs without gaps or repeats"
    assert row_history(rows) == generator_history(gen, durable) if durable else rows == []


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(place: Place, tmp_path: Path) -> None:
    gen = GeneratorSubscriber(TABLE, seed=SEED, rows=ROWS, changes=CHANGES,
                              mix={**DEFAULT_MIX, "truncate": TRUNCATE}, resync_every=RESYNC_EVERY)
    rng = random.Random(20240)
    kills = KILLS if place.storage() is None else S3_KILLS
    durables: list[str | None] = []
    while len(durables) < kills:
        before = place.durable_position()
        proc = start(place)
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.0, 0.6))  # anywhere, start-up and recovery included
        else:  # once it is streaming, so most kills land among appends and seals
            wait_for_progress(place, before, proc)
            time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is not None:
            pytest.fail(f"the stream ended after {len(durables)} kills; lengthen it ({proc.communicate()})")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        durable = place.durable_position()
        if durables and durables[-1] is not None:
            assert durable is not None and compare_lsn(durable, durables[-1]) >= 0, "durable went backwards"
        durables.append(durable)
        check(place, gen, durable)
    assert len({d for d in durables if d is not None}) >= kills // 2, "kills landed mid-stream"

    proc = start(place, paced=False)
    out, err = proc.communicate(timeout=60 + place.lease)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["finished"] and result["durable_position"] == gen.end_position()
    rows = place.rows()
    assert row_history(rows) == generator_history(gen)
    assert replay(rows) == gen.table_at(result["durable_position"])
    assert not list((tmp_path / TABLE).rglob(".tmp-*"))
