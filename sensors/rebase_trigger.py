"""The re-base trigger: per table, diff or snapshot or nothing, from the buffer index and the manifest.

Each evaluation reads only the buffer's small index and the manifest (milliseconds), records an
observation of the table's `change_buffer` partition (durable position, buffered changes/bytes,
lag), applies the policy and requests at most one run per table. A table with a run in progress
is skipped (one writer per table); each table's own `diff.interval` is honoured through the
cursor even though the sensor ticks at the shortest interval. A table whose manifest or buffer
cannot be read is skipped with the reason; the other tables go on.

Retries. Dagster deduplicates run keys forever, so a key that only names the boundary
(`table:kind:from:to`) would never run again once its run failed: a failed initial snapshot of a
quiet table (no new changes, so the same boundary every tick) would stall the table for good. The
run key therefore also carries the attempt: the first run of a boundary is keyed by the boundary
itself, a retry by `<boundary>:retry-N`, where N is one more than the attempt tag of the newest
failed (or canceled) run with that boundary's tag. Everything is read from Dagster's run records,
so any daemon on any host derives the same N, a run deleted from the history cannot make a key
collide with a newer one, and a boundary whose retry succeeded keeps that key (deduplicated:
never run twice).

The backoff counts the table's failed artifact runs in a row, not only the boundary's: on a busy
table each tick brings a new boundary, and a dead destination must not be hit every diff.interval.
After N failures in a row the next request waits `retry.backoff * 2**(N-1)` (at most
`retry.max_backoff`, both per table) from the end of the last failed run; until then the skip
reason says which retry is due when, and a retry's run carries `snapshotter/attempt` and
`snapshotter/retry_of` (the failed run) and logs "retry N of boundary B after failure of run X".

Diff size. `max_diff_bytes` / `max_diff_fraction` judge the encoded size of the diff that would be
written (policy rule), which only Spark can tell (pipeline/diff_size.py). The decision asks for it
only when it can change the outcome, so a tick opens a Spark session (the configured runtime: the
local Connect server by default, or `spark.remote`) only then, once for all tables, and stops it
at the end of the tick. A Spark Connect endpoint that does not answer would make the client retry
for about ten minutes: the session gives up after a few seconds instead (`MEASURE_RETRIES`), and
measuring shares one budget per tick (`MEASURE_BUDGET_S`, well inside Dagster's sensor timeout)
against a job that does not end. A sensor that cannot measure (no Spark reachable from the daemon's host, the
budget spent, a failing job) logs why and judges the buffer's bytes since the head instead: the
table keeps being archived, and its re-bases still come from the other triggers.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import Any

import dagster as dg

from resources.buffer import BufferStats
from resources.buffer.errors import ChangeBufferError
from resources.destinations.base import DestinationError
from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.jobs import diff_job, snapshot_job
from snapshot_assets.pipeline.decide import NextArtifact, next_artifact
from snapshot_assets.pipeline.diff_size import MeasuringSpark, diff_size
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.run_history import UNSUCCESSFUL, FailureStreak, failure_streak, in_progress
from snapshot_assets.tables import (
    ATTEMPT_TAG,
    BOUNDARY_TAG,
    FROM_TAG,
    PARTITION_TAG,
    RETRY_OF_TAG,
    TABLE_TAG,
    TO_TAG,
    TRIGGER_TAG,
    boundary,
    config,
    pipelines,
)


def busy(instance: dg.DagsterInstance, table: str) -> dg.DagsterRun | None:
    """The run in progress for the table (any artifact job, forced snapshots included), if any."""
    return in_progress(instance, {PARTITION_TAG: table})


def observation(pipe: TablePipeline, head: str) -> tuple[dg.AssetObservation, BufferStats]:
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


@dataclass(frozen=True)
class Attempt:
    """One try at a boundary: which one it is, what it follows, and when the table's backoff ends."""

    boundary: str
    number: int  # 0 for the first run of the boundary, N for its Nth retry
    retry_of: dg.DagsterRun | None  # the newest failed run of this boundary
    streak: FailureStreak  # the table's failed artifact runs in a row
    due: float  # unix time from which it may start

    @property
    def run_key(self) -> str:
        return self.boundary if self.number == 0 else f"{self.boundary}:retry-{self.number}"

    def describe(self) -> str:
        if self.retry_of is not None:
            return f"retry {self.number} of boundary {self.boundary} after failure of run {self.retry_of.run_id}"
        if self.streak.last is not None:
            return (f"boundary {self.boundary} after {self.streak.failures} failed run(s) of the table in a row "
                    f"(last: run {self.streak.last.dagster_run.run_id})")
        return f"boundary {self.boundary}"

    def tags(self) -> dict[str, str]:
        tags = {BOUNDARY_TAG: self.boundary, ATTEMPT_TAG: str(self.number)}
        if self.retry_of is not None:
            tags[RETRY_OF_TAG] = self.retry_of.run_id
        return tags


def attempt(instance: dg.DagsterInstance, pipe: TablePipeline, nxt: NextArtifact) -> Attempt:
    """The attempt at `nxt`'s boundary that is due, derived from the run records alone (module doc)."""
    key = boundary(pipe.name, nxt)
    failed = instance.get_run_records(dg.RunsFilter(tags={BOUNDARY_TAG: key}, statuses=UNSUCCESSFUL), limit=1)
    previous = failed[0].dagster_run if failed else None
    number = 0
    if previous is not None:
        tag = previous.tags.get(ATTEMPT_TAG, "0")
        number = (int(tag) if tag.isdigit() else 0) + 1
    streak = failure_streak(instance, {TABLE_TAG: pipe.name})
    return Attempt(key, number, previous, streak, streak.retry_due(pipe.cfg.retry))


def shortest_interval() -> int:
    return max(1, int(min(t.diff_interval.total_seconds() for t in config().tables)))


def consider(context: dg.SensorEvaluationContext, pipe: TablePipeline, last: dict[str, float],
             now: _dt.datetime, events: list[dg.AssetObservation], spark: MeasuringSpark) -> dg.RunRequest | str:
    """The run to request for one table now, or why there is none."""
    try:
        m = pipe.manifest()
        obs, stats = observation(pipe, m.head_position)
    except (DestinationError, ArchiveError, ChangeBufferError, OSError) as e:
        return f"cannot read the manifest or the buffer: {e}"
    events.append(obs)
    if pipe.cfg.group:
        return f"in group {pipe.cfg.group}: archived by its cuts (group_cut sensor)"
    running = busy(context.instance, pipe.name)
    if running is not None:
        return f"run {running.run_id} ({running.job_name}) is {running.status.value}"
    wait = last.get(pipe.name, 0.0) + pipe.cfg.diff_interval.total_seconds() - now.timestamp()
    if wait > 0:
        return f"next look in {wait:.0f}s (diff.interval)"
    nxt = next_artifact(m, stats, pipe.cfg.policy, now, diff_size=diff_size(pipe, spark, stats.bytes, context.log),
                        snapshot_format=pipe.cfg.snapshot_formats[0])
    if nxt.kind == "none":
        return "nothing to do"
    tried = attempt(context.instance, pipe, nxt)
    if tried.due > now.timestamp():
        return f"{tried.describe()} is due in {tried.due - now.timestamp():.0f}s (backoff)"
    if tried.retry_of is not None or tried.streak.last is not None:
        context.log.info(f"{pipe.name}: {tried.describe()}")
    last[pipe.name] = now.timestamp()
    job = diff_job if nxt.kind == "diff" else snapshot_job
    return dg.RunRequest(
        run_key=tried.run_key, job_name=job.name, partition_key=pipe.name,
        tags={TABLE_TAG: pipe.name, TRIGGER_TAG: nxt.trigger, FROM_TAG: nxt.from_position or "",
              TO_TAG: nxt.to_position or "", **tried.tags()})


@dg.sensor(jobs=[diff_job, snapshot_job], minimum_interval_seconds=shortest_interval(),
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Applies each table's re-base policy to its buffer and manifest; requests diff or "
                       "snapshot runs, and retries a failed boundary with backoff.")
def rebase_trigger(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    last: dict[str, float] = json.loads(context.cursor) if context.cursor else {}
    now = _dt.datetime.now(_dt.UTC)
    requests: list[dg.RunRequest] = []
    events: list[dg.AssetObservation] = []
    skipped: list[str] = []
    spark = MeasuringSpark(config().spark)
    try:
        for pipe in pipelines():
            outcome = consider(context, pipe, last, now, events, spark)
            if isinstance(outcome, dg.RunRequest):
                requests.append(outcome)
            else:
                skipped.append(f"{pipe.name}: {outcome}")
    finally:
        spark.close()
    return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(last),
                           skip_reason=None if requests else "; ".join(skipped))
