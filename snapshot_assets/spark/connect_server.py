"""A local Spark Connect server, started once and reused by every later run on the machine.

Why a server: a Spark JVM takes ~10-15 s to start on a 2-core machine. A Dagster run, a sensor-
triggered diff every 30 s, the CLI: each would pay it. A Connect server keeps one warm JVM; a
client session over gRPC is ready in about a second.

How: the pip-installed pyspark ships `spark-submit` and the Connect server classes (the
`spark-connect` jar is in `pyspark/jars`), so nothing is downloaded. The server is launched as
`spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal` in its
own session (it outlives the process that started it), bound to 127.0.0.1 on a free port, with a
random bearer token so other users of the machine cannot use it. `<state_dir>/server.json` (0600)
records pid, port and token; a later process reuses the server when that pid is still the Connect
server and the port answers. A `flock` on `<state_dir>/lock` makes "check, else start" atomic, so two
runs starting together share one server. Its log is `<state_dir>/server.log`.

The server's Python workers run this interpreter (`PYSPARK_PYTHON`), so they import this project
(tasks call the archive code) exactly as the driver does. Workers are reused and keep the modules
they imported, so a server started by a different version of this code (a fingerprint of the
project's source files, recorded in server.json) is restarted rather than reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_STATE_DIR = Path(".snapshotter") / "spark-connect"
START_TIMEOUT_S = 180.0
_INFO_FILE = "server.json"
_LOCK_FILE = "lock"
_LOG_FILE = "server.log"


class ConnectServerError(RuntimeError):
    """The local Connect server could not be started (the message says why, with the log's tail)."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A running local server: what a client needs to reach it and what `stop` needs to end it."""

    pid: int
    port: int
    token: str
    started_at: float
    log_path: str
    code: str = ""  # fingerprint of the project code its Python workers import

    @property
    def url(self) -> str:
        """The `sc://` connection string; `localhost` lets the client send the token without TLS."""
        return f"sc://localhost:{self.port}/;token={self.token}"


def pyspark_home() -> Path:
    """SPARK_HOME of the pip-installed pyspark (holds bin/spark-submit and jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def code_fingerprint() -> str:
    """A cheap fingerprint of this project's Python sources (paths, sizes, mtimes)."""
    import resources
    import snapshot_assets

    digest = hashlib.sha256(sys.executable.encode())
    for package in (snapshot_assets, resources):
        for root in package.__path__:
            for path in sorted(Path(root).rglob("*.py")):
                stat = path.stat()
                digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _pid_is_server(pid: int) -> bool:
    """True when `pid` lives and is a Connect server (guards against a recycled pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours: never reuse or signal another user's process
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no procfs (macOS): the pid check is all there is
    return SERVER_CLASS.encode() in cmdline


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / _LOCK_FILE, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


def _load(state_dir: Path) -> ServerInfo | None:
    try:
        data = json.loads((state_dir / _INFO_FILE).read_text())
        return ServerInfo(int(data["pid"]), int(data["port"]), str(data["token"]), float(data["started_at"]),
                          str(data["log_path"]), str(data.get("code", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(state_dir: Path, info: ServerInfo) -> None:
    path = state_dir / _INFO_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the token
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(info), f)
    os.replace(tmp, path)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def server_command(port: int, conf: Mapping[str, str], master: str = "local[*]") -> list[str]:
    """The spark-submit command line of a local server (static confs such as memory go here)."""
    home = pyspark_home()
    cmd = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master,
           "--name", "snapshotter-spark-connect"]
    settings = {**conf, "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port)}
    memory = settings.pop("spark.driver.memory", None)
    if memory:
        cmd += ["--driver-memory", memory]  # must reach the JVM's -Xmx, not the session
    for key, value in sorted(settings.items()):
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, "spark-internal"]


def _server_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update(SPARK_HOME=str(pyspark_home()), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
    return env


def _launch(state_dir: Path, conf: Mapping[str, str], timeout_s: float) -> ServerInfo:
    port, token = _free_port(), secrets.token_urlsafe(24)
    log_path = state_dir / _LOG_FILE
    with open(log_path, "ab") as out:
        process = subprocess.Popen(server_command(port, conf), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=_server_env(token), start_new_session=True)
    info = ServerInfo(process.pid, port, token, time.time(), str(log_path), code_fingerprint())
    _save(state_dir, info)  # recorded at once, so `stop` can end even a server that never answered
    _start_watchdog(state_dir, process.pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            raise ConnectServerError(f"the local Spark Connect server exited with code {code} while "
                                     f"starting; {log_path} ends with:\n{_tail(log_path)}")
        if _answers(port):
            return info
        time.sleep(0.25)
    _terminate(process.pid, 10.0)
    raise ConnectServerError(f"the local Spark Connect server did not answer on port {port} within "
                             f"{timeout_s:.0f}s; {log_path} ends with:\n{_tail(log_path)}")


def _start_watchdog(state_dir: Path, pid: int) -> None:
    """A tiny process in the server's group that ends the server once nothing records it any more.

    A server outlives the run that started it by design; but if its state directory is deleted (a
    demo folder removed, a test's tmp dir) nobody could find or stop it again, and a JVM holding
    gigabytes would linger forever. The watchdog exits by itself within seconds of the server.
    """
    # Run as a plain script: this file imports only the standard library, so the watchdog stays small.
    subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "watch", str(state_dir), str(pid)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def watch(state_dir: Path, pid: int, interval_s: float = 5.0) -> None:
    """The watchdog's loop: exit with the server; end it when server.json stops naming it."""
    while _pid_is_server(pid):
        info = _load(state_dir)
        if info is None or info.pid != pid:
            _terminate(pid, 30.0)
            return
        time.sleep(interval_s)


def ensure_local_connect_server(state_dir: Path | str = DEFAULT_STATE_DIR, *,
                                conf: Mapping[str, str] | None = None,
                                timeout_s: float = START_TIMEOUT_S) -> tuple[ServerInfo, bool]:
    """The running server under `state_dir`, started if needed; returns (info, started_now).

    `conf` applies only when this call starts the server (a reused server keeps its settings).
    Raises ConnectServerError when the server cannot start.
    """
    state = Path(state_dir).absolute()
    with _locked(state):
        info = _load(state)
        if info is not None and _pid_is_server(info.pid):
            if info.code != code_fingerprint():
                log.warning("Spark Connect server pid %s runs an older version of this project's code; "
                            "restarting it", info.pid)
            elif _answers(info.port):
                return info, False
            else:
                log.warning("Spark Connect server pid %s does not answer on port %s; starting a new one",
                            info.pid, info.port)
            _terminate(info.pid, 10.0)
        started = time.monotonic()
        info = _launch(state, conf or {}, timeout_s)
        log.info("started a local Spark Connect server (pid %s, port %s) in %.1fs; log: %s",
                 info.pid, info.port, time.monotonic() - started, info.log_path)
        return info, True


def _terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM the server's process group (the JVM and its Python workers), SIGKILL after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it if we are its parent
            if not _pid_is_server(pid):
                return
            time.sleep(0.1)


def stop_local_connect_server(state_dir: Path | str = DEFAULT_STATE_DIR, *, timeout_s: float = 30.0) -> bool:
    """Stop the server recorded under `state_dir`; True if one was running."""
    state = Path(state_dir).absolute()
    if not (state / _INFO_FILE).exists():
        return False
    with _locked(state):
        info = _load(state)
        running = info is not None and _pid_is_server(info.pid)
        if info is not None and running:
            _terminate(info.pid, timeout_s)
            log.info("stopped the local Spark Connect server (pid %s)", info.pid)
        with contextlib.suppress(FileNotFoundError):
            (state / _INFO_FILE).unlink()
        return running


def local_server_info(state_dir: Path | str = DEFAULT_STATE_DIR) -> ServerInfo | None:
    """The recorded server if it is running and answering, else None (never starts one)."""
    state = Path(state_dir).absolute()
    info = _load(state)
    if info is None or not _pid_is_server(info.pid) or not _answers(info.port):
        return None
    return info


if __name__ == "__main__":  # the watchdog: python connect_server.py watch STATE_DIR PID
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        watch(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: python connect_server.py watch STATE_DIR PID")
