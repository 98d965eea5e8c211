"""Reconciliation: restore the index records of stored pages an index lacks (scheduled hourly).

Index publishing is retried by the capture service itself; this is the backstop for what no
retry can bring back (a record deleted, an index database restored from an old backup).
"""

import dagster as dg

from resources.capture.reconcile import reconcile
from snapshot_assets.capture.resource import CaptureResource


@dg.op(description="Scan the page storage and upsert the missing records into every index backend.")
def reconcile_capture_index(context: dg.OpExecutionContext, capture: CaptureResource) -> int:
    destination = capture.destination()
    result = reconcile(destination, capture.indexes(destination), capture.settings().storage.key_template)
    restored = sum(n for _, n in result.missing)
    context.add_output_metadata({"stored_pages": len(result.stored), "restored": dict(result.missing),
                                 "indexed_but_missing": list(result.orphans[:100])})
    if result.orphans:
        context.log.warning(f"{len(result.orphans)} index records name pages storage lacks: {result.orphans[:10]}")
    return restored


@dg.job(description="Restore missing capture index records from the stored pages.")
def capture_reconcile_job() -> None:
    reconcile_capture_index()


capture_reconcile_schedule = dg.ScheduleDefinition(job=capture_reconcile_job, cron_schedule="17 * * * *",
                                                   default_status=dg.DefaultScheduleStatus.STOPPED)
