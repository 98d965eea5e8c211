"""The group cut trigger: per co-refresh group, request a `group_cut` run when a cut is due.

Each evaluation plans the group's next cut from its members' manifests and buffer indexes
(groups/plan.py, milliseconds) and requests at most one run per group, every group's own
`diff.interval` apart (the cursor keeps when each group was last asked). A group with a cut run in
progress is skipped (one writer per group; the members are left to it: the re-base trigger skips
tables that belong to a group). A plan that is held back (a member's ingest behind, a member's
initial copy after the watermark, nothing new) is the skip reason.

Retries. A failed or killed cut run publishes nothing (groups/cut.py); its run key names the cut
(`group:cut:position`) plus the attempt, one more than the number of unsuccessful runs that carry
the cut's tag, so a retry of the same cut is never deduplicated away, and after
`retry.backoff * 2**(N-1)` of the group's first member (at most `retry.max_backoff`) following N
failures in a row the next attempt is requested.
"""

from __future__ import annotations

import datetime as _dt
import json

import dagster as dg

from resources.buffer.errors import ChangeBufferError
from resources.destinations.base import DestinationError
from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.groups.cut import GroupPipeline
from snapshot_assets.groups.jobs import CUT_TAG, GROUP_TAG, group_cut_job
from snapshot_assets.groups.plan import Hold
from snapshot_assets.run_history import UNSUCCESSFUL, failure_streak, in_progress
from snapshot_assets.tables import config, pipeline


def shortest_interval() -> int:
    groups = config().groups
    return max(1, int(min((g.diff_interval.total_seconds() for g in groups), default=30)))


def consider(context: dg.SensorEvaluationContext, name: str, last: dict[str, float],
             now: _dt.datetime) -> dg.RunRequest | str:
    """The cut run to request for group `name` now, or why there is none."""
    group_cfg = config().group(name)
    running = in_progress(context.instance, {GROUP_TAG: name})
    if running is not None:
        return f"run {running.run_id} is {running.status.value}"
    wait = last.get(name, 0.0) + group_cfg.diff_interval.total_seconds() - now.timestamp()
    if wait > 0:
        return f"next look in {wait:.0f}s (diff.interval)"
    group = GroupPipeline(group_cfg, [pipeline(t) for t in group_cfg.tables])
    try:
        plan = group.plan(now)
    except (DestinationError, ArchiveError, ChangeBufferError, OSError) as e:
        return f"cannot read a manifest or a buffer: {e}"
    if isinstance(plan, Hold):
        return plan.reason
    streak = failure_streak(context.instance, {GROUP_TAG: name})
    due = streak.retry_due(group.members[0].cfg.retry)
    if due > now.timestamp():
        return f"cut at {plan.position} is due in {due - now.timestamp():.0f}s after {streak.failures} failure(s)"
    cut = f"{name}:{plan.run_key}"
    failed = context.instance.get_run_records(dg.RunsFilter(tags={CUT_TAG: cut}, statuses=UNSUCCESSFUL))
    last[name] = now.timestamp()
    return dg.RunRequest(run_key=f"{cut}:attempt-{len(failed)}", job_name=group_cut_job.name,
                         run_config={"ops": {"cut_group": {"config": {"group": name}}}},
                         tags={GROUP_TAG: name, CUT_TAG: cut})


@dg.sensor(jobs=[group_cut_job], minimum_interval_seconds=shortest_interval(),
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Requests a cut run per co-refresh group when its members can reach a new common position.")
def group_cut(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    last: dict[str, float] = json.loads(context.cursor) if context.cursor else {}
    now = _dt.datetime.now(_dt.UTC)
    requests: list[dg.RunRequest] = []
    skipped: list[str] = []
    for group in config().groups:
        outcome = consider(context, group.name, last, now)
        if isinstance(outcome, dg.RunRequest):
            requests.append(outcome)
        else:
            skipped.append(f"{group.name}: {outcome}")
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(last),
                           skip_reason=None if requests else "; ".join(skipped) or "no group configured")
