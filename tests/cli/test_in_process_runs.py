"""`run --once`'s runs in process (`run_once.InProcessRuns`): Dagster comes in only with the first
run, and what the run needs from outside (the local Spark server) starts booting before that import.

Checked in a fresh interpreter: this test process has imported Dagster long ago.
"""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """
import sys
from snapshot_assets.run_once import InProcessRuns

seen = []
made = []

def warm():
    seen.append(("dagster" in sys.modules, "snapshot_assets.definitions" in sys.modules))

def instance():
    import dagster as dg
    made.append(1)
    return dg.DagsterInstance.ephemeral()

runs = InProcessRuns(instance, warm)
print("before:", "dagster" in sys.modules, made)
job = runs.job("snapshot_job")
print("job:", job.name, seen, made)
first = runs.instance
print("instance:", made, runs.instance is first)
"""


def test_dagster_loads_with_the_first_run_after_the_warm_up_started() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "before: False []"  # importing run_once loads no Dagster; no instance yet
    # the warm-up ran before Dagster and the definitions were imported; the job is the real one
    assert lines[1] == "job: snapshot_job [(False, False)] []"
    assert lines[2] == "instance: [1] True"  # made once, on first use
