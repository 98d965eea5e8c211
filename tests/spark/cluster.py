"""A Spark standalone cluster on this machine, for tests that must not rely on a disk shared with the driver.

A master, two workers and a Spark Connect server whose master is that cluster, each started from
the Spark that pip installed with pyspark (`bin/spark-class` / `spark-submit`: its own launcher
classes and jars, nothing downloaded). Every process has a directory of its own as working
directory, SPARK_LOCAL_DIRS, TMPDIR and (workers) work dir, and none gets PYTHONPATH: executors
import this project from the code the session ships over Spark Connect (`ship_project_code`), as on
a real cluster. What the processes share is the installed software and the S3 endpoint.

Every process is started in a session of its own and carries a marker variable naming the
cluster's root, which its children (executors, Python workers) inherit; `stop` ends the process
groups and then waits until no process with the marker is left, killing stragglers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from snapshot_assets.spark.connect_server import pyspark_home, server_command
from snapshot_assets.spark.effects import WINDOW_CHANGES_CONF
from snapshot_assets.spark.session import ship_project_code

MARKER = "SNAPSHOTTER_TEST_CLUSTER"
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 60.0
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "640m"
DAEMON = {"SPARK_DAEMON_MEMORY": "256m"}  # the heap of the master and worker JVMs (they only coordinate)
#: The access key the workers' hosts sign with (their ambient credentials; the driver has its own),
#: so an S3 endpoint's record tells which requests the executors made.
EXECUTOR_ACCESS_KEY = "executor-host"
#: The Connect server's settings: the driver binds to loopback, one 1-core executor per worker.
CONNECT_CONF: Mapping[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.executor.memory": EXECUTOR_MEMORY,
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.pyspark.python": sys.executable,
    "spark.python.worker.reuse": "true",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    WINDOW_CHANGES_CONF: "100",  # several partitions for the tests' small windows (tests/spark/conftest.py)
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait(what: str, ready: Callable[[], bool], processes: list[subprocess.Popen[bytes]], logs: list[Path],
          timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll `ready` until it holds; fail naming `what` with the logs' tails if a process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [p for p in processes if p.poll() is not None]
        if dead:
            break
        if ready():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {log}:\n{_tail(log)}" for log in logs)
    raise RuntimeError(f"the test cluster's {what} did not come up within {timeout_s:.0f}s\n{tails}")


def marked_pids(root: Path) -> list[int]:
    """Every live process carrying the cluster's marker (its own processes and all their children)."""
    needle = f"{MARKER}={root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


@dataclass
class SparkCluster:
    """A running cluster: where it lives, how to reach it, and its processes (to stop them)."""

    root: Path
    master_url: str
    master_ui: str
    connect_url: str
    worker_dirs: list[Path]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def session(self) -> Any:
        """A new Spark Connect session on the cluster, with this project's code shipped to the executors."""
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        spark = ConnectSession.builder.remote(self.connect_url).create()
        # `create` made it the process's default and active session, which any later builder's
        # `getOrCreate` would hand out whatever URL it asks for: the tests pass it explicitly.
        if ConnectSession._default_session is spark:
            ConnectSession._default_session = None
        if getattr(ConnectSession._active_session, "session", None) is spark:
            ConnectSession._active_session.session = None
        ship_project_code(spark, connect=True)
        return spark

    def alive_workers(self) -> int:
        """How many workers the master counts as ALIVE (0 while its UI is not serving yet)."""
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as response:
                state = json.loads(response.read())
        except (OSError, ValueError):
            return 0
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def diagnostics(self) -> str:
        """The tails of every log, executors' included (for a failing test's message)."""
        logs = [*self.logs, *sorted(p for d in self.worker_dirs for p in d.rglob("stderr"))]
        return "\n".join(f"--- {log}:\n{_tail(log)}" for log in logs)

    def stop(self) -> None:
        """End every process group, then every process that still carries the marker; wait for all."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in reversed(self.processes):
            try:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        while (left := marked_pids(self.root)) and time.monotonic() < deadline:
            time.sleep(0.25)
        for pid in marked_pids(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (left := marked_pids(self.root)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            raise RuntimeError(f"test cluster processes outlived it: {left}")


def _env(root: Path, own: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A process's environment: this one's minus PYTHONPATH and Spark client settings, plus its own dirs."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    (own / "local").mkdir(parents=True, exist_ok=True)
    (own / "tmp").mkdir(exist_ok=True)
    env.update({MARKER: str(root), "SPARK_HOME": str(pyspark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOCAL_DIRS": str(own / "local"), "TMPDIR": str(own / "tmp"),
                "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(own), **extra})
    return env


def _spawn(cluster: SparkCluster, name: str, command: list[str], extra: Mapping[str, str] | None = None) -> Path:
    own = cluster.root / name
    own.mkdir(parents=True, exist_ok=True)
    log = own / f"{name}.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=own, env=_env(cluster.root, own, extra or {}), stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    cluster.processes.append(process)
    cluster.logs.append(log)
    return own


def start_cluster(root: Path, workers: int = 2) -> SparkCluster:
    """Start master, `workers` workers and a Connect server under `root`; stopped again if any fails to start."""
    spark_class = str(pyspark_home() / "bin" / "spark-class")
    port, ui, connect_port = _free_port(), _free_port(), _free_port()
    token = secrets.token_urlsafe(24)
    cluster = SparkCluster(root, f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}",
                           f"sc://localhost:{connect_port}/;token={token}",
                           [root / f"worker-{i}" / "work" for i in range(workers)])
    try:
        _spawn(cluster, "master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(ui)], DAEMON)
        _wait("master", lambda: _answers(port) and _answers(ui), cluster.processes, cluster.logs)
        for i, work in enumerate(cluster.worker_dirs):
            work.mkdir(parents=True)
            _spawn(cluster, f"worker-{i}", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                            "--webui-port", str(_free_port()), "--cores", "1", "--memory",
                                            WORKER_MEMORY, "--work-dir", str(work), cluster.master_url],
                   {**DAEMON, "SPARK_WORKER_DIR": str(work), "AWS_ACCESS_KEY_ID": EXECUTOR_ACCESS_KEY})
        command = server_command(connect_port, CONNECT_CONF, master=cluster.master_url)
        _spawn(cluster, "connect", command, {"SPARK_CONNECT_AUTHENTICATE_TOKEN": token})
        _wait(f"{workers} workers", lambda: cluster.alive_workers() == workers, cluster.processes, cluster.logs)
        _wait("Spark Connect server", lambda: _answers(connect_port), cluster.processes, cluster.logs)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def report_cluster_logs(item: pytest.Item, report: pytest.TestReport) -> None:
    """A failed test that used the cluster (a timeout included) carries every cluster log's tail,
    executors' included: on CI they are the only trace of what the JVMs were doing."""
    cluster = getattr(item, "funcargs", {}).get("spark_cluster")
    if report.failed and isinstance(cluster, SparkCluster):
        report.sections.append(("standalone cluster logs", cluster.diagnostics()))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory, aws_test_credentials: None) -> Iterator[SparkCluster]:
    """The session's standalone cluster (tests using it are slow: the JVMs take tens of seconds to start).

    Started after the dummy AWS credentials are in the environment, so tasks sign with those
    (the ambient chain of their own host), as a cluster with instance roles would.
    """
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_spark(spark_cluster: SparkCluster) -> Iterator[Any]:
    """A Spark Connect session on the standalone cluster, the project's code shipped to its executors."""
    session = spark_cluster.session()
    yield session
    session.stop()
