"""The Spark runtime: the local Spark Connect server end to end, reuse, stop, and the classic fallback."""

from __future__ import annotations

import functools
import itertools
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resources.subscribers.generator import KEY_FIELDS
from snapshot_assets.archive.algebra import apply
from snapshot_assets.archive.changes import Action
from snapshot_assets.config import SparkConfig
from snapshot_assets.pipeline.diff_size import bound_retries
from snapshot_assets.spark import connect_server
from snapshot_assets.spark import session as session_module
from snapshot_assets.spark.bases import LayeredBase, choose_base
from snapshot_assets.spark.connect_server import (
    ConnectServerError,
    local_server_info,
    server_command,
    stop_local_connect_server,
)
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.effects import decode_row
from snapshot_assets.spark.server_memory import ON_OUT_OF_MEMORY, jvm_caps, memory_budget_mib
from snapshot_assets.spark.session import (
    CONNECT_MODE,
    LOCAL_DEFAULTS,
    open_spark,
    session_from_settings,
    warm_local_server,
)
from snapshot_assets.spark.snapshot import build_snapshot
from tests.spark.conftest import (
    ALL_FORMATS,
    assert_no_connect_session_left,
    by_key,
    closed_endpoint,
    connect_sessions,
    generate,
    read_parts,
)


@pytest.mark.parametrize("shared_workers", [False, True], ids=["isolated", "shared-workers"])
def test_server_command_uses_the_bundled_jars_only(shared_workers: bool) -> None:
    cmd = server_command(15999, {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"},
                         shared_workers=shared_workers)
    assert cmd[0].endswith("bin/spark-submit") and "--packages" not in cmd and "--jars" not in cmd
    assert cmd[cmd.index("--driver-memory") + 1] == "1g"
    assert "spark.connect.grpc.binding.address=127.0.0.1" in cmd
    if shared_workers:  # the local server: a classic session serving Connect, its sessions not isolated
        assert "--class" not in cmd and cmd[-1] == str(connect_server.HOST_SCRIPT)
        assert {f"spark.plugins={connect_server.CONNECT_PLUGIN}", "spark.sql.artifact.isolation.enabled=false",
                f"spark.python.daemon.module={connect_server.WORKER_DAEMON}"} <= set(cmd)
    else:
        assert cmd[cmd.index("--class") + 1] == "org.apache.spark.sql.connect.service.SparkConnectServer"
        assert cmd[-1] == "spark-internal"


def test_fallback_to_a_classic_session_when_the_server_cannot_start(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise ConnectServerError("java exploded")

    monkeypatch.setattr(session_module, "ensure_local_connect_server", broken)
    with caplog.at_level(logging.WARNING):
        runtime = open_spark(SparkConfig(), state_dir=tmp_path)
    assert runtime.mode == "classic-local" and "java exploded" in runtime.note
    assert "java exploded" in caplog.text
    assert runtime.spark.range(3).count() == 3  # the suite's classic session, reused


def test_a_session_that_cannot_receive_the_project_code_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else it stays the process's default session: the next run's builder (pyspark's `getOrCreate`)
    gets it, whatever URL it asks for, and connect mode sends a classic builder to Connect."""
    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError("artifacts refused")

    monkeypatch.delenv(CONNECT_MODE, raising=False)
    monkeypatch.setattr(session_module, "ship_project_code", refuse)
    before = connect_sessions()
    with pytest.raises(RuntimeError, match="artifacts refused"):  # the session is made, nothing reaches it
        open_spark(SparkConfig(remote=closed_endpoint()),
                   make_session=functools.partial(session_from_settings, before_first_call=bound_retries))
    assert_no_connect_session_left(before)


def test_a_runtime_that_joined_a_running_classic_session_leaves_it_running(spark: Any, tmp_path: Path) -> None:
    """A run inside a process that already holds a SparkContext (a notebook, a test session) gets
    that context from the classic builder; the run's teardown must not stop it under its owner."""
    width = spark.conf.get("spark.sql.shuffle.partitions")
    runtime = open_spark(SparkConfig(master="local[2]", conf={"spark.sql.shuffle.partitions": "7"}), state_dir=tmp_path)
    assert runtime.mode == "classic" and not runtime.owned
    assert runtime.spark.sparkContext is spark.sparkContext
    assert spark.conf.get("spark.sql.shuffle.partitions") == width  # the owner's settings stand
    runtime.stop()
    assert spark.range(4).count() == 4  # still running for its owner


@pytest.mark.slow
def test_local_connect_server_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Start the server, run a real diff over Spark Connect, reuse the warm server, stop it."""
    # this process also holds the suite's classic session: the jobs' columns must be Connect ones here
    monkeypatch.setenv(CONNECT_MODE, "1")
    state = tmp_path / "spark-connect"
    config = SparkConfig(conf={"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"})
    try:
        # `run --once` boots the server while it ingests; the session opened meanwhile waits for that
        # server (or starts it, if it takes the lock first) rather than starting a second one.
        warming = warm_local_server(config, state)
        assert warming is not None and warm_local_server(SparkConfig(master="local[1]"), state) is None
        cold = open_spark(config, state_dir=state)
        warming.join()
        booted = local_server_info(state)
        assert booted is not None and f"pid {booted.pid} " in cold.note
        assert cold.mode == "connect-local" and cold.is_connect
        # The whole DEFAULT-identity path over Connect: a snapshot, then diffs on the layered state
        # (image completion in several passes, deltas), and the state at the head from 3 deltas.
        g = generate(tmp_path / "buffer", 71, truncate=0.005, changes=800, identity="default", pk_change=0.2)
        b = g.boundaries
        base, segments = choose_base(g.reader, b[0])
        first = build_snapshot(cold.spark, base, segments, b[0], KEY_FIELDS, ("jsonl",), tmp_path / "s0",
                               tmp_path / "state")
        layered = LayeredBase(first.details["state"], ())
        cuts = [b[0], b[len(b) // 3], b[2 * len(b) // 3], b[-1]]
        for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
            built = build_diff(cold.spark, g.reader.segments(lo, hi), layered, hi, KEY_FIELDS, ALL_FORMATS,
                               tmp_path / f"staging{i}", tmp_path / f"delta{i}")
            folded = {} if built.truncated else dict(g.gen.table_at(lo))
            apply(folded, [c for c in read_parts(built.formats["jsonl"], "diff") if c.action is not Action.TRUNCATE],
                  KEY_FIELDS)
            assert folded == g.gen.table_at(hi)
            layered = LayeredBase(layered.state, (*layered.deltas, built.details["delta"]))
        head = [decode_row(r["row"]) for r in layered.frame(cold.spark, KEY_FIELDS).collect()]
        assert by_key([r for r in head if r is not None]) == g.gen.table_at(b[-1])
        cold_worker = python_worker(cold.spark)
        cold.stop()

        started = time.monotonic()
        with caplog.at_level(logging.WARNING):
            warm = open_spark(config, state_dir=state)
        # every setting the session is given is one a Connect session takes (static ones went to the server)
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warm.mode == "connect-local" and "reused" in warm.note
        assert warm.spark.range(5).count() == 5
        assert time.monotonic() - started < cold.startup_s
        # The sessions share the server's Python workers: the next run's tasks find them warm (reused,
        # or forked by the same daemon, which imported the task code before it forked).
        warm_worker = python_worker(warm.spark)
        assert warm_worker == cold_worker and connect_server.WORKER_DAEMON in warm_worker[1]
        assert warm_worker[2] == "system"  # connect_server.WORKER_ARROW_POOL: no huge-page faults
        info = local_server_info(state)
        assert info is not None and info.pid > 0
        # The JVM is held to heap + overhead: -Xmx, and caps on the pools that grow with the work
        jvm = Path(f"/proc/{info.pid}/cmdline").read_bytes().split(b"\0")
        assert b"-Xmx1g" in jvm and {c.encode() for c in (*jvm_caps(1024), ON_OUT_OF_MEMORY)} <= set(jvm)
        budget = memory_budget_mib({**LOCAL_DEFAULTS, **config.conf})
        assert budget == 2048 and peak_rss_kib(info.pid) <= budget * 1024
        warm.stop()
    finally:
        stopped = stop_local_connect_server(state)
    assert stopped and local_server_info(state) is None


def peak_rss_kib(pid: int) -> int:
    """A process's peak resident set (VmHWM), in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def python_worker(spark: Any) -> tuple[int, str, str]:
    """(pid, command line) of the daemon that forked the Python worker of a one-task job, and the
    worker's Arrow memory pool."""
    def which(batches: Iterator[Any]) -> Iterator[Any]:
        import os

        import pyarrow as pa

        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getppid()], "parent": [parent],
                                              "pool": [pa.default_memory_pool().backend_name]})

    row = spark.range(1).repartition(1).mapInArrow(which, "pid long, parent string, pool string").collect()[0]
    return int(row["pid"]), str(row["parent"]), str(row["pool"])


def fake_server(state: Path, code: str) -> subprocess.Popen[bytes]:
    """A process that looks like a Connect server (its command line names the class), recorded in
    server.json with a given code fingerprint and a port nobody answers on."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", connect_server.SERVER_CLASS],
                               start_new_session=True)
    deadline = time.monotonic() + 10
    while not connect_server._pid_is_server(process.pid):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.01)  # until the child has exec'd
    state.mkdir(parents=True, exist_ok=True)
    info = connect_server.ServerInfo(process.pid, 9, "t", time.time(), str(state / "server.log"), code)
    connect_server._save(state, info)
    return process


@pytest.mark.parametrize("stale", ["older code", "silent port"])
def test_a_stale_server_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stale: str) -> None:
    state = tmp_path / "sc"
    code = "old" if stale == "older code" else connect_server.code_fingerprint()
    process = fake_server(state, code)
    replacement = connect_server.ServerInfo(1, 2, "tok", 0.0, "log", connect_server.code_fingerprint())
    monkeypatch.setattr(connect_server, "_launch", lambda *_a, **_k: replacement)
    info, started = connect_server.ensure_local_connect_server(state)
    assert started and info == replacement
    assert not connect_server._pid_is_server(process.pid)  # the stale one was terminated
    process.wait(timeout=10)


def test_stop_ends_the_recorded_server_only_once(tmp_path: Path) -> None:
    process = fake_server(tmp_path, "x")
    assert stop_local_connect_server(tmp_path) is True
    assert not connect_server._pid_is_server(process.pid)
    process.wait(timeout=10)
    assert stop_local_connect_server(tmp_path) is False


def test_the_watchdog_ends_a_server_nobody_records_any_more(tmp_path: Path) -> None:
    process = fake_server(tmp_path, "x")
    (tmp_path / "server.json").unlink()  # e.g. the demo folder holding the state was deleted
    connect_server.watch(tmp_path, process.pid, interval_s=0.01)
    assert not connect_server._pid_is_server(process.pid)
    process.wait(timeout=10)
    connect_server.watch(tmp_path, process.pid, interval_s=0.01)  # returns at once: the server is gone


@pytest.mark.parametrize("config", [SparkConfig(remote="sc://cluster:15002"), SparkConfig(master="spark://m:7077"),
                                    SparkConfig(master="local[2]")], ids=["remote", "cluster", "local"])
def test_every_session_gets_the_session_defaults_and_spark_conf_overrides_them(config: SparkConfig) -> None:
    planned = session_module.plan_spark(config)
    assert planned.settings["spark.sql.codegen.hugeMethodLimit"] == "8000"
    overridden = SparkConfig(remote=config.remote, master=config.master,
                             conf={"spark.sql.codegen.hugeMethodLimit": "65535"})
    assert session_module.plan_spark(overridden).settings["spark.sql.codegen.hugeMethodLimit"] == "65535"
