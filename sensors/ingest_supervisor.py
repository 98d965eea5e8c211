"""Keeps one long-running ingest run alive per table: launches a table's when none is queued or running.

A sensor tick is too short to hold a replication stream, so ingestion is a run of its own, one per
table (snapshot_assets/jobs.py says why not one for all). When a table's run ends (a source outage
beyond the loop's own retries, a refused event, a crash) the next tick relaunches that table alone
and the buffer resumes from its durable position; the other tables' runs are not touched. After a
failed run the relaunch waits the table's `retry.backoff`, doubling with each failed run in a row
up to `retry.max_backoff`, so a table that cannot start is retried without a crash loop. Runs are
found by the `snapshotter/ingest_table` tag in Dagster's run records, so any daemon on any host sees
the same state. Failed ingest runs stay visible in the UI and reach the run-failure sensor.
"""

from __future__ import annotations

import time

import dagster as dg

from snapshot_assets.jobs import ingest_job
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.run_history import failure_streak, in_progress, last_ended
from snapshot_assets.tables import INGEST_TABLE_TAG, pipelines

LAUNCH_REASON_TAG = "snapshotter/launch_reason"


def consider(instance: dg.DagsterInstance, pipe: TablePipeline, now: float) -> dg.RunRequest | str:
    """The ingest run to launch for one table now, or why there is none."""
    tags = {INGEST_TABLE_TAG: pipe.name}
    alive = in_progress(instance, tags, ingest_job.name)
    if alive is not None:
        return f"ingest run {alive.run_id} is {alive.status.value}"
    streak = failure_streak(instance, tags, ingest_job.name)
    if streak.last is not None:
        failed = streak.last.dagster_run.run_id
        due = streak.retry_due(pipe.cfg.retry)
        if due > now:
            return f"restart {streak.failures} after failure of run {failed} is due in {due - now:.0f}s (backoff)"
        reason = f"restart {streak.failures} after failure of run {failed}"
    else:
        previous = last_ended(instance, tags, ingest_job.name)
        reason = "first start" if previous is None else \
            f"previous run {previous.dagster_run.run_id} ended {previous.dagster_run.status.value}"
    return dg.RunRequest(job_name=ingest_job.name, tags={**tags, LAUNCH_REASON_TAG: reason})


@dg.sensor(job=ingest_job, minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Keeps one ingest run per table alive: relaunches a table's run after it ended, "
                       "with backoff after failures.")
def ingest_supervisor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    now = time.time()
    requests: list[dg.RunRequest] = []
    skipped: list[str] = []
    for pipe in pipelines():
        outcome = consider(context.instance, pipe, now)
        if isinstance(outcome, dg.RunRequest):
            context.log.info(f"{pipe.name}: launching ingest ({outcome.tags[LAUNCH_REASON_TAG]})")
            requests.append(outcome)
        else:
            skipped.append(f"{pipe.name}: {outcome}")
    return dg.SensorResult(run_requests=requests, skip_reason=None if requests else "; ".join(skipped))
