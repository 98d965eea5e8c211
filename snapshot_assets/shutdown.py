"""Graceful shutdown of the ingest service: the final artifact of every table with buffered changes.

laredo's writer flushes a final diff when it stops. Here a stopping ingest loop has already sealed
the buffer at the last transaction end (resources/ingest.py: `_settle`; the partial transaction is
re-sent by the source on restart), so everything acknowledged to the source is durable. What is
left is to get it into the archive without waiting for the next look of the re-base trigger: for
each table whose buffer is past its manifest head, the run the policy decides for (head, durable]
is submitted to the Dagster instance (launch.py) and the daemon runs it. It is a diff (trigger
`shutdown`), unless the policy says that only a snapshot may follow (the initial one, a resync, a
schema change) or that a re-base is due, exactly as the sensor would decide. The run carries the
sensor's tags (boundary, from/to, attempt 0), so it builds exactly that boundary, the re-base
trigger sees it as the table's run in progress (one writer per table), and a failure is retried
by the sensor like its own runs (`<boundary>:retry-N`).

A table that already has an artifact run queued or running gets no request: that run is the
table's one writer, and the trigger sensor follows up on what it does not cover. Without a
Dagster instance (`snapshotter ingest` with no DAGSTER_HOME) nothing can be submitted; the sealed
changes wait in the buffer for the trigger sensor or `snapshotter run --once --no-ingest`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import dagster as dg

from snapshot_assets.jobs import diff_job, snapshot_job
from snapshot_assets.launch import SubmitRun
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.run_history import in_progress
from snapshot_assets.tables import (
    ATTEMPT_TAG,
    BOUNDARY_TAG,
    FROM_TAG,
    PARTITION_TAG,
    TABLE_TAG,
    TO_TAG,
    TRIGGER_TAG,
    boundary,
)

log = logging.getLogger(__name__)

SHUTDOWN_TRIGGER = "shutdown"
JOBS = {"diff": diff_job.name, "snapshot": snapshot_job.name}



@dataclass(frozen=True)
class FinalRequest:
    """What the shutdown did for one table: the run it submitted (if any) and why."""

    table: str
    run_id: str | None
    detail: str


def request_final_artifacts(pipes: Iterable[TablePipeline], instance: dg.DagsterInstance,
                            submit: SubmitRun) -> list[FinalRequest]:
    """Submit the final artifact run of every table with buffered changes (module doc); never raises
    for one table's failure, so the others still get theirs."""
    out = []
    for pipe in pipes:
        try:
            request = _request(pipe, instance, submit)
        except Exception as e:  # a destination or the instance: reported, the other tables go on
            request = FinalRequest(pipe.name, None, f"no final run requested: {type(e).__name__}: {e}")
        log.info("%s: %s", pipe.name, request.detail)
        out.append(request)
    return out


def _request(pipe: TablePipeline, instance: dg.DagsterInstance, submit: SubmitRun) -> FinalRequest:
    running = in_progress(instance, {PARTITION_TAG: pipe.name})
    if running is not None:
        return FinalRequest(pipe.name, None, f"run {running.run_id} ({running.job_name}) is "
                                             f"{running.status.value}: the trigger sensor follows up after it")
    nxt = pipe.decide()
    if nxt.kind == "none":
        return FinalRequest(pipe.name, None, "nothing buffered after the manifest head")
    trigger = SHUTDOWN_TRIGGER if nxt.kind == "diff" else nxt.trigger
    tags = {PARTITION_TAG: pipe.name, TABLE_TAG: pipe.name, TRIGGER_TAG: trigger,
            FROM_TAG: nxt.from_position or "", TO_TAG: nxt.to_position or "",
            BOUNDARY_TAG: boundary(pipe.name, nxt), ATTEMPT_TAG: "0"}
    run_id = submit(JOBS[nxt.kind], tags)
    span = f"({nxt.from_position}, {nxt.to_position}]" if nxt.kind == "diff" else f"at {nxt.to_position}"
    return FinalRequest(pipe.name, run_id, f"final {nxt.kind} {span} ({trigger}) requested: run {run_id}")
