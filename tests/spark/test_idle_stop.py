"""The local Spark Connect server stops by itself when idle; `snapshotter spark status|stop` on a real server."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from snapshot_assets.cli import main
from snapshot_assets.spark import connect_server
from snapshot_assets.spark.connect_server import (
    ServerInfo,
    client_connections,
    ensure_local_connect_server,
    last_stop,
    server_status,
    stop_local_connect_server,
)
from snapshot_assets.spark.session import session_from_settings

SMALL = {"spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> float:
    """Poll `check` until it holds; the seconds it took. Fails the test at the deadline."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - started


def spark_cli(*args: str) -> str:
    out = io.StringIO()
    assert main(["spark", *args], out=out) == 0
    return out.getvalue()


def group_alive(pgid: int) -> bool:
    """A live (not zombie) process in the group: the JVM or one of its Python workers."""
    listing = subprocess.run(["ps", "-A", "-o", "pgid=,stat="], capture_output=True, text=True, check=True).stdout
    return any(f.split()[0] == str(pgid) and not f.split()[1].startswith("Z") for f in listing.splitlines())


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "spark-connect"
    yield state
    stop_local_connect_server(state)


@pytest.mark.parametrize("count", [client_connections, connect_server._lsof_connections], ids=["procfs", "lsof"])
def test_client_connections_counts_the_open_connections_on_the_port(
        count: Callable[[int, int], int | None]) -> None:
    if count is connect_server._lsof_connections and shutil.which("lsof") is None:
        pytest.skip("no lsof here")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert count(os.getpid(), port) == 0  # the listening socket is not a session
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        accepted = [listener.accept()[0] for _ in clients]
        # each connection shows twice in this process (client and server side): only the server's count
        assert count(os.getpid(), port) == 2
        for sock in clients + accepted:
            sock.close()
        wait_for("connections closed", lambda: count(os.getpid(), port) == 0, 10)
        # a client killed with -9 stops counting at once: the kernel closes its socket
        client = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; "
                                   f"s = socket.create_connection(('127.0.0.1', {port})); print(1, flush=True); "
                                   "time.sleep(600)"], stdout=subprocess.PIPE)
        assert client.stdout is not None and client.stdout.readline().strip() == b"1"
        server_side = listener.accept()[0]
        assert count(os.getpid(), port) == 1
        client.kill()
        client.wait()
        wait_for("the killed client's connection is gone", lambda: count(os.getpid(), port) == 0, 10)
        server_side.close()


@pytest.mark.slow
def test_the_server_stops_by_itself_once_the_last_session_has_been_idle_long_enough(state: Path) -> None:
    idle = 4.0
    info, started = ensure_local_connect_server(state, conf=SMALL, idle_timeout_s=idle)
    assert started and info.idle_timeout_s == idle
    spark = session_from_settings({"spark.remote": info.url})
    try:
        assert spark.range(5).count() == 5
        wait_for("the watchdog sees the session", lambda: _sessions(state) == 1)
        shown = spark_cli("status", "--state-dir", str(state))
        assert f"pid      {info.pid}\n" in shown and "sessions 1\n" in shown and "idle     no (in use)" in shown, shown
        assert "rss      " in shown and "MiB" in shown and "stops    after 4s without a session" in shown, shown
        assert "memory   the JVM held to 1536 MiB (spark.driver.memory + spark.driver.memoryOverhead)\n" in shown, shown
        # a session that does nothing for longer than the idle time still keeps the server
        deadline = time.monotonic() + 3 * idle
        while time.monotonic() < deadline:
            assert connect_server._pid_is_server(info.pid), "stopped while a session was open"
            time.sleep(0.5)
        assert spark.range(3).count() == 3
    finally:
        spark.stop()
    # the watchdog ends the JVM first and then records the stop: wait for the record, not the pid, so a
    # loaded machine cannot catch the moment in between
    stopped_in = wait_for("the idle server stops by itself", lambda: "idle for" in last_stop(state))
    assert stopped_in >= idle - 1.5  # the idle time counts from the session's end, not from the start
    assert not connect_server._pid_is_server(info.pid)
    assert server_status(state) is None and not (state / "server.json").exists()
    wait_for("the server's Python workers end with it", lambda: not group_alive(info.pid), 15)
    assert "idle for 4s without a session" in last_stop(state)
    assert "stopped the server" in Path(info.log_path).read_text()
    assert "the last one stopped: idle for 4s" in spark_cli("status", "--state-dir", str(state))


@pytest.mark.slow
def test_spark_status_and_stop_on_a_server_that_never_stops_by_itself(state: Path) -> None:
    info, _ = ensure_local_connect_server(state, conf=SMALL, idle_timeout_s=0)
    spark = session_from_settings({"spark.remote": info.url})
    assert spark.range(4).count() == 4  # starts the server's Python-side machinery too
    spark.stop()
    wait_for("the session ends", lambda: _sessions(state) == 0)
    shown = spark_cli("status", "--state-dir", str(state))
    assert "sessions 0\n" in shown and "never by itself (local_server_idle_timeout = 0" in shown, shown
    # a later caller's idle time replaces the recorded one (the latest configuration counts)
    again, started = ensure_local_connect_server(state, conf=SMALL, idle_timeout_s=600)
    assert not started and again.pid == info.pid and _recorded(state).idle_timeout_s == 600
    assert "stops    in 9m" in spark_cli("status", "--state-dir", str(state))
    assert spark_cli("stop", "--state-dir", str(state)) == f"stopped the local Spark Connect server (pid {info.pid})\n"
    assert not connect_server._pid_is_server(info.pid)
    wait_for("the server's Python workers end with it", lambda: not group_alive(info.pid), 15)
    assert spark_cli("status", "--state-dir", str(state)).startswith("no local Spark Connect server runs under")
    assert spark_cli("stop", "--state-dir", str(state)).startswith("no local Spark Connect server runs under")


def _sessions(state: Path) -> int | None:
    status = server_status(state)
    return status.sessions if status is not None and status.watchdog_alive else None


def _recorded(state: Path) -> ServerInfo:
    info = connect_server._load(state)
    assert info is not None
    return info
