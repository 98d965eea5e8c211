"""The captured pages as an asset partitioned by day, and the check that storage and index agree.

A partition is the UTC day of its pages' first events; materializing it reads the day's object
index records (one object per writer and day, written by the capture service as it flushes) and
reports what the day holds: pages, events, stored and uncompressed bytes, writers. The check
compares storage with every index backend without changing anything: each indexed page must
exist, and each stored page must be indexed (the reconciliation job restores the latter).
"""

import json
from typing import Any

import dagster as dg

from resources.capture.keys import INDEX_PREFIX
from resources.capture.reconcile import reconcile
from resources.destinations.base import Destination
from snapshot_assets.capture.resource import CaptureResource

DAYS = dg.DailyPartitionsDefinition(start_date="2025-01-01", end_offset=1)  # today too: pages arrive all day


def day_summary(destination: Destination, day: str) -> dict[str, dg.MetadataValue]:
    """What the day's pages hold, from the object index (one record per page, written at each flush)."""
    pages: list[dict[str, Any]] = []
    for info in destination.list(INDEX_PREFIX):
        if info.key.endswith(f"/{day}.json"):
            got = destination.get(info.key)
            pages.extend(json.loads(got.data)["pages"] if got else [])
    return {
        "pages": dg.MetadataValue.int(len(pages)),
        "events": dg.MetadataValue.int(sum(p["event_count"] for p in pages)),
        "stored_bytes": dg.MetadataValue.int(sum(p["storage_size_bytes"] for p in pages)),
        "page_bytes": dg.MetadataValue.int(sum(p["page_size_bytes"] for p in pages)),
        "writers": dg.MetadataValue.int(len({p["writer_id"] for p in pages})),
        "index": dg.MetadataValue.path(destination.uri(f"{INDEX_PREFIX}*/{day}.json")),
    }


@dg.asset(partitions_def=DAYS, group_name="capture", kinds={"s3"},
          description="Pages of captured events (RFC-023) whose first event falls on the day.")
def capture_pages(context: dg.AssetExecutionContext, capture: CaptureResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
    return dg.MaterializeResult(metadata=day_summary(capture.destination(), context.partition_key))


@dg.asset_check(asset=capture_pages, description="Every indexed page exists; every stored page is indexed.")
def capture_index_matches_storage(capture: CaptureResource) -> dg.AssetCheckResult:
    destination = capture.destination()
    settings = capture.settings()
    result = reconcile(destination, capture.indexes(destination), settings.storage.key_template, restore=False)
    unindexed = sum(n for _, n in result.missing)
    return dg.AssetCheckResult(
        passed=unindexed == 0 and not result.orphans,
        metadata={"stored_pages": dg.MetadataValue.int(len(result.stored)),
                  "unindexed": dg.MetadataValue.json(dict(result.missing)),
                  "indexed_but_missing": dg.MetadataValue.json(list(result.orphans[:100]))})
