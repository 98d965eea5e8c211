"""Acceptance, end to end: the code location under a real `dagster-webserver` + `dagster-daemon` pair.

The scenario runs twice, once per instance storage (tests/e2e/instance_storage.py): the
repository's dagster.yaml (SQLite under DAGSTER_HOME) and production's deploy/dagster.postgres.yaml
(PostgreSQL in the private test cluster, compute logs on S3 at moto_server), each proved afterwards
to hold the runs. A test DAGSTER_HOME holds that dagster.yaml (the run queue with one run per
partition) plus a threaded sensor daemon and a short dequeue interval; a workspace file
loads `snapshot_assets.definitions` with the repository as working directory; SNAPSHOTTER_CONFIG
names two generator tables, with the archive, buffer and Spark state under the test's directory
(the processes run there): `public.users`, a source that never ends (seeded, paced), a 2 s diff
interval, a 45 s snapshot floor and a churn threshold that re-bases after the first diff(s); and
`public.quiet`, which sends its initial load and one transaction and then nothing, with a 2 s
retry backoff.

Nothing is launched by hand until the sensors have done their part, within a bounded time:
- the quiet table's first snapshot fails once for a real fault (its destination cannot hold the
  epoch's objects: a file stands where their folder must be); `status` says why it is not ready;
  the fault is removed, nothing changes in the source, and the `rebase_trigger` sensor's retry of
  the same boundary (run key `<boundary>:retry-N`, tags naming the attempt and the failed run)
  commits the snapshot;
- `ingest_supervisor` launched one ingest run per table; users' stays STARTED (never relaunched)
  while the quiet table's, terminated over GraphQL, is relaunched alone;
- `rebase_trigger` drove users' initial snapshot, at least one diff run and a re-base (a snapshot
  run with trigger max_churn_records), every artifact run launched by that sensor;
- the manifest on the destination says the same: valid chain, a diff, an epoch >= 2.
Then a forced snapshot is launched over GraphQL (`DagsterGraphQLClient.submit_job_execution` with
the table's partition tag), succeeds, and lands in the manifest as a new epoch at the position its
materialization reports. Finally the sensors are stopped and users' ingest run terminated over
GraphQL (it ends CANCELED, its buffer sealed), and both processes are stopped with SIGTERM (SIGKILL
after a grace period); their process groups (run workers included) are gone whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from resources.buffer import BufferReader
from resources.destinations.factory import build_destination
from snapshot_assets.archive.errors import ManifestNotFound
from snapshot_assets.archive.manifest import Manifest
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.config import TableConfig, load_config
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.status import table_status
from snapshot_assets.tables import (
    ATTEMPT_TAG,
    BOUNDARY_TAG,
    INGEST_TABLE_TAG,
    RETRY_OF_TAG,
    TO_TAG,
    TRIGGER_TAG,
)
from tests.e2e.conftest import REPO, SCENARIO, e2e_env
from tests.e2e.instance_storage import InstanceStorage, postgres_storage, sqlite_storage

pytestmark = SCENARIO

TABLE: Final = "public.users"
QUIET: Final = "public.quiet"
LOCATION: Final = "snapshotter"
# Bounds, not expectations: beside another worker's Spark or multi-process tests on 2 cores, a
# sensor-launched Spark run has taken several minutes (CI once passed 360 s at the sensors' step).
SENSORS_DEADLINE_S: Final = 600.0
FORCED_DEADLINE_S: Final = 300.0
RETRY_DEADLINE_S: Final = 450.0
STOP_GRACE_S: Final = 30.0
SENSOR_TAG: Final = "dagster/sensor_name"
PARTITION_TAG: Final = "dagster/partition"
RUN_KEY_TAG: Final = "dagster/run_key"
TERMINAL: Final = frozenset({dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
                             dg.DagsterRunStatus.CANCELED})
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_setup(work: Path, storage: InstanceStorage | None = None) -> tuple[Path, Path, Path]:
    """DAGSTER_HOME (the storage's dagster.yaml + daemon settings), workspace file, snapshotter config."""
    storage = storage or sqlite_storage()
    home = work / "dagster_home"
    home.mkdir()
    assert "tag_concurrency_limits" in storage.run_queue(), f"{storage.yaml.name} lost its run queue"
    # Dequeue promptly; evaluate sensors on threads (each sensor still ticks per its minimum interval).
    (home / "dagster.yaml").write_text(storage.instance_yaml(
        run_queue={"dequeue_interval_seconds": 1}, sensors={"use_threads": True, "num_workers": 4}))
    workspace = work / "workspace.yaml"
    workspace.write_text(f"""load_from:
  - python_module:
      module_name: snapshot_assets.definitions
      location_name: {LOCATION}
      working_directory: {REPO}
""")
    config = work / "snapshotter.conf"
    config.write_text(f"""
snapshotter {{
  buffer {{ path = "{work / 'buffer'}", seal_interval = 500ms }}
  tables = [
    {{
      source {{
        type = generator
        schema = public
        table = users
        generator {{ seed = 99, rows = 500, rate = 25 }}
      }}
      key_fields = [id]
      diff.interval = 2s
      # A diff first (inside the floor), then a churn re-base, however long a Spark run takes.
      snapshot {{ min_interval = 45s, max_churn_records = 1500 }}
      retention.keep_epochs = 0
      destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
      formats {{
        snapshot = [jsonl, protobuf, parquet]
        diff = [jsonl, protobuf, parquet]
      }}
    }}
    {{
      # Quiet: the initial load and one transaction, then nothing for hours.
      source {{ type = generator, schema = public, table = quiet, generator {{ seed = 7, rows = 50, rate = 0.0001 }} }}
      key_fields = [id]
      diff.interval = 2s
      retry {{ backoff = 2s, max_backoff = 4s }}
      destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
      formats {{ snapshot = [jsonl], diff = [jsonl] }}
    }}
  ]
}}
""")
    return home, workspace, config


# --- processes ---------------------------------------------------------------------------------


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(text[-lines:])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_service(service: Service, grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM the service's process group, SIGKILL whatever is left after `grace_s`; the leader's exit code."""
    pgid = service.process.pid  # started with start_new_session: its own group, run workers included
    code: int | None = None
    if service.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            code = service.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            service.process.wait(timeout=30)
    else:
        code = service.process.returncode
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:  # children outliving the leader
        time.sleep(0.2)
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return code


@contextlib.contextmanager
def services(work: Path, home: Path, workspace: Path, config: Path, port: int,
             storage_env: Mapping[str, str] | None = None) -> Iterator[list[Service]]:
    """The webserver (first: it initialises the instance storage), then the daemon; both stopped on exit.

    `storage_env` is what the instance's dagster.yaml reads through `env:` (connection settings).
    """
    env = e2e_env(DAGSTER_HOME=str(home), SNAPSHOTTER_CONFIG=str(config), PYTHONUNBUFFERED="1",
                  **(storage_env or {}))
    bindir = Path(sys.executable).parent
    started: list[Service] = []

    def start(name: str, *args: str) -> Service:
        log = work / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([str(bindir / name), *args], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        service = Service(name, process, log)
        started.append(service)
        return service

    try:
        web = start("dagster-webserver", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port))
        wait_for(lambda: server_info(port), 120, "the webserver's /server_info", [web])
        start("dagster-daemon", "run", "-w", str(workspace))
        yield started
    finally:
        for service in reversed(started):
            stop_service(service)


def server_info(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as response:
            info: dict[str, Any] = json.loads(response.read())
            return info
    except (OSError, urllib.error.URLError, ValueError):
        return None


def graphql(port: int, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql",
                                     data=json.dumps({"query": query, "variables": variables}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
    assert not body.get("errors"), body
    data: dict[str, Any] = body["data"]
    return data


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str, watched: list[Service],
             interval_s: float = 1.0) -> T:
    """Poll `probe` until it returns a value; fail naming `what` (with the services' logs) on timeout.

    A probe that raises (SQLite busy while a run writes, say) is retried; its last error is reported.
    """
    deadline = time.monotonic() + timeout_s
    error = ""
    while True:
        for service in watched:
            if service.process.poll() is not None:
                pytest.fail(f"{service.name} exited with {service.process.returncode} while waiting for "
                            f"{what}\n{service.tail()}")
        try:
            value = probe()
        except Exception as e:
            value, error = None, f"{type(e).__name__}: {e}"
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f}s (last probe error: {error or 'none'})\n"
                        + "\n".join(s.tail() for s in watched))
        time.sleep(interval_s)


# --- reading runs and the archive -------------------------------------------------------------


def runs(instance: dg.DagsterInstance, job: str | None = None) -> list[dg.DagsterRun]:
    return [r.dagster_run for r in instance.get_run_records(dg.RunsFilter(job_name=job) if job else None)]


def failure_of(instance: dg.DagsterInstance, run_id: str) -> str:
    """Why a run failed, from its event log (the first failed step's error), for assertion messages."""
    for entry in instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE}):
        event = entry.dagster_event
        error = getattr(getattr(event, "event_specific_data", None), "error", None)
        while error is not None and error.cause is not None:  # the op's own exception, not Dagster's wrapper
            error = error.cause
        if error is not None:
            return f"{getattr(event, 'step_key', None) or 'run'}: {error.message.strip()[:600]}"
        if entry.message:
            return entry.message[:600]
    return "(no failure event)"


def materializations(instance: dg.DagsterInstance, run_id: str, asset: str) -> list[dict[str, Any]]:
    out = []
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        mat = entry.asset_materialization
        if mat is not None and mat.asset_key == dg.AssetKey(asset):
            out.append({k: v.value for k, v in mat.metadata.items()})
    return out


def load_manifest(table: TableConfig) -> Manifest | None:
    reader = ArchiveReader(build_destination(table.destinations[0]), table.key_prefix, key_fields=table.key_fields,
                           cmp=compare_lsn)
    try:
        return reader.load_manifest()
    except ManifestNotFound:
        return None


def run_status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus | None:
    run = instance.get_run_by_id(run_id)
    return run.status if run else None


def ended_status(status: dg.DagsterRunStatus | None) -> dg.DagsterRunStatus | None:
    return status if status in TERMINAL else None


def stop_sensor(port: int, name: str) -> str:
    """Stop a sensor over GraphQL (as the UI's toggle does); returns its new status."""
    sensor = graphql(port, """
        query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
          __typename ... on Sensor { sensorState { id status } } } }""",
        {"s": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": name}})
    found = sensor["sensorOrError"]
    assert found["__typename"] == "Sensor", found
    stopped = graphql(port, """
        mutation($id: String!) { stopSensor(id: $id) { __typename
          ... on StopSensorMutationResult { instigationState { status } } } }""",
        {"id": found["sensorState"]["id"]})["stopSensor"]
    assert stopped["__typename"] == "StopSensorMutationResult", stopped
    status: str = stopped["instigationState"]["status"]
    return status


def sensor_status(port: int, name: str) -> str:
    found = graphql(port, """
        query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
          __typename ... on Sensor { sensorState { status } } } }""",
        {"s": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": name}})
    status: str = found["sensorOrError"]["sensorState"]["status"]
    return status


#: Longer than a daemon loop and one tick of these sensors on a loaded machine.
SENSOR_SETTLE_S: Final = 12.0


def stop_sensor_for_good(port: int, name: str, attempts: int = 5) -> None:
    """Stop a sensor and make sure it stays stopped. Dagster's sensor daemon writes back, as a tick
    starts and ends, the sensor state it read before the tick (`mark_sensor_state_for_tick`), so a
    stop that lands during a tick can be undone and the sensor runs on (seen on a loaded machine:
    the rebase trigger kept launching runs for 14 minutes after `stopSensor` said STOPPED). As an
    operator would, stop it again until it reads STOPPED after a tick's time."""
    for _ in range(attempts):
        assert stop_sensor(port, name) == "STOPPED"
        time.sleep(SENSOR_SETTLE_S)
        if sensor_status(port, name) == "STOPPED":
            return
    raise AssertionError(f"sensor {name} would not stay stopped after {attempts} stops")


def no_artifact_run_in_progress(instance: dg.DagsterInstance) -> bool | None:
    busy = [r for r in runs(instance) if r.job_name != "ingest_job" and r.status not in TERMINAL]
    return True if not busy else None


def ingest_runs(instance: dg.DagsterInstance, table: str) -> list[dg.DagsterRun]:
    return [r for r in runs(instance, "ingest_job") if r.tags.get(INGEST_TABLE_TAG) == table]


def block_snapshot_writes(table: TableConfig) -> Path:
    """A real fault, also for root: a file where the table's first epoch folder must be. The manifest
    still reads (no manifest yet), every upload of a first snapshot fails; removing the file heals it."""
    blocker = Path(table.destinations[0]["path"]) / f"{table.key_prefix}epoch=1"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder: the destination refuses this epoch's objects")
    return blocker


def durable_position(table: TableConfig) -> str | None:
    return BufferReader(table.buffer.path, table.name).durable_position()


def failed_at_durable_position(instance: dg.DagsterInstance, table: TableConfig) -> dg.DagsterRun | None:
    """A failed snapshot run of the table whose boundary is the buffer's (settled) durable position."""
    durable = durable_position(table)
    failed = [r for r in runs(instance, "snapshot_job") if r.tags.get(PARTITION_TAG) == table.name
              and r.status == dg.DagsterRunStatus.FAILURE and r.tags.get(TO_TAG) == durable]
    return failed[-1] if failed else None


def succeeded(instance: dg.DagsterInstance, boundary: str) -> dg.DagsterRun | None:
    ok = [r for r in runs(instance) if r.tags.get(BOUNDARY_TAG) == boundary and r.status == dg.DagsterRunStatus.SUCCESS]
    return ok[0] if ok else None


def relaunched(instance: dg.DagsterInstance, table: str, after: str) -> dg.DagsterRun | None:
    """The table's ingest run launched after run `after` ended, once it is running."""
    later = [r for r in ingest_runs(instance, table) if r.run_id != after and r.status == dg.DagsterRunStatus.STARTED]
    return later[0] if later else None


@dataclass
class SensorProgress:
    ingest: dg.DagsterRun
    diffs: list[dg.DagsterRun]
    rebases: list[dg.DagsterRun]
    manifest: Manifest


def sensor_progress(instance: dg.DagsterInstance, table: TableConfig) -> SensorProgress | None:
    """The sensors' work so far, once it includes an ingest run, a diff and a policy re-base."""
    ingest = ingest_runs(instance, table.name)
    ok = [r for r in runs(instance)
          if r.status == dg.DagsterRunStatus.SUCCESS and r.tags.get(PARTITION_TAG) == table.name]
    diffs = [r for r in ok if r.job_name == "diff_job"]
    rebases = [r for r in ok if r.job_name == "snapshot_job" and r.tags.get(TRIGGER_TAG) == "max_churn_records"]
    manifest = load_manifest(table)
    if not ingest or not diffs or not rebases or manifest is None:
        return None
    return SensorProgress(ingest[-1], diffs, rebases, manifest)


@pytest.fixture(params=["postgres"])
def instance_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InstanceStorage]:
    """The scenario on production's instance storage (deploy/dagster.postgres.yaml). The local
    default (SQLite) runs a real daemon in tests/e2e/test_http_api_daemon.py; running this
    13-minute scenario on both would double the suite's longest test for no new path
    (`sqlite_storage()` is one parameter away)."""
    with postgres_storage(request.getfixturevalue("pg_cluster"), request.getfixturevalue("moto_server"),
                          request.getfixturevalue("s3_bucket"), tmp_path / "tmp") as storage:
        yield storage


def test_dagster_webserver_and_daemon(workdir: Path, instance_storage: InstanceStorage,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    home, workspace, config = write_setup(workdir, instance_storage)
    table, quiet = load_config(config, env={}).tables
    blocker = block_snapshot_writes(quiet)
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # this process reads the same instance
    for name, value in instance_storage.env.items():
        monkeypatch.setenv(name, value)
    port = _free_port()

    with services(workdir, home, workspace, config, port, instance_storage.env) as procs, \
            dg.DagsterInstance.from_config(str(home)) as instance:
        info = server_info(port)
        assert info is not None and "dagster_webserver_version" in info, info
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)

        # 1. The quiet table's initial snapshot fails (its destination refuses the objects); status says
        #    why. Nothing changes in its source, the destination is healed, and the sensor's retry of the
        #    same boundary lands.
        failed = wait_for(lambda: failed_at_durable_position(instance, quiet), SENSORS_DEADLINE_S,
                          "a failed initial snapshot of the quiet table", procs)
        boundary = failed.tags[BOUNDARY_TAG]
        down = table_status(TablePipeline(quiet), instance=instance)
        assert not down.ready and down.artifact_failures >= 1, down
        assert any(r.startswith("no snapshot committed yet (the last run ") for r in down.not_ready), down.not_ready
        blocked_failures = {r.run_id for r in runs(instance, "snapshot_job")
                            if r.tags.get(PARTITION_TAG) == QUIET and r.status == dg.DagsterRunStatus.FAILURE}
        blocker.unlink()
        landed = wait_for(lambda: succeeded(instance, boundary), RETRY_DEADLINE_S,
                          f"the sensor's retry of {boundary}", procs)
        attempt = landed.tags[ATTEMPT_TAG]
        assert int(attempt) >= 1 and landed.tags[SENSOR_TAG] == "rebase_trigger"
        assert landed.tags[RUN_KEY_TAG] == f"{boundary}:retry-{attempt}"
        retry_of = instance.get_run_by_id(landed.tags[RETRY_OF_TAG])
        assert retry_of is not None and retry_of.status == dg.DagsterRunStatus.FAILURE
        assert retry_of.tags[BOUNDARY_TAG] == boundary
        assert durable_position(quiet) == failed.tags[TO_TAG], "the quiet table's source changed"
        quiet_manifest = load_manifest(quiet)
        assert quiet_manifest is not None
        assert [(a.kind, a.to_position) for a in quiet_manifest.artifacts] == [("snapshot", failed.tags[TO_TAG])]
        up = table_status(TablePipeline(quiet), instance=instance)
        assert up.ready and up.artifact_failures == 0, up
        retried_s = time.monotonic() - started

        # 2. One table's ingest run ends (terminated over GraphQL) while the other's runs: the supervisor
        #    relaunches that table's alone (checked after step 4, which runs meanwhile).
        (quiet_ingest,) = ingest_runs(instance, QUIET)
        client.terminate_run(quiet_ingest.run_id)

        # 3. The sensors, unaided: ingest, then diffs and a policy re-base.
        progress = wait_for(lambda: sensor_progress(instance, table), SENSORS_DEADLINE_S,
                            "ingest run + sensor-driven diff + max_churn_records re-base", procs, interval_s=3.0)
        sensors_s = time.monotonic() - started
        all_runs = runs(instance)
        assert all(r.tags.get(SENSOR_TAG) for r in all_runs), \
            [(r.job_name, r.tags) for r in all_runs if not r.tags.get(SENSOR_TAG)]
        users_ingest = ingest_runs(instance, TABLE)
        assert len(users_ingest) == 1, [r.status for r in users_ingest]
        ingest = users_ingest[0]
        assert ingest.tags[SENSOR_TAG] == "ingest_supervisor"
        assert ingest.status == dg.DagsterRunStatus.STARTED
        artifact_runs = [r for r in all_runs if r.job_name in ("diff_job", "snapshot_job")]
        assert all(r.tags[SENSOR_TAG] == "rebase_trigger" and r.tags.get(PARTITION_TAG) in (TABLE, QUIET)
                   for r in artifact_runs)
        assert not [r for r in artifact_runs if r.status == dg.DagsterRunStatus.FAILURE
                    and r.tags.get(PARTITION_TAG) != QUIET], "an artifact run failed"
        for run in progress.diffs:
            assert materializations(instance, run.run_id, "diff"), f"diff run {run.run_id} materialized no diff"
        rebase = materializations(instance, progress.rebases[0].run_id, "snapshot")
        assert rebase and rebase[0]["trigger"] == "max_churn_records" and rebase[0]["epoch"] >= 2, rebase

        manifest = load_manifest(table)
        assert manifest is not None
        manifest.validate(compare_lsn)
        assert manifest.epoch >= 2 and any(not a.is_snapshot for a in manifest.artifacts)
        assert any(a.is_snapshot and a.epoch == rebase[0]["epoch"] and a.to_position == rebase[0]["to_position"]
                   for a in manifest.artifacts)

        # 4. A forced snapshot over GraphQL lands as a new epoch.
        epoch_before = manifest.epoch
        run_id = client.submit_job_execution("force_snapshot", tags={PARTITION_TAG: TABLE})
        status = wait_for(lambda: ended_status(client.get_run_status(run_id)), FORCED_DEADLINE_S,
                          f"end of the forced snapshot run {run_id}", procs)
        assert status == dg.DagsterRunStatus.SUCCESS, "\n".join(p.tail() for p in procs)
        forced_run = instance.get_run_by_id(run_id)
        assert forced_run is not None and forced_run.tags.get(PARTITION_TAG) == TABLE
        forced = materializations(instance, run_id, "snapshot")
        assert len(forced) == 1 and forced[0]["trigger"] == "forced", forced
        assert forced[0]["epoch"] > epoch_before
        committed = materializations(instance, run_id, "manifest")
        assert committed and committed[0]["epoch"] == forced[0]["epoch"], committed
        after = load_manifest(table)
        assert after is not None
        after.validate(compare_lsn)
        assert any(a.is_snapshot and a.epoch == forced[0]["epoch"] and a.to_position == forced[0]["to_position"]
                   for a in after.artifacts), "the forced snapshot is not in the manifest"
        assert after.epoch >= forced[0]["epoch"] > epoch_before
        assert compare_lsn(after.head_position, manifest.head_position) >= 0

        current = instance.get_run_by_id(ingest.run_id)
        assert current is not None and current.status == dg.DagsterRunStatus.STARTED, "the ingest run did not stay up"
        assert len(ingest_runs(instance, TABLE)) == 1, "the users ingest run was relaunched"

        # 2, continued: the quiet table's ingest is back, by the supervisor; users' was not touched.
        again = wait_for(lambda: relaunched(instance, QUIET, quiet_ingest.run_id), FORCED_DEADLINE_S,
                         "the relaunch of the quiet table's ingest run", procs)
        assert ended_status(run_status(instance, quiet_ingest.run_id)) == dg.DagsterRunStatus.CANCELED
        assert again.tags["snapshotter/launch_reason"] == f"previous run {quiet_ingest.run_id} ended CANCELED"
        assert [r.run_id for r in ingest_runs(instance, TABLE)] == [ingest.run_id]

        # 5. Stop the sensors (no relaunch, no new artifact run), let artifact runs finish, then terminate
        #    the ingest run over GraphQL.
        for name in ("ingest_supervisor", "rebase_trigger"):
            stop_sensor_for_good(port, name)
        # A tick that was already evaluating may still submit a run, late on a loaded machine: settle
        # only when no artifact run is in progress and no new run appeared over a quiet interval.
        seen: set[str] | None = None
        for _ in range(20):
            wait_for(lambda: no_artifact_run_in_progress(instance), FORCED_DEADLINE_S, "artifact runs to end", procs)
            time.sleep(6)
            ids = {r.run_id for r in runs(instance)}
            if ids == seen and no_artifact_run_in_progress(instance):
                break
            seen = ids
        else:
            pytest.fail("runs kept appearing after the sensors were stopped")
        # The injected fault may also have failed an earlier boundary of the quiet table (its first
        # snapshot requested before its one transaction was durable); every other run succeeds.
        unsuccessful = [(r.run_id, r.job_name, r.tags.get(PARTITION_TAG), r.status.value) for r in runs(instance)
                        if r.job_name != "ingest_job"
                        and r.status != dg.DagsterRunStatus.SUCCESS and r.run_id not in blocked_failures]
        assert not unsuccessful, "artifact runs did not succeed: " + "; ".join(
            f"{u} {failure_of(instance, u[0])}" for u in unsuccessful)
        client.terminate_run(ingest.run_id)
        ended = wait_for(lambda: ended_status(run_status(instance, ingest.run_id)), 90,
                         "the end of the terminated ingest run", procs)
        assert ended == dg.DagsterRunStatus.CANCELED, ended
        durable = BufferReader(table.buffer.path, table.name).durable_position()
        assert durable is not None and compare_lsn(durable, after.head_position) >= 0

        instance_storage.verify(home, {r.run_id for r in runs(instance)})

        codes = {p.name: stop_service(p) for p in reversed(procs)}
    for name, code in codes.items():
        assert code is not None, f"{name} did not stop on SIGTERM"
    print(f"{instance_storage.name} storage: quiet table's snapshot retried in {retried_s:.0f}s "
          f"(attempt {attempt}); sensors did their part in "
          f"{sensors_s:.0f}s; epochs {epoch_before} -> {after.epoch}; "
          f"{len(progress.diffs)} diff run(s); total {time.monotonic() - started:.0f}s")
