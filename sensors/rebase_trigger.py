"""The re-base trigger: per table, diff or snapshot or nothing, from the buffer index and the manifest.

Each evaluation reads only the buffer's small index and the manifest (milliseconds), records an
observation of the table's `change_buffer` partition (durable position, buffered changes/bytes,
lag), applies the policy and requests at most one run per table. Run keys name the boundary
(`table:kind:from:to`) — never the bare table, since Dagster deduplicates run keys forever. A table
with a run in progress is skipped (one writer per table); each table's own `diff.interval` is
honoured through the cursor even though the sensor ticks at the shortest interval.
"""

import datetime as _dt
import json
from typing import Any

import dagster as dg

from snapshot_assets.jobs import diff_job, snapshot_job
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.tables import FROM_TAG, TABLE_TAG, TO_TAG, TRIGGER_TAG, config, pipelines

IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
               dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def busy(instance: dg.DagsterInstance, table: str) -> bool:
    runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": table}, statuses=IN_PROGRESS), limit=1)
    return bool(runs)


def observation(pipe: TablePipeline, head: str) -> tuple[dg.AssetObservation, Any]:
    stats = pipe.buffer().stats(head or None)
    metadata: dict[str, Any] = {
        "durable_position": stats.durable_position or "",
        "head_position": head,
        "buffered_changes": stats.changes,
        "buffered_bytes": stats.bytes,
        "distinct_keys_estimate": stats.distinct_keys_estimate,
        "resync_pending": stats.resync_pending,
        "oldest_change_age_s": round(stats.oldest_change_age_s or 0.0, 3),
        "last_seal_latency_s": round(stats.last_seal_latency_s or 0.0, 3),
    }
    return dg.AssetObservation(asset_key="change_buffer", partition=pipe.name, metadata=metadata), stats


def shortest_interval() -> int:
    return max(1, int(min(t.diff_interval.total_seconds() for t in config().tables)))


@dg.sensor(jobs=[diff_job, snapshot_job], minimum_interval_seconds=shortest_interval(),
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Applies each table's re-base policy to its buffer and manifest; "
                       "requests diff or snapshot runs.")
def rebase_trigger(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    last: dict[str, float] = json.loads(context.cursor) if context.cursor else {}
    now = _dt.datetime.now(_dt.UTC)
    requests, events = [], []
    for pipe in pipelines():
        m = pipe.manifest()
        obs, _stats = observation(pipe, m.head_position)
        events.append(obs)
        if busy(context.instance, pipe.name):
            continue
        if now.timestamp() - last.get(pipe.name, 0.0) < pipe.cfg.diff_interval.total_seconds():
            continue
        nxt = pipe.decide(now)
        if nxt.kind == "none":
            continue
        last[pipe.name] = now.timestamp()
        job = diff_job if nxt.kind == "diff" else snapshot_job
        requests.append(dg.RunRequest(
            run_key=f"{pipe.name}:{nxt.run_key}", job_name=job.name, partition_key=pipe.name,
            tags={TABLE_TAG: pipe.name, TRIGGER_TAG: nxt.trigger, FROM_TAG: nxt.from_position or "",
                  TO_TAG: nxt.to_position or ""}))
    return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(last))
