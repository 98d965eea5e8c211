"""Retries undelivered commit notifications from the durable outbox (events are at-least-once)."""

import dagster as dg

from snapshot_assets.tables import pipelines


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Delivers events left in the outbox after a sink failure, with backoff.")
def outbox_retry(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    delivered = failed = 0
    roots = {}
    for pipe in pipelines():
        if not pipe.sinks:
            continue
        report = pipe.outbox.deliver(pipe.sinks)
        delivered, failed = delivered + report.delivered, failed + report.failed
        roots[pipe.outbox.identity] = pipe.outbox
        for error in report.errors:
            context.log.warning(f"{pipe.name}: {error}")
    pending = sum(outbox.depth() for outbox in roots.values())  # tables may share an outbox: count each once
    return dg.SkipReason(f"delivered {delivered}, failed {failed}, still pending {pending}")
