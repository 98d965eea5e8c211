"""Acceptance, end to end: the product deployed on "hosts" that share no local path.

Five working directories stand for five hosts, each with its own cwd and TMPDIR:
- `ingest`: `snapshotter ingest` (the table's writer);
- `daemon`: `dagster-webserver` + `dagster-daemon` (sensors, run queue), talking to the code location
  over gRPC only;
- `code`: `dagster code-server start`, whose default run launcher starts the run workers (artifact
  runs, and the ingest supervisor's ingest run) in its own directory;
- `spark`: a Spark Connect server (its own SPARK_LOCAL_DIRS), reached by the runs through `spark.remote`.
What they share is what production shares: the PostgreSQL source, S3 (moto_server: the archive, and
the working root `buffer.path = "s3://..."` with the change buffer, the state, the outbox and the
counters) and Dagster's instance storage (PostgreSQL: deploy/dagster.postgres.yaml, compute logs in
S3). Every host reads its own copy of one config file, which names no local path.

The oracle is the PostgreSQL rounds test's (tests/e2e/test_postgres_rounds.py): a live table with
REPLICA IDENTITY DEFAULT, snowflake-sized keys, large TOASTed text/jsonb/bytea values, PK changes,
deletes and a TRUNCATE; after each round, once the sensors' runs have caught up, the archive rebuilt
at EVERY committed position, in every format, equals the table at that position. In one round the
ingest process is killed with SIGKILL: the ingest run the supervisor launched on the code host,
standing by on the S3 lease until then, takes over, and nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import dagster as dg
import pytest

from resources.buffer.object_storage import ObjectStorage
from resources.destinations.factory import build_destination
from resources.work_storage import WorkRoot
from snapshot_assets.archive.errors import ManifestNotFound
from snapshot_assets.config import load_config
from snapshot_assets.spark.connect_server import ServerInfo, ensure_local_connect_server, stop_local_connect_server
from tests.e2e.conftest import SCENARIO, e2e_env
from tests.e2e.instance_storage import InstanceStorage, postgres_storage
from tests.e2e.test_dagster_daemon import Service, server_info, stop_service, wait_for
from tests.e2e.test_postgres_rounds import (
    SEED,
    TABLE,
    Archive,
    History,
    Workload,
    check_archive,
    drop_archived_table,
)
from tests.pg.conftest import PgCluster

pytestmark = SCENARIO

HOSTS: Final = ("ingest", "daemon", "code", "spark")
ROUNDS: Final = 3  # round 3 holds the TRUNCATE
KILL_ROUND: Final = 2
LEASE_S: Final = 6
CATCH_UP_S: Final = 420.0  # artifact runs are Spark jobs through a remote session on a loaded 2-core machine
BIN: Final = Path(sys.executable).parent


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config_text(dsn: str, bucket: str, moto: str, remote: str) -> str:
    s3 = f'{{ endpoint_url = "{moto}", path_style = true }}'
    return f"""
snapshotter {{
  source {{ type = postgres, dsn = "{dsn}", schema = public, table = {TABLE}, slot = {TABLE}_slot,
            publication = {TABLE}_pub }}
  key_fields = [id]
  diff.interval = 1s
  snapshot {{ min_interval = 0s, max_churn_records = 90 }}
  retention.keep_epochs = 0
  destinations = [ {{ type = s3, bucket = {bucket}, prefix = "archive/", endpoint_url = "{moto}", path_style = true }} ]
  formats {{ snapshot = [jsonl, protobuf, parquet], diff = [jsonl, protobuf, parquet] }}
  buffer {{ path = "s3://{bucket}/work", lease = {LEASE_S}s, seal_interval = 200ms, s3 = {s3} }}
  spark {{ remote = "{remote}" }}
}}
"""


class Hosts:
    """The hosts' directories and the processes started on them (stopped, process group and all, at exit)."""

    def __init__(self, base: Path, storage: InstanceStorage) -> None:
        self.base, self.storage = base, storage
        self.services: list[Service] = []
        for host in HOSTS:
            (self.home(host) / "tmp").mkdir(parents=True)
            dagster = self.home(host) / "dagster_home"
            dagster.mkdir()
            (dagster / "dagster.yaml").write_text(storage.instance_yaml(run_queue={"dequeue_interval_seconds": 1}))

    def home(self, host: str) -> Path:
        return self.base / host

    def env(self, host: str) -> dict[str, str]:
        home = self.home(host)
        # The instance's settings first: its TMPDIR (compute-log staging) is each host's own here.
        return {**e2e_env(**self.storage.env), "TMPDIR": str(home / "tmp"), "DAGSTER_HOME": str(home / "dagster_home"),
                "SNAPSHOTTER_CONFIG": str(home / "snapshotter.conf"), "SPARK_LOCAL_DIRS": str(home / "tmp"),
                "PYTHONUNBUFFERED": "1"}

    def start(self, host: str, name: str, *argv: str) -> Service:
        log = self.home(host) / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(list(argv), cwd=self.home(host), env=self.env(host), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        service = Service(name, process, log)
        self.services.append(service)
        return service

    def stop_all(self) -> None:
        for service in reversed(self.services):
            stop_service(service)


def spark_server(hosts: Hosts) -> ServerInfo:
    """A Spark Connect server started on the spark host (its cwd, TMPDIR and SPARK_LOCAL_DIRS)."""
    state = hosts.home("spark") / "connect"
    script = ("import sys; from snapshot_assets.spark.connect_server import ensure_local_connect_server as e; "
              "print(e(sys.argv[1])[0].url)")
    subprocess.run([sys.executable, "-c", script, str(state)], cwd=hosts.home("spark"), env=hosts.env("spark"),
                   check=True, capture_output=True, timeout=180)
    return ensure_local_connect_server(state)[0]  # the running one: the same answer, read back


@contextlib.contextmanager
def deployment(hosts: Hosts, web_port: int, code_port: int) -> Iterator[list[Service]]:
    workspace = hosts.home("daemon") / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - grpc_server:\n      host: 127.0.0.1\n      port: {code_port}\n"
                         "      location_name: snapshotter\n")
    try:
        code = hosts.start("code", "dagster-code-server", str(BIN / "dagster"), "code-server", "start", "-h",
                           "127.0.0.1", "-p", str(code_port), "-m", "snapshot_assets.definitions")
        web = hosts.start("daemon", "dagster-webserver", str(BIN / "dagster-webserver"), "-w", str(workspace), "-h",
                          "127.0.0.1", "-p", str(web_port))
        wait_for(lambda: server_info(web_port), 180, "the webserver's /server_info", [code, web])
        hosts.start("daemon", "dagster-daemon", str(BIN / "dagster-daemon"), "run", "-w", str(workspace))
        yield hosts.services
    finally:
        hosts.stop_all()


def caught_up(archive: Archive, history: History) -> bool | None:
    """True once the archive's head covers the workload's last transaction."""
    with contextlib.suppress(ManifestNotFound):
        head = archive.reader().load_manifest().head_position
        return True if head and history.index_at(head) == len(history.states) - 1 else None
    return None


def test_hosts_sharing_no_disk_archive_every_position_exactly(pg_cluster: PgCluster, moto_server: str,
                                                             s3_bucket: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with postgres_storage(pg_cluster, moto_server, s3_bucket, tmp_path / "compute-logs-staging") as storage:
        hosts = Hosts(tmp_path / "hosts", storage)
        server = spark_server(hosts)
        try:
            config = config_text(pg_cluster.dsn(), s3_bucket, moto_server, server.url)
            for host in HOSTS:  # each host's own copy of the one config (it names no local path)
                (hosts.home(host) / "snapshotter.conf").write_text(config)
            table = load_config(hosts.home("ingest") / "snapshotter.conf", env={}).tables[0]
            archive = Archive(table, build_destination(table.destinations[0]))
            lease = ObjectStorage(WorkRoot.open(table.buffer.path, table.buffer.s3).part(table.name))
            conn = pg_cluster.connect()
            conn.autocommit = False
            workload = Workload(conn, SEED, "default")
            try:
                workload.setup()
                ingest = hosts.start("ingest", "snapshotter-ingest", str(BIN / "snapshotter"), "ingest", "--config",
                                     str(hosts.home("ingest") / "snapshotter.conf"))
                with deployment(hosts, free_port(), free_port()) as services:
                    for number in range(ROUNDS + 1):
                        if number:
                            workload.round(number)
                        if number == KILL_ROUND:
                            holder = lease.writer_alive() or ""
                            assert f":{ingest.process.pid}:" in holder, f"the lease is held by {holder!r}"
                            os.killpg(ingest.process.pid, signal.SIGKILL)
                            ingest.process.wait()
                            services.remove(ingest)  # dead on purpose: no longer watched
                        wait_for(lambda: caught_up(archive, workload.history), CATCH_UP_S,
                                 f"round {number}: the archive's head to cover the round", services)
                        check_archive(archive, workload.history)
                    owner = lease.writer_alive() or ""
                    assert f":{ingest.process.pid}:" not in owner and owner, "nobody took the writer role over"
                final = archive.reader().load_manifest()
                assert final.epoch >= 2 and any(not a.is_snapshot for a in final.artifacts), final
            finally:
                drop_archived_table(conn, TABLE)
            for host in HOSTS:  # nothing of the pipeline's state was kept on any host
                leftovers = [p for p in hosts.home(host).rglob("*") if p.name in ("buffer", "_state", "_outbox")]
                assert not leftovers, leftovers
        finally:
            stop_local_connect_server(hosts.home("spark") / "connect")
            shutil.rmtree(hosts.home("spark") / "tmp", ignore_errors=True)
        for key, value in storage.env.items():  # this process reads the instance the hosts shared
            monkeypatch.setenv(key, value)
        with dg.DagsterInstance.from_config(str(hosts.home("daemon") / "dagster_home")) as instance:
            runs = instance.get_runs()
            artifact_runs = [r for r in runs if r.job_name in ("snapshot_job", "diff_job")]
            assert any(r.status == dg.DagsterRunStatus.SUCCESS for r in artifact_runs), runs
            storage.verify(hosts.home("daemon") / "dagster_home", {r.run_id for r in runs})
