"""One ingest run per table: the supervisor sensor, the ingest job, and what status and metrics say.

Ingest runs here are real runs of the real `ingest_job` (executed in process against the temporary
instance, as the daemon's run worker would): a finite generator ends its run with SUCCESS, and a
table whose buffer folder is blocked by a file fails its run for real, while the other table's run
is in progress on another thread.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from sensors.ingest_supervisor import LAUNCH_REASON_TAG, ingest_supervisor
from snapshot_assets.config import SnapshotterConfig
from snapshot_assets.definitions import defs
from snapshot_assets.jobs import ingest_job
from snapshot_assets.metrics import samples
from snapshot_assets.status import TableStatus, table_status
from snapshot_assets.tables import INGEST_TABLE_TAG, pipeline
from tests.sensors.conftest import ORDERS, USERS, add_run, poll


def tick(instance: dg.DagsterInstance) -> dg.SensorResult:
    result = ingest_supervisor(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SensorResult)
    return result


def requested(result: dg.SensorResult) -> dict[str, dg.RunRequest]:
    return {r.tags[INGEST_TABLE_TAG]: r for r in result.run_requests or []}


def run_ingest(instance: dg.DagsterInstance, tags: dict[str, str]) -> dg.ExecuteInProcessResult:
    """Execute the ingest job for a request's tags, as the run worker launched for it would (the code
    location's job, on its registered subscriber and change buffer resources)."""
    job = defs.resolve_job_def(ingest_job.name)
    return job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)


def metric(status: TableStatus, name: str) -> float:
    (value,) = [s.value for s in samples(status) if s.name == name]
    return value


def test_first_tick_launches_one_ingest_run_per_table(sensor_config: SnapshotterConfig,
                                                      instance: dg.DagsterInstance) -> None:
    requests = requested(tick(instance))
    assert set(requests) == {USERS, ORDERS}
    for table, request in requests.items():
        assert request.job_name == ingest_job.name
        assert request.tags == {INGEST_TABLE_TAG: table, LAUNCH_REASON_TAG: "first start"}


@pytest.mark.slow  # real ingest runs, one of them paced (10 s), and a real 6 s restart backoff
def test_one_tables_failed_ingest_is_visible_and_restarted_alone(paced_config: SnapshotterConfig,
                                                                  instance: dg.DagsterInstance) -> None:
    requests = requested(tick(instance))
    # orders cannot open its buffer (a file where its folder must be): its run fails for real.
    blocker = Path(paced_config.table(ORDERS).buffer.path) / ORDERS
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    failed = run_ingest(instance, dict(requests[ORDERS].tags))
    assert not failed.success
    # users' run is live (its paced generator takes about 10 s) while the supervisor looks.
    users = threading.Thread(target=run_ingest, args=(instance, dict(requests[USERS].tags)), name="users-ingest")
    users.start()
    try:
        live = poll(lambda: instance.get_run_records(dg.RunsFilter(
            tags={INGEST_TABLE_TAG: USERS}, statuses=[dg.DagsterRunStatus.STARTED]), limit=1) or None, 30,
            "the users ingest run to start")
        users_run = live[0].dagster_run

        result = tick(instance)
        assert not result.run_requests, "nothing is due: users runs, orders waits for its backoff"
        assert isinstance(result.skip_reason, dg.SkipReason)
        reason = str(result.skip_reason.skip_message)
        assert f"{USERS}: ingest run {users_run.run_id} is STARTED" in reason
        assert f"{ORDERS}: restart 1 after failure of run {failed.run_id} is due in" in reason

        # status and metrics: orders is not ready and says why; users is alive.
        down = table_status(pipeline(ORDERS), instance=instance)
        assert not down.ready and not down.ingest_alive and down.ingest_failures == 1
        assert f"the ingest run {failed.run_id} failed (1 in a row): ingest of {ORDERS} failed:" in down.ingest
        assert "relaunch due in" in down.ingest
        assert any(r.startswith("ingest is not running: the ingest run") for r in down.not_ready)
        assert metric(down, "ingest_failures") == 1 and metric(down, "ingest_alive") == 0
        up = table_status(pipeline(USERS), instance=instance)
        assert up.ingest_alive and up.ingest_failures == 0 and metric(up, "ingest_alive") == 1

        # After the backoff the supervisor relaunches orders alone.
        restart = poll(lambda: requested(tick(instance)).get(ORDERS), 15, "the orders restart request")
        assert set(requested(tick(instance))) == {ORDERS}
        assert restart.tags[LAUNCH_REASON_TAG] == f"restart 1 after failure of run {failed.run_id}"
    finally:
        users.join(timeout=60)
    assert not users.is_alive()
    (users_record,) = instance.get_run_records(dg.RunsFilter(run_ids=[users_run.run_id]))
    assert users_record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, "users' run was left alone"
    blocker.unlink()
    restarted = run_ingest(instance, dict(restart.tags))
    assert restarted.success
    after = table_status(pipeline(ORDERS), instance=instance)
    assert after.ingest_failures == 0 and metric(after, "ingest_failures") == 0
    assert after.durable_position is not None


def test_an_ingest_run_without_a_table_fails_naming_the_tag(sensor_config: SnapshotterConfig,
                                                             instance: dg.DagsterInstance) -> None:
    result = run_ingest(instance, {})
    assert not result.success
    (event,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert event.step_failure_data is not None and event.step_failure_data.user_failure_data is not None
    text = event.step_failure_data.user_failure_data.description or ""
    assert INGEST_TABLE_TAG in text and USERS in text and ORDERS in text


def test_a_run_in_progress_is_never_doubled_and_an_ended_one_is_relaunched(sensor_config: SnapshotterConfig,
                                                                         instance: dg.DagsterInstance) -> None:
    starting = add_run(instance, ingest_job.name, {INGEST_TABLE_TAG: USERS}, dg.DagsterRunStatus.STARTING)
    ended = add_run(instance, ingest_job.name, {INGEST_TABLE_TAG: ORDERS}, dg.DagsterRunStatus.STARTED)
    instance.report_run_canceled(ended)
    start = time.time()
    requests = requested(tick(instance))
    assert set(requests) == {ORDERS}, f"{USERS}'s run {starting.run_id} is starting"
    assert requests[ORDERS].tags[LAUNCH_REASON_TAG] == f"previous run {ended.run_id} ended CANCELED"
    assert time.time() - start < 2, "a canceled run (an operator's stop) is relaunched without backoff"
