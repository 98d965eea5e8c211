"""laredo's HTTP API and the ingest run's graceful shutdown, against a running `dagster-daemon`.

A test DAGSTER_HOME (the repository's dagster.yaml: SQLite, the run queue) and a workspace file;
one generator table whose trigger sensor looks once an hour (so every artifact run here is one the
test caused); `dagster-daemon run` and `snapshotter serve --workspace ...` as real processes.
- /health/ready is 503 naming the table and "no snapshot committed yet" while the ingest run the
  supervisor launched fills the buffer;
- `POST /snapshot` answers the id of a `force_snapshot` run submitted to the instance; the daemon
  runs it, it commits epoch 1, and ready turns 200; `/status` then equals the manifest;
- SIGTERM to the ingest run's worker process: the run ends CANCELED, its buffer sealed, and it
  submitted the final diff (head, X] (trigger `shutdown`), which the daemon runs: X is at least
  the durable position before the signal (every change acknowledged before it), and the archive
  rebuilt at X equals the generator's table at X; `/metrics` then shows one diff since the
  snapshot and the head's position;
- `POST /snapshot?table=` commits epoch 2 and the diffs since the snapshot drop to 0.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Final

import dagster as dg
import pytest

from resources.buffer import BufferReader
from snapshot_assets.archive.positions import compare_lsn, parse_lsn
from snapshot_assets.config import TableConfig, load_config
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.tables import FROM_TAG, INGEST_TABLE_TAG, PARTITION_TAG, TO_TAG, TRIGGER_TAG
from tests.e2e.conftest import SCENARIO, e2e_env
from tests.e2e.daemon_support import TABLE, rebuilt_equals_source, setup, start_daemon, succeeded
from tests.e2e.http_support import call, metric, poll, serve_process
from tests.e2e.test_dagster_daemon import Service, ended_status, materializations, run_status, runs, stop_service

pytestmark = SCENARIO

SENSOR_DEADLINE_S: Final = 120.0


def force(port: int, instance: dg.DagsterInstance, query: str, log: Path) -> int:
    """POST /snapshot, wait for its run; the epoch it committed (as its materialization says)."""
    answer = call(port, f"/snapshot{query}", method="POST", timeout=120)
    assert answer.code == 200, answer.text
    (run,) = answer.json()["runs"]
    assert run["table"] == TABLE
    launched = instance.get_run_by_id(run["run_id"])
    assert launched is not None and launched.job_name == "force_snapshot" and launched.tags[PARTITION_TAG] == TABLE
    succeeded(instance, run["run_id"], log)
    (snap,) = materializations(instance, run["run_id"], "snapshot")
    epoch: int = snap["epoch"]
    return epoch


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of a run's worker process, from its "Started process for run (pid: N)" engine event."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        found = re.search(r"Started process for run \(pid: (\d+)\)", entry.message or "")
        if found:
            return int(found.group(1))
    return None


def started_ingest(instance: dg.DagsterInstance) -> dg.DagsterRun | None:
    live = [r for r in runs(instance, "ingest_job")
            if r.tags.get(INGEST_TABLE_TAG) == TABLE and r.status == dg.DagsterRunStatus.STARTED]
    return live[0] if live else None


def shutdown_diff(instance: dg.DagsterInstance, head: str) -> dg.DagsterRun | None:
    found = [r for r in runs(instance, "diff_job") if r.tags.get(TRIGGER_TAG) == "shutdown"
             and r.tags.get(FROM_TAG) == head]
    return found[0] if found else None


def test_http_api_and_ingest_shutdown_with_a_daemon(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, workspace, config = setup(workdir)
    (table,) = load_config(config, env={}).tables
    pipe = TablePipeline(table)
    env = e2e_env(DAGSTER_HOME=str(home), SNAPSHOTTER_CONFIG=str(config), PYTHONUNBUFFERED="1")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    # The instance is opened (its SQLite storage created) before the daemon and `serve` start: two
    # processes creating a fresh SQLite schema at once race ("table ... already exists").
    with dg.DagsterInstance.from_config(str(home)) as instance:
        daemon = start_daemon(workdir, workspace, env)
        try:
            with serve_process(workdir, config, env, "--workspace", str(workspace), interval=1.0) as (port, _, log):
                _scenario(port, instance, table, pipe, daemon, log)
        finally:
            stop_service(daemon)


def _scenario(port: int, instance: dg.DagsterInstance, table: TableConfig, pipe: TablePipeline, daemon: Service,
              log: Path) -> None:
    """The four steps of the module doc, against a running daemon and `snapshotter serve`."""
    # 1. Not ready: the supervisor's ingest run fills the buffer, nothing is archived yet.
    poll(lambda: True if (call(port, "/status").json() or [{}])[0].get("position") else None,
         SENSOR_DEADLINE_S, "a durable position in /status (the supervisor's ingest run)", daemon.log)
    down = call(port, "/health/ready")
    assert down.code == 503 and down.json()["tables"][0]["table"] == TABLE
    assert "no snapshot committed yet" in down.json()["tables"][0]["not_ready"]

    # 2. POST /snapshot (every table): a force_snapshot run the daemon runs; epoch 1; ready.
    assert force(port, instance, "", daemon.log) == 1
    poll(lambda: True if call(port, "/health/ready").code == 200 else None, 60, "readiness", log)
    manifest = pipe.manifest()
    status = poll(lambda: s if (s := call(port, "/status").json()[0])["artifacts"] == 1 else None, 30,
                  "/status after the snapshot", log)
    snap = manifest.artifacts[0]
    assert (status["epoch"], status["head_position"], status["last_snapshot_at"]) == \
           (manifest.epoch, manifest.head_position, snap.created_at) == (1, snap.to_position, snap.created_at)
    assert status["diffs_since_snapshot"] == 0 and status["ready"]

    # 3. SIGTERM to the ingest run's worker: sealed, CANCELED, the final diff requested and run.
    ingest = poll(lambda: started_ingest(instance), SENSOR_DEADLINE_S, "a started ingest run", daemon.log)
    pid = poll(lambda: worker_pid(instance, ingest.run_id), 30, "the ingest run's worker pid", daemon.log)
    poll(lambda: True if compare_lsn(BufferReader(table.buffer.path, TABLE).durable_position() or "",
                                     manifest.head_position) > 0 else None, 60,
         "changes buffered after the snapshot", daemon.log)
    before = BufferReader(table.buffer.path, TABLE).durable_position()
    assert before is not None
    os.kill(pid, signal.SIGTERM)
    ended = poll(lambda: ended_status(run_status(instance, ingest.run_id)), 60, "the end of the ingest run",
                 daemon.log)
    assert ended == dg.DagsterRunStatus.CANCELED
    final = poll(lambda: shutdown_diff(instance, manifest.head_position), 30, "the final diff run",
                 daemon.log)
    succeeded(instance, final.run_id, daemon.log)
    to = final.tags[TO_TAG]
    assert compare_lsn(to, before) >= 0, f"the final diff ends at {to}, before the acknowledged {before}"
    after = pipe.manifest()
    assert [(a.kind, a.from_position, a.to_position) for a in after.artifacts] == \
           [("snapshot", None, snap.to_position), ("diff", snap.to_position, to)]
    rebuilt_equals_source(table, to)
    text = poll(lambda: m if metric(m := call(port, "/metrics").text, "diffs_since_snapshot", TABLE) == 1.0
                else None, 30, "/metrics after the final diff", log)
    assert metric(text, "manifest_head_position", TABLE) == float(parse_lsn(to) or -1)

    # 4. POST /snapshot?table=: epoch 2, no diff since it.
    assert force(port, instance, f"?table={TABLE}", daemon.log) == 2
    text = poll(lambda: m if metric(m := call(port, "/metrics").text, "epoch", TABLE) == 2.0 else None, 30,
                "/metrics after the second snapshot", log)
    assert metric(text, "diffs_since_snapshot", TABLE) == 0.0
    head = pipe.manifest().head_position
    assert metric(text, "manifest_head_position", TABLE) == float(parse_lsn(head) or -1)
