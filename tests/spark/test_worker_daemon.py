"""The local server's Python worker daemon preloads the code every task runs (worker_daemon.py).

A worker forked from the daemon inherits its modules; a task module the daemon does not import is
imported again by every new worker (about a second per worker). The package `snapshot_assets.spark`
imports nothing itself, so the daemon names the build entry modules, and everything the tasks run
must be reachable from them. Checked in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import snapshot_assets.spark

#: Modules only the driver uses (the session, the local server's process, the pending-diff sizing).
DRIVER_ONLY = {"connect_host", "connect_server", "diff_size", "server_memory", "server_retries", "session"}


def test_the_daemon_imports_every_module_tasks_run_before_it_forks() -> None:
    package = Path(snapshot_assets.spark.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "worker_daemon"} - DRIVER_ONLY
    script = ("import sys, snapshot_assets.spark.worker_daemon; "
              "print(' '.join(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('snapshot_assets.spark.')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False,
                          cwd=package.parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.split())
    assert modules <= loaded, sorted(modules - loaded)
