"""What the sensors and `status` read back from run records: failure messages and failure streaks."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from resources.destinations.base import DestinationError
from snapshot_assets.config import RetryConfig
from snapshot_assets.run_history import failure_message, failure_streak
from tests.sensors.conftest import add_run, fail_run


@dg.op
def upload() -> None:
    try:
        raise NotADirectoryError(20, "Not a directory", "/archive/quiet/epoch=1/snapshot-0_1.jsonl")
    except OSError as e:
        raise DestinationError(f"local put file:///archive/quiet/epoch=1/snapshot-0_1.jsonl failed: {e}") from e


@dg.job(name="snapshot_job")
def failing() -> None:
    upload()


def test_the_message_is_the_ops_own_exception_in_one_line(instance: dg.DagsterInstance) -> None:
    result = failing.execute_in_process(instance=instance, raise_on_error=False)
    text = failure_message(instance, result.run_id)
    path = "/archive/quiet/epoch=1/snapshot-0_1.jsonl"
    assert text == (f"resources.destinations.base.DestinationError: local put file://{path} failed: "
                    f"[Errno 20] Not a directory: '{path}'")


def test_the_message_is_bounded(instance: dg.DagsterInstance) -> None:
    run = add_run(instance, "ingest_job", {})
    fail_run(instance, run, "x" * 10_000)
    text = failure_message(instance, run.run_id)
    assert len(text) == 500 and text.endswith("…")


def test_a_streak_counts_failures_until_a_success_or_a_cancel(instance: dg.DagsterInstance) -> None:
    tags = {"snapshotter/table": "public.t"}
    canceled = add_run(instance, "diff_job", tags)
    instance.report_run_canceled(canceled)
    assert failure_streak(instance, tags).failures == 0
    records = [fail_run(instance, add_run(instance, "diff_job", tags), f"failure {i}") for i in range(3)]
    add_run(instance, "diff_job", tags)  # in progress: not part of the streak
    streak = failure_streak(instance, tags)
    assert streak.failures == 3 and streak.last is not None
    assert streak.last.dagster_run.run_id == records[-1].dagster_run.run_id
    end = records[-1].end_time
    assert end is not None
    retry = RetryConfig(dt.timedelta(seconds=30), dt.timedelta(seconds=90))
    assert streak.retry_due(retry) == end + 90  # 30 s * 2**2 = 120 s, capped at 90 s
    assert failure_streak(instance, {"snapshotter/table": "public.other"}).failures == 0
