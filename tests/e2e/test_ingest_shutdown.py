"""Graceful shutdown of `snapshotter ingest`: SIGTERM seals the buffer and submits the final diff.

A real `snapshotter ingest` process (generator source, DAGSTER_HOME set, the workspace file) fills
the buffer; `snapshotter run --once --no-ingest` commits the first snapshot (the ingest paused
with SIGSTOP meanwhile, so the catch-up has a fixed target); more changes are acknowledged; then a
real SIGTERM. The process exits 0 at a durable position X at or past
everything acknowledged before the signal, and says which run it submitted: a `diff_job` run
queued in the instance for exactly (head, X] (trigger `shutdown`). Only then is `dagster-daemon`
started; it runs that queued run, and the archive rebuilt at X equals the source's table at X:
every change acknowledged before SIGTERM is in a committed diff.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from resources.buffer import BufferReader
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.config import load_config
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.tables import FROM_TAG, TO_TAG, TRIGGER_TAG
from tests.e2e.conftest import e2e_env
from tests.e2e.daemon_support import TABLE, rebuilt_equals_source, setup, start_daemon, succeeded
from tests.e2e.http_support import SNAPSHOTTER, poll
from tests.e2e.test_dagster_daemon import stop_service

pytestmark = pytest.mark.slow


def test_sigterm_to_snapshotter_ingest_submits_the_final_diff(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, workspace, config = setup(workdir)
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # this process reads the same instance
    (table,) = load_config(config, env={}).tables
    pipe = TablePipeline(table)
    env = e2e_env(DAGSTER_HOME=str(home), SNAPSHOTTER_CONFIG=str(config), PYTHONUNBUFFERED="1")
    buffer = BufferReader(table.buffer.path, TABLE)
    log = workdir / "ingest.log"
    with log.open("wb") as err:
        ingest = subprocess.Popen([SNAPSHOTTER, "ingest", "--config", str(config), "--workspace", str(workspace)],
                                  cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    try:
        poll(lambda: buffer.durable_position(), 60, "a durable position", log)
        ingest.send_signal(signal.SIGSTOP)  # `run --once` catches up with a buffer that stands still
        try:
            once = subprocess.run([SNAPSHOTTER, "run", "--once", "--no-ingest", "--config", str(config)],
                                  cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
        finally:
            ingest.send_signal(signal.SIGCONT)
        assert once.returncode == 0, once.stderr[-3000:]
        head = pipe.manifest().head_position
        poll(lambda: True if compare_lsn(buffer.durable_position() or "", head) > 0 else None, 60,
             "changes acknowledged after the snapshot", log)
        before = buffer.durable_position() or ""

        ingest.send_signal(signal.SIGTERM)
        out, _ = ingest.communicate(timeout=120)
    finally:
        if ingest.poll() is None:
            ingest.kill()
            ingest.wait()
    assert ingest.returncode == 0, log.read_text()[-3000:]
    line = out.decode().strip()
    stopped = re.fullmatch(rf"{re.escape(TABLE)}: stopped at (\S+); final diff \((\S+), (\S+)\] \(shutdown\) "
                           r"requested: run (\S+)", line)
    assert stopped is not None, line
    at, from_position, to_position, run_id = stopped.groups()
    durable = buffer.durable_position()
    assert at == to_position == durable and from_position == head, (line, durable)
    assert compare_lsn(at, before) >= 0, f"stopped at {at}, before the acknowledged {before}"

    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.job_name == "diff_job" and run.status == dg.DagsterRunStatus.QUEUED
        assert (run.tags[FROM_TAG], run.tags[TO_TAG], run.tags[TRIGGER_TAG]) == (head, at, "shutdown")

        daemon = start_daemon(workdir, workspace, env)
        try:
            succeeded(instance, run_id, daemon.log)
        finally:
            stop_service(daemon)
    manifest = pipe.manifest()
    assert [(a.kind, a.from_position, a.to_position) for a in manifest.artifacts][-1] == ("diff", head, at)
    rebuilt_equals_source(table, at)
