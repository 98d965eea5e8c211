"""Alerts on failed ingest and artifact runs: the hook point operators wire to their paging.

A dead ingest run makes its table not ready (the supervisor relaunches it, but a crash loop must be
seen); a failed artifact run means the archive is not advancing (a destination outage, expired
credentials, a CAS conflict with a second writer). Both reach this run-failure sensor, which logs
one line naming the job, the table and the error, and hands an `Alert` to every hook: the
built-in one POSTs it as JSON to `$SNAPSHOTTER_ALERT_WEBHOOK` when set (Slack/Teams/Alertmanager
style incoming webhooks); code can append to `HOOKS`. A hook that fails is logged, never raised:
alerting must not fail the sensor.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass

import dagster as dg

from snapshot_assets.jobs import diff_job, force_snapshot, ingest_job, snapshot_job
from snapshot_assets.run_history import failure_message
from snapshot_assets.tables import INGEST_TABLE_TAG

log = logging.getLogger(__name__)
WEBHOOK_ENV = "SNAPSHOTTER_ALERT_WEBHOOK"


@dataclass(frozen=True)
class Alert:
    job: str
    run_id: str
    table: str  # the partition of an artifact run, the table of an ingest run
    error: str

    @property
    def text(self) -> str:
        what = f"{self.job} for {self.table}" if self.table else self.job
        return f"snapshotter: {what} failed (run {self.run_id}): {self.error}"


def webhook(alert: Alert) -> None:
    """POST the alert as JSON to $SNAPSHOTTER_ALERT_WEBHOOK (no-op when unset)."""
    url = os.environ.get(WEBHOOK_ENV)
    if not url:
        return
    body = json.dumps({"text": alert.text, **asdict(alert)}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass


HOOKS: list[Callable[[Alert], None]] = [webhook]


def alert_for(run: dg.DagsterRun, error: str) -> Alert:
    table = run.tags.get("dagster/partition") or run.tags.get(INGEST_TABLE_TAG, "")
    return Alert(job=run.job_name, run_id=run.run_id, table=table, error=error)


def dispatch(alert: Alert) -> list[str]:
    """Hand `alert` to every hook; the failures of hooks, as text."""
    failures = []
    for hook in HOOKS:
        try:
            hook(alert)
        except Exception as e:
            failures.append(f"{getattr(hook, '__name__', hook)}: {e}")
    return failures


@dg.run_failure_sensor(monitored_jobs=[ingest_job, diff_job, snapshot_job, force_snapshot],
                       default_status=dg.DefaultSensorStatus.RUNNING,
                       description="Alerts (log + hooks, e.g. $SNAPSHOTTER_ALERT_WEBHOOK) on failed ingest and "
                                   "artifact runs.")
def run_failure_alert(context: dg.RunFailureSensorContext) -> None:
    error = failure_message(context.instance, context.dagster_run.run_id)  # the step's error, not "steps failed"
    alert = alert_for(context.dagster_run, error)
    context.log.error(alert.text)
    for failure in dispatch(alert):
        context.log.warning(f"alert hook failed: {failure}")
