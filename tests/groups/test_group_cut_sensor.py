"""The group_cut sensor, evaluated with `build_sensor_context` against a real instance.

The members' buffers are real change buffers written as a PostgreSQL source writes them (an
initial copy at its position, transaction ends, change-less ends from keepalives); the manifests
are on a real local destination (empty: nothing archived yet). Nothing connects to a database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from resources.buffer import ChangeBuffer
from resources.subscribers.events import Column, ResyncBegin, ResyncEnd, SchemaEvent, SnapshotRow, TableSchema, TxEnd
from sensors.group_cut import group_cut
from sensors.rebase_trigger import rebase_trigger
from snapshot_assets import tables
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.groups.jobs import CUT_TAG, GROUP_TAG, group_cut_job
from tests.sensors.conftest import add_run, fail_run

ACCOUNTS, TRANSFERS = "public.accounts", "public.transfers"


@pytest.fixture
def group_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SnapshotterConfig]:
    member = """{{ source {{ type = postgres, dsn = "host=127.0.0.1 dbname=bank", table = {t} }}
       diff.interval = 1s, retry {{ backoff = 1s, max_backoff = 1s }}
       destinations = [ {{ type = local, path = "{root}/archive" }} ] }}"""
    path = tmp_path / "snapshotter.conf"
    path.write_text(f"""snapshotter {{
  buffer {{ path = "{tmp_path / 'buffer'}" }}
  tables = [ {member.format(t="accounts", root=tmp_path)}, {member.format(t="transfers", root=tmp_path)} ]
  groups = [ {{ name = ledger, tables = [ accounts, transfers ] }} ]
}}""")
    monkeypatch.setenv("SNAPSHOTTER_CONFIG", str(path))
    tables.config.cache_clear()
    tables.pipeline.cache_clear()
    try:
        yield tables.config()
    finally:
        tables.config.cache_clear()
        tables.pipeline.cache_clear()


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def feed(cfg: SnapshotterConfig, table: str, *events: object) -> None:
    """Append events to the table's buffer as its ingest would, and seal."""
    t = cfg.table(table)
    with ChangeBuffer(t.buffer.path, t.name, seal_interval=0) as buffer:
        for event in events:
            buffer.append(event)  # type: ignore[arg-type]
        buffer.seal()


def initial_copy(table: str, position: str) -> list[object]:
    schema = TableSchema(table, (Column("id", "integer", False, True, 1, 1), Column("v", "bigint", ordinal=2)))
    return [SchemaEvent(schema), ResyncBegin("initial load"), SnapshotRow({"id": 1, "v": 10}), ResyncEnd(position, 1)]


def why(result: dg.SensorResult) -> str:
    reason = result.skip_reason
    return "" if reason is None else reason.skip_message or ""


def tick(instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    result = group_cut(dg.build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, dg.SensorResult)
    return result


def test_cut_waits_for_every_member_then_is_requested_once(group_config: SnapshotterConfig,
                                                          instance: dg.DagsterInstance) -> None:
    assert "public.accounts: nothing durable in its buffer yet" in why(tick(instance))

    feed(group_config, ACCOUNTS, *initial_copy(ACCOUNTS, "0/100"))
    feed(group_config, TRANSFERS, *initial_copy(TRANSFERS, "0/200"))
    held = why(tick(instance))
    assert "public.transfers: its initial copy is at 0/200, after 0/100" in held

    # The idle accounts table's ingest follows the source (a change-less transaction end).
    feed(group_config, ACCOUNTS, TxEnd("0/2FF"))
    feed(group_config, TRANSFERS, TxEnd("0/280"))
    result = tick(instance)
    (request,) = result.run_requests or []
    assert request.job_name == group_cut_job.name
    assert request.run_key == "ledger:cut:0/280:attempt-0"
    assert dict(request.tags) == {GROUP_TAG: "ledger", CUT_TAG: "ledger:cut:0/280"}
    assert request.run_config == {"ops": {"cut_group": {"config": {"group": "ledger"}}}}

    # Within diff.interval: not asked again; the members are the group's, not the re-base trigger's.
    assert "next look in" in why(tick(instance, result.cursor))
    trigger = rebase_trigger(dg.build_sensor_context(instance=instance))
    assert isinstance(trigger, dg.SensorResult)
    skipped = why(trigger)
    assert "public.accounts: in group ledger" in skipped and "public.transfers: in group ledger" in skipped


def test_one_run_per_group_and_a_failed_cut_retried_under_a_new_key(group_config: SnapshotterConfig,
                                                                   instance: dg.DagsterInstance) -> None:
    feed(group_config, ACCOUNTS, *initial_copy(ACCOUNTS, "0/100"), TxEnd("0/300"))
    feed(group_config, TRANSFERS, *initial_copy(TRANSFERS, "0/200"), TxEnd("0/300"))
    run = add_run(instance, group_cut_job.name, {GROUP_TAG: "ledger", CUT_TAG: "ledger:cut:0/300"})
    assert f"run {run.run_id} is STARTED" in why(tick(instance))

    fail_run(instance, run, "a member failed")
    old = json.dumps({"ledger": time.time() - 60})
    deadline = time.monotonic() + 10
    while not (result := tick(instance, old)).run_requests:  # the group's backoff (1 s) first
        assert "due in" in why(result)
        assert time.monotonic() < deadline, "the failed cut was not retried"
        time.sleep(0.2)
    (request,) = result.run_requests
    assert request.run_key == "ledger:cut:0/300:attempt-1"
