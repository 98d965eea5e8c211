"""The group_cut sensor, evaluated with `build_sensor_context` against a real instance.

The members' buffers are real change buffers written as a PostgreSQL source writes them (an
initial copy at its position, transaction ends, change-less ends from keepalives); the manifests
are on a real local destination (empty: nothing archived yet). Nothing connects to a database.
"""

from __future__ import annotations

import json
import time

import dagster as dg

from resources.subscribers.events import TxEnd
from sensors.group_cut import group_cut
from sensors.rebase_trigger import rebase_trigger
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.groups.jobs import CUT_TAG, GROUP_TAG, group_cut_job
from tests.groups.support import ACCOUNTS, TRANSFERS, feed, initial_copy
from tests.sensors.conftest import add_run, fail_run


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
