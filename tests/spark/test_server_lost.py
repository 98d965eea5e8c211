"""A run whose local Spark Connect server ends under it says so, with the server's reason and log.

Why: with `-XX:+ExitOnOutOfMemoryError` (server_memory.py) a server out of memory ends rather than
living on broken; a run then got whatever gRPC error its next call happened to receive ("Application
error processing RPC", or a refused connection), which names neither the server nor its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resources.spark import SparkResource, SparkServerLost
from snapshot_assets.spark.connect_server import (
    ServerInfo,
    last_fatal_line,
    server_lost,
    stop_local_connect_server,
)
from snapshot_assets.spark.session import SparkRuntime

OOM = "Terminating due to java.lang.OutOfMemoryError: Metaspace"


def _ended_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def _log(tmp_path: Path, *lines: str) -> Path:
    log = tmp_path / "server.log"
    log.write_text("".join(f"{line}\n" for line in lines))
    return log


def test_the_log_line_that_says_why_a_server_ended(tmp_path: Path) -> None:
    later_error = "26/11/29 13:17:07 ERROR Inbox: An error happened while processing message"
    assert last_fatal_line(_log(tmp_path, "INFO started", OOM, later_error, "INFO closing")) == OOM
    assert last_fatal_line(_log(tmp_path, "INFO started", later_error)) == later_error
    assert last_fatal_line(_log(tmp_path, "INFO started")) == ""
    assert last_fatal_line(tmp_path / "no-such.log") == ""


def test_an_ended_server_is_named_with_its_reason_and_log(tmp_path: Path) -> None:
    log = _log(tmp_path, "INFO started", OOM)
    gone = ServerInfo(pid=_ended_pid(), port=15999, token="t", started_at=0.0, log_path=str(log))
    reason = server_lost(gone)
    assert reason is not None
    assert f"pid {gone.pid}, port 15999" in reason and OOM in reason and str(log) in reason
    assert "next run starts a new server" in reason
    # A live process that is not a Connect server (a recycled pid) is not the run's server either.
    assert server_lost(ServerInfo(pid=os.getpid(), port=1, token="t", started_at=0.0, log_path=str(log))) is not None


def test_the_resource_reports_a_lost_server_and_passes_other_errors_on(tmp_path: Path) -> None:
    log = _log(tmp_path, OOM)
    gone = ServerInfo(pid=_ended_pid(), port=15999, token="t", started_at=0.0, log_path=str(log))
    resource = SparkResource()
    resource._runtime = SparkRuntime(None, "connect-local", 0.0, server=gone)
    expected = r"public\.t: snapshot to 0/1: the local Spark Connect server"
    with pytest.raises(SparkServerLost, match=expected) as lost, resource.watching_server("public.t: snapshot to 0/1"):
        raise RuntimeError("Application error processing RPC")
    assert isinstance(lost.value.__cause__, RuntimeError)
    resource._runtime = SparkRuntime(None, "classic-local", 0.0)  # no server of its own: the error as it is
    with pytest.raises(RuntimeError, match="a bad plan"), resource.watching_server("x"):
        raise RuntimeError("a bad plan")


#: A run in its own process (as runs are): a session on a real local server, which is killed (-9)
#: under it; prints what the run saw. A process of its own keeps the dead session's client state
#: out of the test worker, whose later tests open sessions of their own.
_KILLED_RUN = """
import json, os, signal, sys, time
from pathlib import Path
from snapshot_assets.config import SparkConfig
from snapshot_assets.spark.connect_server import local_server_info
from snapshot_assets.spark.session import open_spark

state = Path(sys.argv[1])
config = SparkConfig(conf={"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"})
runtime = open_spark(config, state_dir=state)
out = {"mode": runtime.mode, "count": runtime.spark.range(3).count(), "before": runtime.server_lost()}
pid = out["pid"] = runtime.server.pid
os.kill(pid, signal.SIGKILL)
deadline = time.monotonic() + 30
while local_server_info(state) is not None and time.monotonic() < deadline:
    time.sleep(0.2)
failed = time.monotonic()
try:
    runtime.spark.range(3).count()
    out["error"] = None
except Exception as exc:
    out["error"] = type(exc).__name__
out["failed_in_s"] = time.monotonic() - failed
out["reason"] = runtime.server_lost()
runtime.stop()
again = open_spark(config, state_dir=state)
out["again"] = [again.mode, again.server.pid if again.server else None, again.spark.range(2).count()]
again.stop()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_session_whose_server_is_killed_reports_the_server(tmp_path: Path) -> None:
    """A real local server, killed under an open session: the session's next call fails at once
    (not after Spark Connect's ten minutes of retries: server_retries.py), the runtime names the
    server and its log, and the next session starts a new server."""
    state = tmp_path / "spark-connect"
    try:
        done = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(state)], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stop_local_connect_server(state)
    assert out["mode"] == "connect-local" and out["count"] == 3 and out["before"] is None
    assert out["error"] is not None and out["failed_in_s"] < 30
    reason = out["reason"]
    assert reason is not None and f"pid {out['pid']}," in reason and str(state / "server.log") in reason
    mode, pid, count = out["again"]
    assert mode == "connect-local" and pid not in (None, out["pid"]) and count == 2
