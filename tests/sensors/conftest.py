"""Sensor fixtures: a real two-table configuration, a real persistent Dagster instance, run records.

The configuration is the code location's own (`SNAPSHOTTER_CONFIG`, read through
snapshot_assets/tables.py, whose caches are reset around each test), with two generator tables
archived to a local directory: `public.users` looked at every second, `public.orders` every hour,
both retried after 2 s, doubling to at most 3 s. The instance is a temporary SQLite one
(`instance_for_test`), because `build_sensor_context` refuses an ephemeral instance and the sensors
read run records the way they do under the daemon.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import dagster as dg
import pytest

from snapshot_assets.config import SnapshotterConfig, load_config
from snapshot_assets.services import ingest_table
from tests.active_config import use_config
from tests.dagster_instances import checked_instance

__all__ = ["ORDERS", "USERS", "add_run", "fail_run", "ingest", "instance", "poll", "sensor_config"]

USERS = "public.users"
ORDERS = "public.orders"
T = TypeVar("T")


def write_config(root: Path, *, sinks: bool = False, users_rate: float | None = None, backoff: str = "2s",
                 max_backoff: str = "3s") -> Path:
    def events(name: str) -> str:
        return f'events = [ {{ type = file, path = "{root / "events" / name}.jsonl" }} ]' if sinks else ""

    pace = f", rate = {users_rate}" if users_rate else ""
    path = root / "snapshotter.conf"
    path.write_text(f"""
snapshotter {{
  buffer {{ path = "{root / 'buffer'}", seal_interval = 100ms }}
  tables = [
    {{ source {{ type = generator, schema = public, table = users
                generator {{ seed = 1, rows = 40, changes = 30{pace} }} }}
       diff.interval = 1s
       retry {{ backoff = {backoff}, max_backoff = {max_backoff} }}
       destinations = [ {{ type = local, path = "{root / 'archive'}" }} ]
       {events("users")} }}
    {{ source {{ type = generator, schema = public, table = orders, generator {{ seed = 2, rows = 20, changes = 10 }} }}
       diff.interval = 1h
       retry {{ backoff = {backoff}, max_backoff = {max_backoff} }}
       destinations = [ {{ type = local, path = "{root / 'archive'}" }} ]
       {events("orders")} }}
  ]
}}
""")
    return path


@pytest.fixture
def sensor_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SnapshotterConfig]:
    """The two-table configuration, active for the code location (sensors, jobs, status)."""
    yield from use_config(monkeypatch, write_config(tmp_path))


@pytest.fixture
def sink_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SnapshotterConfig]:
    """The same tables, each with a file event sink (`<tmp>/events/<table>.jsonl`)."""
    yield from use_config(monkeypatch, write_config(tmp_path, sinks=True))


@pytest.fixture
def paced_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SnapshotterConfig]:
    """The same tables, `public.users` paced at 3 changes/s (its ingest runs for about 10 s), backoff 6 s."""
    yield from use_config(monkeypatch, write_config(tmp_path, users_rate=3, backoff="6s", max_backoff="6s"))


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with checked_instance() as inst:
        yield inst


def ingest(cfg: SnapshotterConfig, table: str) -> str:
    """Run the table's (finite) generator into its buffer; the durable position it reached."""
    result = ingest_table(load_config(cfg.file, env={}).table(table), threading.Event())
    assert result.finished and result.durable_position is not None
    return result.durable_position


def add_run(instance: dg.DagsterInstance, job: str, tags: Mapping[str, str],
            status: dg.DagsterRunStatus = dg.DagsterRunStatus.STARTED) -> dg.DagsterRun:
    """A run record as the daemon would store it for a launched run (no process behind it)."""
    return instance.add_run(dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), tags=dict(tags), status=status))


def fail_run(instance: dg.DagsterInstance, run: dg.DagsterRun, message: str) -> dg.RunRecord:
    """Mark the run failed the way the instance records a run failure (status, end time, event)."""
    instance.report_run_failed(run, message=message)
    (record,) = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))
    assert record.dagster_run.status == dg.DagsterRunStatus.FAILURE
    return record


def poll(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f}s")
        time.sleep(0.05)
