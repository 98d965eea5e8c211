"""The capture service's flushes, seen in Dagster: observations of today's and yesterday's pages.

The service writes pages and index records on its own, outside any run; this sensor turns what
the object index says about a day (pages, events, bytes, writers) into an observation of that
`capture_pages` partition whenever it changed since the last look, so the asset's history in the
UI follows the flushes without a run per page.
"""

import datetime as dt
import json

import dagster as dg

from snapshot_assets.capture.assets import capture_pages, day_summary
from snapshot_assets.capture.resource import CaptureResource


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Observes the capture_pages partitions of today and yesterday as the service flushes.")
def capture_pages_observer(context: dg.SensorEvaluationContext, capture: CaptureResource) -> dg.SensorResult:
    seen: dict[str, list[int]] = json.loads(context.cursor) if context.cursor else {}
    today = dt.datetime.now(dt.UTC).date()
    destination = capture.destination()
    events: list[dg.AssetObservation] = []
    for day in (str(today - dt.timedelta(days=1)), str(today)):
        metadata = day_summary(destination, day)
        signature = [int(metadata[k].value) for k in ("pages", "events", "stored_bytes")]  # type: ignore[arg-type]
        if signature != seen.get(day, [0, 0, 0]):
            events.append(dg.AssetObservation(asset_key=capture_pages.key, partition=day, metadata=metadata))
            seen[day] = signature
    cursor = json.dumps({d: v for d, v in seen.items() if d >= str(today - dt.timedelta(days=1))}, sort_keys=True)
    if not events:
        return dg.SensorResult(skip_reason="no new pages since the last look", cursor=cursor)
    return dg.SensorResult(asset_events=events, cursor=cursor)
