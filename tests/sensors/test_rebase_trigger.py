"""The re-base trigger sensor, evaluated with `build_sensor_context` against a real instance.

Buffers are filled by the real ingest loop from finite generators, manifests live on a real local
destination, and runs are real records in the instance. The tables are quiet after ingest (their
buffers never change), which is the case a forever-deduplicated boundary run key used to stall.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from sensors.rebase_trigger import rebase_trigger
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.jobs import snapshot_job
from snapshot_assets.metrics import samples
from snapshot_assets.status import table_status
from snapshot_assets.tables import (
    ATTEMPT_TAG,
    BOUNDARY_TAG,
    FROM_TAG,
    RETRY_OF_TAG,
    TABLE_TAG,
    TO_TAG,
    TRIGGER_TAG,
    pipeline,
)
from tests.sensors.conftest import ORDERS, USERS, add_run, fail_run, ingest, poll

RUN_KEY_TAG = "dagster/run_key"


def tick(instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    result = rebase_trigger(dg.build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, dg.SensorResult)
    return result


def by_table(result: dg.SensorResult) -> dict[str, dg.RunRequest]:
    return {r.partition_key: r for r in result.run_requests or [] if r.partition_key}


def launched(instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.DagsterRun:
    """What the daemon stores for a request: a run of its job with its tags and run key."""
    assert request.job_name is not None and request.partition_key is not None and request.run_key is not None
    return add_run(instance, request.job_name, {**request.tags, "dagster/partition": request.partition_key,
                                                RUN_KEY_TAG: request.run_key})


def old_cursor(**ages_s: float) -> str:
    """A cursor saying each table was last requested this many seconds ago."""
    now = time.time()
    return json.dumps({table: now - age for table, age in ages_s.items()})


def test_first_tick_requests_each_tables_initial_snapshot_keyed_by_its_boundary(
        sensor_config: SnapshotterConfig, instance: dg.DagsterInstance) -> None:
    heads = {USERS: ingest(sensor_config, USERS), ORDERS: ingest(sensor_config, ORDERS)}
    result = tick(instance)
    requests = by_table(result)
    assert set(requests) == {USERS, ORDERS}
    for table, request in requests.items():
        boundary = f"{table}:snapshot:-:{heads[table]}"
        assert request.job_name == snapshot_job.name
        assert request.run_key == boundary
        tags: dict[str, Any] = dict(request.tags)
        assert tags[TABLE_TAG] == table and tags[TRIGGER_TAG] == "initial"
        assert (tags[FROM_TAG], tags[TO_TAG]) == ("", heads[table])
        assert (tags[BOUNDARY_TAG], tags[ATTEMPT_TAG]) == (boundary, "0")
        assert RETRY_OF_TAG not in tags
    observed = {e.partition: e.metadata["durable_position"].value for e in result.asset_events or []}
    assert observed == heads
    assert set(json.loads(result.cursor or "{}")) == {USERS, ORDERS}


def test_each_table_is_looked_at_on_its_own_diff_interval(sensor_config: SnapshotterConfig,
                                                          instance: dg.DagsterInstance) -> None:
    ingest(sensor_config, USERS)
    ingest(sensor_config, ORDERS)
    # users (diff.interval 1s) is due again after 5 s; orders (1h) is not.
    result = tick(instance, old_cursor(**{USERS: 5, ORDERS: 5}))
    assert set(by_table(result)) == {USERS}
    cursor = json.loads(result.cursor or "{}")
    assert cursor[USERS] > time.time() - 5 and cursor[ORDERS] < time.time() - 4
    # Right after a request, users is inside its interval too: nothing, and the reason says why.
    again = tick(instance, result.cursor)
    assert not again.run_requests
    assert isinstance(again.skip_reason, dg.SkipReason) and again.skip_reason.skip_message is not None
    assert f"{USERS}: next look in" in again.skip_reason.skip_message
    assert f"{ORDERS}: next look in" in again.skip_reason.skip_message


def test_a_busy_table_is_skipped_and_the_others_go_on(sensor_config: SnapshotterConfig,
                                                      instance: dg.DagsterInstance) -> None:
    ingest(sensor_config, USERS)
    ingest(sensor_config, ORDERS)
    running = add_run(instance, "force_snapshot", {"dagster/partition": USERS})
    result = tick(instance)
    assert set(by_table(result)) == {ORDERS}
    assert USERS not in json.loads(result.cursor or "{}"), "a skipped table must be looked at on the next tick"
    instance.report_run_canceled(running)
    assert set(by_table(tick(instance, result.cursor))) == {USERS}


@pytest.mark.slow  # waits out two real backoffs (2 s, then 3 s)
def test_a_failed_snapshot_of_a_quiet_table_is_retried_with_attempt_numbers_and_backoff(
        sensor_config: SnapshotterConfig, instance: dg.DagsterInstance) -> None:
    head = ingest(sensor_config, USERS)
    boundary = f"{USERS}:snapshot:-:{head}"
    first = by_table(tick(instance))[USERS]
    assert first.run_key == boundary
    run = launched(instance, first)
    failed = fail_run(instance, run, "s3 put failed: endpoint unreachable")

    # The table has not changed: the same boundary, now as retry 1, after the 2 s backoff.
    waiting = tick(instance, old_cursor(**{USERS: 60}))
    assert USERS not in by_table(waiting)
    assert isinstance(waiting.skip_reason, dg.SkipReason)
    assert f"retry 1 of boundary {boundary} after failure of run {run.run_id} is due in" in str(
        waiting.skip_reason.skip_message)
    retry = poll(lambda: by_table(tick(instance, old_cursor(**{USERS: 60}))).get(USERS), 5, "retry request")
    assert failed.end_time is not None and time.time() >= failed.end_time + 2
    assert retry.run_key == f"{boundary}:retry-1"
    assert (retry.tags[BOUNDARY_TAG], retry.tags[ATTEMPT_TAG], retry.tags[RETRY_OF_TAG]) == (boundary, "1", run.run_id)
    assert (retry.tags[FROM_TAG], retry.tags[TO_TAG]) == ("", head)

    # The retry fails too: retry 2 waits twice as long, capped by max_backoff (3 s), from the end of that failure.
    second = fail_run(instance, launched(instance, retry), "s3 put failed again")
    assert second.end_time is not None
    waiting = tick(instance, old_cursor(**{USERS: 60}))
    assert f"retry 2 of boundary {boundary} after failure of run {second.dagster_run.run_id}" in str(
        waiting.skip_reason.skip_message if isinstance(waiting.skip_reason, dg.SkipReason) else "")
    again = poll(lambda: by_table(tick(instance, old_cursor(**{USERS: 60}))).get(USERS), 6, "second retry request")
    assert time.time() >= second.end_time + 3
    assert again.run_key == f"{boundary}:retry-2" and again.tags[ATTEMPT_TAG] == "2"

    # Once a retry succeeded its key is the one Dagster already holds: requesting it again is a no-op.
    done = launched(instance, again)
    instance.report_dagster_event(dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_SUCCESS.value,
                                                  job_name=done.job_name, message="committed"), run_id=done.run_id)
    assert by_table(tick(instance, old_cursor(**{USERS: 60})))[USERS].run_key == f"{boundary}:retry-2"


def test_a_canceled_run_is_retried_at_once_under_a_new_key(sensor_config: SnapshotterConfig,
                                                          instance: dg.DagsterInstance) -> None:
    ingest(sensor_config, ORDERS)
    first = by_table(tick(instance))[ORDERS]
    run = launched(instance, first)
    instance.report_run_canceled(run)
    retry = by_table(tick(instance, old_cursor(**{ORDERS: 7200})))[ORDERS]
    assert retry.run_key == f"{first.run_key}:retry-1" and retry.tags[RETRY_OF_TAG] == run.run_id


def test_failures_in_a_row_back_off_a_new_boundary_too(sensor_config: SnapshotterConfig,
                                                       instance: dg.DagsterInstance) -> None:
    """A busy table with a dead destination brings a new boundary every tick: it must still back off."""
    ingest(sensor_config, USERS)
    stale = add_run(instance, snapshot_job.name, {TABLE_TAG: USERS, BOUNDARY_TAG: f"{USERS}:snapshot:-:0/1",
                                                  ATTEMPT_TAG: "0"})
    fail_run(instance, stale, "destination down")
    result = tick(instance)
    assert USERS not in by_table(result)
    assert isinstance(result.skip_reason, dg.SkipReason)
    assert f"after 1 failed run(s) of the table in a row (last: run {stale.run_id}) is due in" in str(
        result.skip_reason.skip_message)
    # status and metrics say the same: not ready (no snapshot yet), why, and when the retry comes.
    status = table_status(pipeline(USERS), instance=instance)
    assert status.artifact_failures == 1 and not status.ready
    assert status.artifact_retry.startswith(f"run {stale.run_id} failed (1 in a row): destination down; retry due")
    assert f"no snapshot committed yet (the last run {stale.run_id} failed" in status.not_ready[0]
    assert {s.name: s.value for s in samples(status)}["artifact_failures"] == 1
    request = poll(lambda: by_table(tick(instance)).get(USERS), 5, "request after the backoff")
    assert request.tags[ATTEMPT_TAG] == "0" and RETRY_OF_TAG not in request.tags


def test_an_unreadable_table_is_reported_and_does_not_stop_the_others(sensor_config: SnapshotterConfig,
                                                                      instance: dg.DagsterInstance) -> None:
    ingest(sensor_config, USERS)
    ingest(sensor_config, ORDERS)
    archive = Path(sensor_config.table(ORDERS).destinations[0]["path"])
    (archive / "orders").mkdir(parents=True)
    (archive / "orders" / "manifest.json").write_text('{"manifest_version": 1, "artifacts": [')  # cut short
    quiet = tick(instance, old_cursor(**{USERS: 0}))
    assert not quiet.run_requests and isinstance(quiet.skip_reason, dg.SkipReason)
    assert f"{ORDERS}: cannot read the manifest or the buffer:" in str(quiet.skip_reason.skip_message)
    result = tick(instance)
    assert set(by_table(result)) == {USERS}
    assert {e.partition for e in result.asset_events or []} == {USERS}
