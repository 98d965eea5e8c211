"""`run --once`'s runs in process (`run_once.InProcessRuns`): Dagster comes in only with the first
run, and what the run needs from outside (the local Spark server) starts booting before that import.

Checked in a fresh interpreter: this test process has imported Dagster long ago.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import sys
from pathlib import Path
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


# `run_once --force-snapshot --no-ingest` on a generator table whose buffer holds its changes: the
# local server's warm-up (recorded, not started) must come before Dagster is imported. The instance
# factory stops the command there: the run itself is the end-to-end tests' business.
_RUN_ONCE = """
import sys
from pathlib import Path
from snapshot_assets import run_once as ro
from snapshot_assets.config import load_config

config = load_config(sys.argv[1])
table = config.tables[0]
ro.ingest_until_caught_up(table, idle_s=0.5)
seen = []
ro.warm_local_server = lambda spark, *a: seen.append("dagster" in sys.modules)

class Stop(Exception):
    pass

def instance():
    raise Stop

try:
    ro.run_once(config, instance=instance, force=True, ingest=False)
except Stop:
    print("stopped at the instance; warm-up saw dagster:", seen)
"""


def test_a_forced_rebase_without_ingest_warms_the_server_before_importing_dagster(tmp_path: Path) -> None:
    conf = tmp_path / "run.conf"
    conf.write_text(f"""snapshotter {{
  source {{ type = generator, schema = public, table = users, generator {{ seed = 3, rows = 40, changes = 60 }} }}
  key_fields = [id]
  destinations = [ {{ type = local, path = "{tmp_path / 'archive'}" }} ]
  formats {{ snapshot = [jsonl], diff = [jsonl] }}
  buffer {{ path = "{tmp_path / 'buffer'}", seal_interval = 100ms }}
}}
""")
    done = subprocess.run([sys.executable, "-c", _RUN_ONCE, str(conf)], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "SNAPSHOTTER_CONFIG": str(conf)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "stopped at the instance; warm-up saw dagster: [False]"
