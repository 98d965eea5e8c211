"""Dagster run records read back: what is in progress for a table, how its runs have been failing.

The sensors and `snapshotter status` keep no memory of their own about failures: everything is
derived from the run records in the Dagster instance's storage, found by the tags the sensors put
on the runs they request (snapshot_assets/tables.py). So the answer is the same whichever host
evaluates a sensor or asks for the status, a daemon restart forgets nothing, and an operator
sees the same facts in the UI (filter runs by the tag).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import dagster as dg

from snapshot_assets.config import RetryConfig
from snapshot_assets.redaction import redact

INGEST_JOB = "ingest_job"
IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
               dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
UNSUCCESSFUL = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
ENDED = [dg.DagsterRunStatus.SUCCESS, *UNSUCCESSFUL]
# Failures in a row looked at: beyond this many the backoff has long reached retry.max_backoff
# (2**31 times retry.backoff), so reading further back would change nothing.
STREAK_LOOKBACK = 32
_MESSAGE_LIMIT = 500


def in_progress(instance: dg.DagsterInstance, tags: Mapping[str, str], job: str | None = None) -> dg.DagsterRun | None:
    """A queued or running run with these tags (of `job`), if any."""
    records = instance.get_run_records(dg.RunsFilter(job_name=job, tags=dict(tags), statuses=IN_PROGRESS), limit=1)
    return records[0].dagster_run if records else None


def last_ended(instance: dg.DagsterInstance, tags: Mapping[str, str], job: str | None = None) -> dg.RunRecord | None:
    records = instance.get_run_records(dg.RunsFilter(job_name=job, tags=dict(tags), statuses=ENDED), limit=1)
    return records[0] if records else None


def ended_at(record: dg.RunRecord) -> float:
    """When the run ended (unix time); the record's last update for runs marked ended from outside."""
    return record.end_time if record.end_time is not None else record.update_timestamp.timestamp()


@dataclass(frozen=True)
class FailureStreak:
    """The failed runs in a row among the newest ended runs with some tags (a success or a cancel ends it)."""

    failures: int
    last: dg.RunRecord | None  # the newest failed run of the streak

    def retry_due(self, retry: RetryConfig) -> float:
        """When (unix time) the next run may start: the last failure's end plus the backoff."""
        if self.last is None:
            return 0.0
        return ended_at(self.last) + retry.delay(self.failures).total_seconds()


def failure_streak(instance: dg.DagsterInstance, tags: Mapping[str, str], job: str | None = None) -> FailureStreak:
    records = instance.get_run_records(dg.RunsFilter(job_name=job, tags=dict(tags), statuses=ENDED),
                                       limit=STREAK_LOOKBACK)
    failures = 0
    for record in records:
        if record.dagster_run.status != dg.DagsterRunStatus.FAILURE:
            break
        failures += 1
    return FailureStreak(failures, records[0] if failures else None)


def failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    """Why a run failed, in one line: the failed step's error (a `dg.Failure`'s description, or the
    exception the op raised), else the run's failure message. Bounded, so a huge error cannot flood
    a status page or an alert, and redacted: drivers quote connection strings in their errors."""
    text = ""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        event = entry.dagster_event
        data = event.step_failure_data if event is not None else None
        if data is None:
            continue
        if data.user_failure_data is not None and data.user_failure_data.description:
            text = data.user_failure_data.description
        elif data.error is not None:
            error = data.error
            while error.cause is not None and (error.cls_name or "").startswith("Dagster"):
                error = error.cause  # Dagster's wrapper around the op's exception: report the exception itself
            text = error.message  # "ExceptionClass: message", as Python prints it
    if not text:
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE):
            text = entry.message or text
    line = " ".join(redact(text).split()) or "no error recorded"
    return line if len(line) <= _MESSAGE_LIMIT else line[:_MESSAGE_LIMIT - 1] + "…"
