"""Retries undelivered commit notifications from the durable outbox (events are at-least-once)."""

import dagster as dg

from snapshot_assets.tables import pipelines


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Delivers events left in the outbox after a sink failure, with backoff.")
def outbox_retry(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    delivered = failed = pending = 0
    for pipe in pipelines():
        if not pipe.sinks:
            continue
        report = pipe.outbox.deliver(pipe.sinks)
        delivered, failed, pending = delivered + report.delivered, failed + report.failed, report.pending
        for error in report.errors:
            context.log.warning(error)
    return dg.SkipReason(f"delivered {delivered}, failed {failed}, still pending {pending}")
