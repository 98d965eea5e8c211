"""The subscriber resource: opens the source stream that feeds a table's change buffer.

Registered in Definitions as `subscribers`; the ingest run of a table opens its subscriber here
(PostgreSQL logical replication, a laredo server, the generator: the table's `source` decides),
as `snapshotter ingest` does outside Dagster.
"""

from __future__ import annotations

import dagster as dg

from resources.subscribers.events import Subscriber
from resources.subscribers.factory import build_subscriber
from snapshot_assets.config import TableConfig


class SubscriberResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    def open(self, table: TableConfig) -> Subscriber:
        """A subscriber for `table` that feeds a buffer (a copy comes in batches, `SnapshotBatch`);
        nothing connects until its events are read."""
        return build_subscriber(table, batched_copy=True)
