"""`snapshotter run --once` judges `max_diff_bytes` on the encoded diff, as the re-base sensor does.

A few hot keys updated thousands of times: the buffer holds every change (hundreds of kB), the
diff that would be written holds one net change per key (a few hundred bytes). With the threshold
between the two, the size trigger must not fire: the run writes a diff. Judged on the buffer's
bytes (what `run --once` did before), the same run would have re-based.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resources.buffer import BufferReader
from snapshot_assets.config import load_config
from tests.e2e.conftest import e2e_env, workdir

__all__ = ["workdir"]

pytestmark = pytest.mark.slow
THRESHOLD = 50_000


def write_config(path: Path, work: Path, changes: int) -> None:
    generator = json.dumps({"seed": 3, "rows": 100, "changes": changes, "mix": {"update": 1.0}, "hot_keys": 0.02,
                            "hot_share": 1.0, "pk_change": 0.0})
    path.write_text(f"""
snapshotter {{
  source {{ type = generator, table = users, generator {generator} }}
  destinations = [ {{ type = local, path = {json.dumps(str(work / 'archive'))} }} ]
  formats {{ snapshot = [jsonl], diff = [jsonl] }}
  snapshot {{ min_interval = 0s, max_diff_bytes = {THRESHOLD} }}
  buffer {{ path = {json.dumps(str(work / 'buffer'))}, seal_interval = 100ms }}
}}
""")


def snapshotter(work: Path, *args: str) -> str:
    command = [str(Path(sys.executable).with_name("snapshotter")), *args]
    done = subprocess.run(command, cwd=work, env=e2e_env(DAGSTER_HOME=str(work / "dagster")), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_run_once_measures_the_pending_diff_for_max_diff_bytes(workdir: Path) -> None:
    (workdir / "dagster").mkdir()
    config = workdir / "snapshotter.conf"
    write_config(config, workdir, 10)
    first = snapshotter(workdir, "run", "--once", "--config", str(config))
    assert "snapshot@" in first and "(initial)" in first, first
    table = load_config(config, env={}).tables[0]
    head = BufferReader(table.buffer.path, table.name).durable_position()

    write_config(config, workdir, 4000)  # the same stream, longer: 3,990 more updates of 2 keys
    snapshotter(workdir, "ingest", "--config", str(config))  # a finite source: it ends by itself
    buffered = BufferReader(table.buffer.path, table.name).stats(head).bytes
    assert buffered > THRESHOLD, f"the buffer holds only {buffered} bytes: the workload does not separate the two"
    second = snapshotter(workdir, "run", "--once", "--no-ingest", "--config", str(config))
    assert "diff@" in second and "max_diff_bytes" not in second, second
