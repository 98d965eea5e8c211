"""Keeps the long-running ingest run alive: launches one when none is queued or running.

A sensor tick is too short to hold a replication stream, so ingestion is a run of its own; when it
fails (source outage beyond its retries, a crash) the next tick relaunches it, and the buffer
resumes from its durable position. Failed ingest runs stay visible in the UI and reach any
run-failure sensor.
"""

import dagster as dg

from sensors.rebase_trigger import IN_PROGRESS
from snapshot_assets.jobs import ingest_job


@dg.sensor(job=ingest_job, minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Launches the ingest run when none is queued or running (relaunches it after a failure).")
def ingest_supervisor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    alive = context.instance.get_run_records(
        dg.RunsFilter(job_name=ingest_job.name, statuses=IN_PROGRESS), limit=1)
    if alive:
        return dg.SkipReason(f"ingest run {alive[0].dagster_run.run_id} is {alive[0].dagster_run.status.value}")
    previous = context.instance.get_run_records(dg.RunsFilter(job_name=ingest_job.name), limit=1)
    reason = "first start" if not previous else f"previous run ended {previous[0].dagster_run.status.value}"
    return dg.RunRequest(tags={"snapshotter/launch_reason": reason})
