"""A local Spark Connect server, started once and reused by every later run on the machine.

Why a server: a Spark JVM takes ~10-15 s to start on a 2-core machine. A Dagster run, a sensor-
triggered diff every 30 s, the CLI: each would pay it. A Connect server keeps one warm JVM; a
client session over gRPC is ready in about a second.

How: the pip-installed pyspark ships `spark-submit` and the Connect server classes (the
`spark-connect` jar is in `pyspark/jars`), so nothing is downloaded. The server is launched as
`spark-submit --conf spark.plugins=...SparkConnectPlugin connect_host.py` (a classic session serving
Spark Connect, its sessions sharing one pool of Python workers: see connect_host.py) in its
own session (it outlives the process that started it), bound to 127.0.0.1 on a free port, with a
random bearer token so other users of the machine cannot use it. `<state_dir>/server.json` (0600)
records pid, port and token; a later process reuses the server when that pid is still the Connect
server and the port answers. A `flock` on `<state_dir>/lock` makes "check, else start" atomic, so two
runs starting together share one server. Its log is `<state_dir>/server.log`.

The server's Python workers run this interpreter (`PYSPARK_PYTHON`), so they import this project
(tasks call the archive code) exactly as the driver does. Workers are reused and keep the modules
they imported, across sessions too, so a server started by a different version of this code (a
fingerprint of the project's source files, recorded in server.json) is restarted rather than reused.

Idle stop: the server outlives the command that started it (warm runs), but not for good. A small
watchdog process beside it (`watch`) ends it after `idle_timeout_s` (server.json; `spark {
local_server_idle_timeout }`, default 15 minutes, 0 = never) without a client session. How the
server side tells: a Spark Connect session is a gRPC channel, one HTTP/2 connection kept open
from the session's creation to its `stop()`, so the server has a session exactly while it holds an
ESTABLISHED TCP connection on its port; the watchdog counts those from the kernel's socket table
(`/proc/<pid>/net/tcp[6]`, or `lsof` where there is no procfs). Why this signal rather than a
heartbeat file touched by clients: it needs no cooperation from the client (dagster-pyspark's
builder, a pyspark shell someone points at the URL), it cannot go stale while a session sits
between two queries (a heartbeat needs a thread in every client), and a client killed with -9
stops counting at once (the kernel closes its socket). The one gap, a process that has been handed
the URL but has not connected yet, is closed by `ensure_local_connect_server` touching
`<state_dir>/claimed` under the lock when it hands the server out (once it answers: a JVM still
starting is not idle), and the watchdog stopping the server only under the same lock after
checking both again: a server is not stopped between being handed out and being used.
The watchdog records what it saw in `<state_dir>/activity.json` (sessions, idle since), which
`server_status` (`snapshotter spark status`) reports with pid, port, uptime and RSS.

Class-data archive: most of a server's start is the JVM loading and verifying Spark's classes. A
server started where no archive exists yet writes the classes it loaded to a JVM class-data archive
when it ends (`-XX:ArchiveClassesAtExit`, to a `.part` file of its own); the stop that saw it end
on SIGTERM promotes that file (one rename), and every later server maps it (`-XX:SharedArchiveFile`):
on 2 quiet cores the server answered in 3.1-3.5 s instead of 5.7-6.2 s. The one server that writes
it starts slower (11 s) and takes about 9 s longer to stop. Archives live in `class_archive_dir()`
(`$SNAPSHOTTER_JVM_CACHE`, else the user's cache folder), one per JVM binary and pyspark install,
so every state directory of the machine shares it. A dump cut short
(SIGKILL) is deleted, never promoted; an archive the JVM cannot use is ignored by the JVM itself
(`-Xshare:auto`) and deleted once the server runs without it mapped, and a server that fails to
start with one is started again without it, the archive deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from snapshot_assets.spark.server_memory import (
    HEAP_KEY,
    ON_OUT_OF_MEMORY,
    READER_SETTINGS,
    jvm_caps,
    memory_budget_mib,
    overhead_mib,
)

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
HOST_SCRIPT = Path(__file__).resolve().with_name("connect_host.py")  # the local server's driver program
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
ISOLATION = "spark.sql.artifact.isolation.enabled"
WORKER_DAEMON = "snapshot_assets.spark.worker_daemon"  # the local server's Python daemon: task code preloaded
DEFAULT_STATE_DIR = Path(".snapshotter") / "spark-connect"
START_TIMEOUT_S = 180.0
_INFO_FILE = "server.json"
_LOCK_FILE = "lock"
_LOG_FILE = "server.log"
_CLAIM_FILE = "claimed"  # touched whenever a process is handed the server (mtime = last claim)
_ACTIVITY_FILE = "activity.json"  # the watchdog's last observation
_WATCH_INTERVAL_S = 5.0
_ESTABLISHED = "01"  # TCP state in /proc/net/tcp


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
    idle_timeout_s: float = 0.0  # stopped by its watchdog after this long without a session; 0 = never
    class_dump: str = ""  # the class-data archive it writes when it ends ("": it maps one, or none)
    memory_mib: int = 0  # what its JVM is held to, heap + overhead (server_memory.py); 0: not recorded

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
    # A server started by an earlier version of this project ran SERVER_CLASS: still ours to stop.
    return HOST_SCRIPT.name.encode() in cmdline or SERVER_CLASS.encode() in cmdline


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
                          str(data["log_path"]), str(data.get("code", "")), float(data.get("idle_timeout_s", 0.0)),
                          str(data.get("class_dump", "")), int(data.get("memory_mib", 0)))
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


# --- the JVM's class-data archive (see the module docstring) ----------------------------------

CLASS_ARCHIVE_ENV = "SNAPSHOTTER_JVM_CACHE"
_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def class_archive_dir() -> Path:
    """Where class-data archives are kept: `$SNAPSHOTTER_JVM_CACHE`, else `<user cache>/snapshotter/jvm`."""
    configured = os.environ.get(CLASS_ARCHIVE_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "snapshotter" / "jvm"


def class_archive(home: Path) -> Path | None:
    """The archive for the JVM spark-submit runs (`$JAVA_HOME/bin/java`, else `java` on PATH) and the
    pyspark install at `home` (it may not exist yet); None when there is no JVM to name."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not found or not os.path.isfile(found):
        return None
    java = Path(found).resolve()
    stat = java.stat()
    jars = sorted(p.name for p in (home / "jars").glob("*.jar"))
    key = hashlib.sha256(f"{java}:{stat.st_size}:{stat.st_mtime_ns}:{home}:{','.join(jars)}".encode())
    return class_archive_dir() / f"spark-connect-{key.hexdigest()[:16]}.jsa"


def class_archive_option(archive: Path | None) -> tuple[str, str]:
    """(JVM option, dump path) for a new server: map `archive` when it exists, else write one when
    the server ends, to a `.part` path of its own (promoted by `_settle_dump`); none without a JVM
    to name or a folder to write to."""
    if archive is None:
        return "", ""
    if archive.is_file():
        return f"-XX:SharedArchiveFile={archive}", ""
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "", ""
    dump = archive.with_name(f"{archive.name}.{secrets.token_hex(6)}.part")
    return f"-XX:ArchiveClassesAtExit={dump}", str(dump)


def _settle_dump(dump: str, clean: bool) -> None:
    """After a server ended: promote the archive it wrote if it ended on SIGTERM (the JVM writes it
    before exiting), else delete what it left (a SIGKILL may cut the file short)."""
    if not dump:
        return
    part = Path(dump)
    with contextlib.suppress(OSError):
        if clean and part.is_file() and part.stat().st_size > 0:
            os.replace(part, part.with_name(part.name.split(".jsa.", 1)[0] + ".jsa"))
        else:
            part.unlink(missing_ok=True)


def server_command(port: int, conf: Mapping[str, str], master: str = "local[*]", java_option: str = "", *,
                   shared_workers: bool = False) -> list[str]:
    """The spark-submit command line of a Connect server on 127.0.0.1 (static confs such as memory go
    here); `java_option` joins the driver JVM's options (the class-data archive's). The JVM is held to
    `spark.driver.memory` + `spark.driver.memoryOverhead` (server_memory.py).

    `shared_workers`: the local server's form. Its driver is `connect_host.py`, a classic session with
    the Connect plugin and artifact isolation off, so every session shares one pool of Python workers
    (see that file for why), forked from a daemon that has imported the task code (worker_daemon.py).
    Otherwise `SparkConnectServer`, whose sessions are isolated, as a server whose clients ship their
    own code (a cluster's) needs."""
    home = pyspark_home()
    cmd = [str(home / "bin" / "spark-submit")]
    if not shared_workers:
        cmd += ["--class", SERVER_CLASS]
    cmd += ["--master", master, "--name", "snapshotter-spark-connect"]
    settings = {**READER_SETTINGS, **conf, "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port)}
    if shared_workers:
        settings.update({"spark.plugins": CONNECT_PLUGIN, ISOLATION: "false",
                         "spark.python.daemon.module": WORKER_DAEMON})
    # the caps that hold the JVM to heap + overhead (server_memory.py) first: options of the user's own win
    options = [*jvm_caps(overhead_mib(settings)), ON_OUT_OF_MEMORY, settings.get(_JAVA_OPTIONS, ""), java_option]
    settings[_JAVA_OPTIONS] = " ".join(o for o in options if o)
    memory = settings.pop(HEAP_KEY, None)
    if memory:
        cmd += ["--driver-memory", memory]  # must reach the JVM's -Xmx, not the session
    for key, value in sorted(settings.items()):
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(HOST_SCRIPT) if shared_workers else "spark-internal"]


#: The Arrow memory pool of the server's Python workers, unless the environment names one. Arrow's
#: default (mimalloc) backs large buffers with transparent huge pages, and on this kind of VM the
#: kernel compacts memory to fault each one in: a bucket merge's first task in a new worker spent
#: 1.5-1.9 s in the kernel for 0.9 s of its own work (2.3-3.2 s in all), 0.53-0.66 s with the system
#: allocator (1.4-1.5 s in all); a re-base job rewriting six buckets took 4.4-5.2 s instead of 5.7-6.4 s.
WORKER_ARROW_POOL = ("ARROW_DEFAULT_MEMORY_POOL", "system")


def _server_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.setdefault(*WORKER_ARROW_POOL)
    env.update(SPARK_HOME=str(pyspark_home()), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
    return env


def _launch(state_dir: Path, conf: Mapping[str, str], timeout_s: float, idle_timeout_s: float) -> ServerInfo:
    """Start a server (with the class-data archive when there is one); a server that fails to start
    with the archive is started once more without it, the archive deleted."""
    archive = class_archive(pyspark_home())
    option, dump = class_archive_option(archive)
    try:
        info = _launch_with(state_dir, conf, timeout_s, idle_timeout_s, option, dump)
    except ConnectServerError as exc:
        if archive is None or dump or not option:
            raise
        log.warning("the local Spark Connect server did not start with the class-data archive %s; deleting it "
                    "and starting without (%s)", archive, str(exc).splitlines()[0])
        with contextlib.suppress(OSError):
            archive.unlink()
        return _launch_with(state_dir, conf, timeout_s, idle_timeout_s, "", "")
    if archive is not None and option and not dump and _maps(info.pid, archive) is False:
        # the JVM ignored it (-Xshare:auto: another JVM's, or damaged): the next server writes a new one
        log.info("the local Spark Connect server did not map the class-data archive %s; deleting it", archive)
        with contextlib.suppress(OSError):
            archive.unlink()
    return info


def _maps(pid: int, path: Path) -> bool | None:
    """Whether process `pid` has `path` mapped (None without procfs)."""
    try:
        return str(path) in Path(f"/proc/{pid}/maps").read_text(errors="replace")
    except OSError:
        return None


def _launch_with(state_dir: Path, conf: Mapping[str, str], timeout_s: float, idle_timeout_s: float,
                 java_option: str, dump: str) -> ServerInfo:
    port, token = _free_port(), secrets.token_urlsafe(24)
    log_path = state_dir / _LOG_FILE
    command = server_command(port, conf, java_option=java_option, shared_workers=True)
    budget = memory_budget_mib(conf) or 0  # both read the memory sizes: a bad one fails before a launch
    with open(log_path, "ab") as out:
        process = subprocess.Popen(command,
                                   stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT, env=_server_env(token),
                                   start_new_session=True)
    info = ServerInfo(process.pid, port, token, time.time(), str(log_path), code_fingerprint(), idle_timeout_s, dump,
                      budget)
    _save(state_dir, info)  # recorded at once, so `stop` can end even a server that never answered
    _start_watchdog(state_dir, process.pid, dump)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            _settle_dump(dump, False)
            raise ConnectServerError(f"the local Spark Connect server exited with code {code} while "
                                     f"starting; {log_path} ends with:\n{_tail(log_path)}")
        if _answers(port):
            return info
        time.sleep(0.25)
    _stop(process.pid, dump, 10.0)
    raise ConnectServerError(f"the local Spark Connect server did not answer on port {port} within "
                             f"{timeout_s:.0f}s; {log_path} ends with:\n{_tail(log_path)}")


def _start_watchdog(state_dir: Path, pid: int, dump: str) -> None:
    """A tiny process beside the server that ends it when it is idle or nothing records it any more.

    A server outlives the run that started it by design, but not for good: after its idle time
    without a session (see the module docstring for how that is told), or at once when its state
    directory is deleted (a demo folder removed, a test's tmp dir: nobody could find or stop it
    again), a JVM holding gigabytes must not linger. The watchdog exits by itself with the server.
    """
    # Run as a plain script: this file imports only the standard library, so the watchdog stays small.
    subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "watch", str(state_dir), str(pid), dump],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def client_connections(pid: int, port: int) -> int | None:
    """Client sessions of the server `pid` listening on `port`: its ESTABLISHED connections on that port.

    Read from the kernel's table of the server's own network namespace (`/proc/<pid>/net/tcp`,
    `tcp6`: a 127.0.0.1 listener may show as an IPv4-mapped IPv6 socket), else from `lsof` (macOS,
    BSD). None when neither can tell: the caller must then assume the server is in use.
    """
    tables = [Path(f"/proc/{pid}/net/tcp"), Path(f"/proc/{pid}/net/tcp6")]
    if tables[0].exists():
        suffix = f":{port:04X}"
        count = 0
        for table in tables:
            with contextlib.suppress(OSError):
                for line in table.read_text().splitlines()[1:]:
                    fields = line.split()
                    if len(fields) > 3 and fields[1].endswith(suffix) and fields[3] == _ESTABLISHED:
                        count += 1
        return count
    return _lsof_connections(pid, port)


def _lsof_connections(pid: int, port: int) -> int | None:
    try:
        done = subprocess.run(["lsof", "-nP", "-a", "-p", str(pid), f"-iTCP:{port}", "-sTCP:ESTABLISHED", "-Fn"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode not in (0, 1):  # 1: nothing matched
        return None
    # -Fn: one "n<local>-><remote>" line per socket; the server's own side has the port as local end.
    return sum(1 for line in done.stdout.splitlines()
               if line.startswith("n") and line[1:].split("->")[0].endswith(f":{port}"))


def _claimed_at(state_dir: Path) -> float:
    try:
        return (state_dir / _CLAIM_FILE).stat().st_mtime
    except OSError:
        return 0.0


def _claim(state_dir: Path) -> None:
    """Record that a process was just handed the server (it connects within moments)."""
    (state_dir / _CLAIM_FILE).touch()  # sets the mtime of an existing file too


@dataclass(frozen=True, slots=True)
class Activity:
    """The watchdog's last observation of its server (`<state_dir>/activity.json`)."""

    server_pid: int
    watchdog_pid: int
    checked_at: float
    sessions: int | None  # None: connections cannot be counted here (the server is never idle-stopped)
    idle_since: float | None  # when the last session ended (or the last claim), None while in use
    stopped: str = ""  # why the watchdog ended the server, once it did


def _write_activity(state_dir: Path, activity: Activity) -> None:
    path = state_dir / _ACTIVITY_FILE
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with contextlib.suppress(OSError):  # the state directory may be going away: the loop notices
        tmp.write_text(json.dumps(asdict(activity)))
        os.replace(tmp, path)


def _read_activity(state_dir: Path) -> Activity | None:
    try:
        data = json.loads((state_dir / _ACTIVITY_FILE).read_text())
        return Activity(**data)
    except (OSError, ValueError, TypeError):
        return None


def watch(state_dir: Path, pid: int, interval_s: float = _WATCH_INTERVAL_S, dump: str = "") -> None:
    """The watchdog's loop: exit with the server; end it when server.json stops naming it, or when it
    has had no session for its `idle_timeout_s` (re-read every round, so a later run's setting counts).
    `dump` is the class-data archive the server writes when it ends (settled by whoever stops it)."""
    busy_at = time.time()
    while _pid_is_server(pid):
        info = _load(state_dir)
        if info is None or info.pid != pid:
            _stop(pid, dump, 30.0)
            return
        now = time.time()
        sessions = client_connections(pid, info.port)
        if sessions is None or sessions > 0:
            busy_at = now
        busy_at = max(busy_at, _claimed_at(state_dir))
        idle = sessions == 0 and busy_at < now
        _write_activity(state_dir, Activity(pid, os.getpid(), now, sessions, busy_at if idle else None))
        if idle and info.idle_timeout_s > 0 and now - busy_at >= info.idle_timeout_s and _stop_if_idle(state_dir, info):
            return
        pause = interval_s if info.idle_timeout_s <= 0 else min(interval_s, max(0.2, info.idle_timeout_s / 10))
        time.sleep(pause)


def _stop_if_idle(state_dir: Path, info: ServerInfo) -> bool:
    """Stop the idle server unless, under the lock that hands servers out, it was claimed or used meanwhile."""
    with _locked(state_dir):
        current = _load(state_dir)
        now = time.time()
        if (current is None or current.pid != info.pid or client_connections(info.pid, info.port) != 0
                or now - _claimed_at(state_dir) < current.idle_timeout_s):
            return False
        _stop(info.pid, info.class_dump, 30.0)
        with contextlib.suppress(FileNotFoundError):
            (state_dir / _INFO_FILE).unlink()
        why = f"idle for {current.idle_timeout_s:.0f}s without a session"
        log_path = Path(info.log_path)
        with contextlib.suppress(OSError), open(log_path, "a") as out:
            out.write(f"\n{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))} snapshotter watchdog: "
                      f"stopped the server (pid {info.pid}): {why}\n")
        # recorded last: a reader that sees the stop in activity.json finds the log line too
        _write_activity(state_dir, Activity(info.pid, os.getpid(), now, 0, None, why))
        return True


def ensure_local_connect_server(state_dir: Path | str = DEFAULT_STATE_DIR, *,
                                conf: Mapping[str, str] | None = None,
                                timeout_s: float = START_TIMEOUT_S,
                                idle_timeout_s: float | None = None) -> tuple[ServerInfo, bool]:
    """The running server under `state_dir`, started if needed; returns (info, started_now).

    `conf` applies only when this call starts the server (a reused server keeps its settings);
    `idle_timeout_s` (default: the `spark` block's default) is recorded for the server's watchdog
    either way, so the latest caller's setting counts. Raises ConnectServerError when the server
    cannot start.
    """
    if idle_timeout_s is None:
        from snapshot_assets.config import SparkConfig

        idle_timeout_s = SparkConfig().local_server_idle_timeout.total_seconds()
    state = Path(state_dir).absolute()
    with _locked(state):
        info = _load(state)
        if info is not None and _pid_is_server(info.pid):
            if info.code != code_fingerprint():
                log.warning("Spark Connect server pid %s runs an older version of this project's code; "
                            "restarting it", info.pid)
            elif _answers(info.port):
                if info.idle_timeout_s != idle_timeout_s:
                    info = replace(info, idle_timeout_s=idle_timeout_s)
                    _save(state, info)
                _claim(state)
                return info, False
            else:
                log.warning("Spark Connect server pid %s does not answer on port %s; starting a new one",
                            info.pid, info.port)
            _stop(info.pid, info.class_dump, 30.0)
        started = time.monotonic()
        info = _launch(state, conf or {}, timeout_s, idle_timeout_s)
        _claim(state)  # the idle time counts from here: starting a JVM is not being idle
        log.info("started a local Spark Connect server (pid %s, port %s) in %.1fs; log: %s",
                 info.pid, info.port, time.monotonic() - started, info.log_path)
        return info, True


def _terminate(pid: int, timeout_s: float) -> bool:
    """SIGTERM the server's process group (the JVM and its Python workers), SIGKILL after a grace;
    True when it ended on SIGTERM."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it if we are its parent
            if not _pid_is_server(pid):
                return sig == signal.SIGTERM
            time.sleep(0.1)
    return False


def _stop(pid: int, dump: str, timeout_s: float) -> None:
    """End the server and settle the class-data archive it writes as it ends (`_settle_dump`)."""
    _settle_dump(dump, _terminate(pid, timeout_s))


def stop_local_connect_server(state_dir: Path | str = DEFAULT_STATE_DIR, *, timeout_s: float = 30.0) -> bool:
    """Stop the server recorded under `state_dir`; True if one was running."""
    state = Path(state_dir).absolute()
    if not (state / _INFO_FILE).exists():
        return False
    with _locked(state):
        info = _load(state)
        running = info is not None and _pid_is_server(info.pid)
        if info is not None and running:
            _stop(info.pid, info.class_dump, timeout_s)
            log.info("stopped the local Spark Connect server (pid %s)", info.pid)
        with contextlib.suppress(FileNotFoundError):
            (state / _INFO_FILE).unlink()
        return running


#: How much of the end of a server's log `server_lost` reads for the reason it ended.
_LOG_TAIL_BYTES = 256 * 1024
#: Log lines that say why a JVM ended, best first.
_FATAL_MARKS = ("java.lang.OutOfMemoryError", "Terminating due to java.lang.OutOfMemoryError", "Exception in thread",
                " ERROR ")


def last_fatal_line(log_path: Path | str) -> str:
    """The line near the end of a server's log that best says why it ended ("" when none does)."""
    try:
        with open(log_path, "rb") as log_file:
            log_file.seek(max(0, os.fstat(log_file.fileno()).st_size - _LOG_TAIL_BYTES))
            lines = log_file.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for mark in _FATAL_MARKS:
        for line in reversed(lines):
            if mark in line:
                return line.strip()
    return ""


def server_lost(info: ServerInfo) -> str | None:
    """Why a run's local server is gone (its process ended: killed, or out of memory with
    `-XX:+ExitOnOutOfMemoryError`), for the run's error; None while it still runs. A run that loses
    its server fails with this rather than with the gRPC error its next call happened to get."""
    if _pid_is_server(info.pid):
        return None
    reason = last_fatal_line(info.log_path)
    return (f"the local Spark Connect server (pid {info.pid}, port {info.port}) ended during the run"
            f"{f': {reason}' if reason else ''}; its log is {info.log_path}. The next run starts a new server.")


def local_server_info(state_dir: Path | str = DEFAULT_STATE_DIR) -> ServerInfo | None:
    """The recorded server if it is running and answering, else None (never starts one)."""
    state = Path(state_dir).absolute()
    info = _load(state)
    if info is None or not _pid_is_server(info.pid) or not _answers(info.port):
        return None
    return info


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What `snapshotter spark status` shows of a running local server."""

    info: ServerInfo
    uptime_s: float
    rss_bytes: int | None  # the server's process group: the JVM and its Python workers
    sessions: int | None  # client sessions now; None where connections cannot be counted
    idle_s: float | None  # seconds without a session as its watchdog saw it; None while in use or unknown
    watchdog_alive: bool

    @property
    def stops_in_s(self) -> float | None:
        """Seconds until its watchdog stops it unless a session starts; None when it will not stop by itself."""
        if not self.watchdog_alive or self.info.idle_timeout_s <= 0 or self.sessions is None:
            return None
        return max(0.0, self.info.idle_timeout_s - (self.idle_s or 0.0))

    def stop_rule(self) -> str:
        """When it stops, in words: `in 14m12s unless a session starts (15m00s idle)`, `never by itself (...)`."""
        stops_in, timeout = self.stops_in_s, self.info.idle_timeout_s
        if not self.watchdog_alive:
            return "never by itself (its watchdog is not running)"
        if timeout <= 0:
            return "never by itself (local_server_idle_timeout = 0)"
        if stops_in is None:
            return "never by itself (sessions cannot be counted here)"
        if self.sessions:
            return f"after {human_duration(timeout)} without a session"
        return f"in {human_duration(stops_in)} unless a session starts ({human_duration(timeout)} idle)"


def human_duration(seconds: float) -> str:
    """`42s`, `14m05s`, `2h03m`."""
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def server_status(state_dir: Path | str = DEFAULT_STATE_DIR) -> ServerStatus | None:
    """The local server under `state_dir` with its uptime, sessions, idle time and RSS; None if none runs."""
    state = Path(state_dir).absolute()
    info = local_server_info(state)
    if info is None:
        return None
    now = time.time()
    sessions = client_connections(info.pid, info.port)
    activity = _read_activity(state)
    alive = activity is not None and activity.server_pid == info.pid and _pid_is_watchdog(activity.watchdog_pid,
                                                                                          info.pid)
    idle_since = None
    if alive and activity is not None and sessions == 0:
        # the watchdog counts idle time from its last sight of a session when it has not looked since
        idle_since = activity.idle_since if activity.idle_since is not None else activity.checked_at
    return ServerStatus(info, now - info.started_at, _group_rss(info.pid), sessions,
                        None if idle_since is None else max(0.0, now - idle_since), alive)


def last_stop(state_dir: Path | str = DEFAULT_STATE_DIR) -> str:
    """Why the watchdog last ended a server under `state_dir` ("" when it has not)."""
    activity = _read_activity(Path(state_dir).absolute())
    return activity.stopped if activity is not None else ""


def _pid_is_watchdog(pid: int, server_pid: int) -> bool:
    try:
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (ProcessLookupError, PermissionError):
        return False
    except OSError:
        return True  # no procfs: the pid check is all there is
    return b"watch" in cmdline and str(server_pid).encode() in cmdline


def _group_rss(pgid: int) -> int | None:
    """Resident memory of a process group (`ps`, on Linux and macOS alike), None if ps cannot tell."""
    try:
        done = subprocess.run(["ps", "-A", "-o", "pgid=,rss="], capture_output=True, text=True, timeout=10,
                              check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == str(pgid) and fields[1].isdigit():
            total += int(fields[1]) * 1024
    return total or None


if __name__ == "__main__":  # the watchdog: python connect_server.py watch STATE_DIR PID [DUMP]
    if len(sys.argv) in (4, 5) and sys.argv[1] == "watch":
        watch(Path(sys.argv[2]), int(sys.argv[3]), dump=sys.argv[4] if len(sys.argv) == 5 else "")
    else:
        sys.exit("usage: python connect_server.py watch STATE_DIR PID [DUMP]")
