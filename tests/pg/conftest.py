"""A private PostgreSQL cluster for the session: initdb in a temp dir, logical WAL, a loopback port.

The cluster is the real server (no mocks): `wal_level=logical`, room for replication slots and
walsenders, a unix socket in the temp dir (never the system's), TCP on 127.0.0.1 with
scram-sha-256 so wrong credentials can be tested. `fsync=off` because the tests kill clients, not
the server.

initdb and postgres refuse to run as root. As root, the fixture runs them as the `postgres` OS user
(via subprocess's `user=`/`group=`, i.e. setuid in the child); if that user does not exist it
creates a system user `snapshotter-pg` with `useradd --system`. As any other user it runs them as
that user. The suite is skipped only when no PostgreSQL server binaries can be found at all.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

_SERVICE_USER_FALLBACK = "snapshotter-pg"
_SUPERUSER = "postgres"
_DATABASE = "snapshotter_test"

_SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "track_commit_timestamp": "on",  # get(key) tests compare commit times with pg_xact_commit_timestamp
    "max_replication_slots": "40",
    "max_wal_senders": "40",
    "max_connections": "100",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


@dataclass(frozen=True)
class PgCluster:
    """How to reach the private cluster; `dsn()` builds a libpq DSN with optional overrides."""

    bindir: Path
    datadir: Path
    socket_dir: Path
    port: int
    user: str
    password: str
    dbname: str

    def dsn(self, **overrides: str | int) -> str:
        params: dict[str, str | int] = {"host": "127.0.0.1", "port": self.port, "user": self.user,
                                        "password": self.password, "dbname": self.dbname}
        params.update(overrides)
        return " ".join(f"{key}={value}" for key, value in params.items())

    def connect(self, **overrides: str | int) -> psycopg2.extensions.connection:
        conn = psycopg2.connect(self.dsn(**overrides))
        conn.autocommit = True
        return conn


def _find_bindir() -> Path | None:
    candidates = [os.environ.get("PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]),
                         reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


def _service_user() -> str | None:
    """The OS user to run the server as: None when not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", _SERVICE_USER_FALLBACK):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    _SERVICE_USER_FALLBACK], check=True)
    return _SERVICE_USER_FALLBACK


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Runner:
    """Runs server binaries as the service user (when root) in the cluster's directory."""

    def __init__(self, bindir: Path, home: Path, user: str | None) -> None:
        self.bindir = bindir
        self.home = home
        self.user = user

    def __call__(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{self.bindir}:/usr/bin:/bin", "HOME": str(self.home), "LC_ALL": "C.UTF-8",
               "LANG": "C.UTF-8"}
        command = [str(self.bindir / tool), *args]
        if self.user is None:
            return subprocess.run(command, env=env, cwd=self.home, check=check, capture_output=True,
                                  text=True, timeout=120)
        # As root: setuid/setgid to the service user in the child, with no supplementary groups.
        return subprocess.run(command, env=env, cwd=self.home, check=check, capture_output=True, text=True,
                              timeout=120, user=self.user, group=pwd.getpwnam(self.user).pw_gid,
                              extra_groups=[])


def _initdb(run: _Runner, datadir: Path, password: str) -> None:
    pwfile = run.home / "pwfile"
    pwfile.write_text(password + "\n")
    if run.user:
        shutil.chown(pwfile, run.user)
    run("initdb", "-D", str(datadir), "-U", _SUPERUSER, "-E", "UTF8", "--no-locale", "--no-sync",
        "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}")
    pwfile.unlink()


def _configure(datadir: Path, socket_dir: Path, port: int) -> None:
    settings = dict(_SERVER_SETTINGS, port=str(port), unix_socket_directories=f"'{socket_dir}'")
    with (datadir / "postgresql.conf").open("a") as conf:
        conf.write("\n# snapshotter test cluster\n")
        conf.writelines(f"{name} = {value}\n" for name, value in settings.items())


def _start(run: _Runner, datadir: Path) -> None:
    result = run("pg_ctl", "-D", str(datadir), "-l", str(run.home / "server.log"), "-w", "-t", "60", "start",
                 check=False)
    if result.returncode != 0:
        log = (run.home / "server.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"pg_ctl start failed ({result.returncode}): {result.stderr}\n{log}")


def _stop(run: _Runner, datadir: Path) -> None:
    result = run("pg_ctl", "-D", str(datadir), "-m", "fast", "-w", "-t", "30", "stop", check=False)
    if result.returncode != 0:
        run("pg_ctl", "-D", str(datadir), "-m", "immediate", "-w", "stop", check=False)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A running private cluster with database `snapshotter_test`; stopped and deleted afterwards."""
    bindir = _find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) found; set PG_BINDIR")
    user = _service_user()
    home = Path(tempfile.mkdtemp(prefix="snapshotter-pg-"))
    run = _Runner(bindir, home, user)
    datadir, socket_dir = home / "data", home / "sock"
    socket_dir.mkdir()
    if user:
        for path in (home, socket_dir):
            shutil.chown(path, user, pwd.getpwnam(user).pw_gid)
    password = secrets.token_hex(16)
    port = _free_port()
    started = False
    try:
        _initdb(run, datadir, password)
        _configure(datadir, socket_dir, port)
        _start(run, datadir)
        started = True
        cluster = PgCluster(bindir, datadir, socket_dir, port, _SUPERUSER, password, _DATABASE)
        admin = cluster.connect(dbname="postgres")
        try:
            admin.cursor().execute(f"CREATE DATABASE {_DATABASE}")
        finally:
            admin.close()
        yield cluster
    finally:
        if started:
            _stop(run, datadir)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_dsn(pg_cluster: PgCluster) -> str:
    """The DSN of the test database in the private cluster (TCP on 127.0.0.1, password auth)."""
    return pg_cluster.dsn()
