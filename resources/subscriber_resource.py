"""The subscriber resource: opens the source stream that feeds a table's change buffer.

Registered in Definitions as `subscribers`; the ingest run of a table opens its subscriber here
(PostgreSQL logical replication, a laredo server, the generator: the table's `source` decides),
as `snapshotter ingest` does outside Dagster.
"""

from __future__ import annotations

import dagster as dg

from resources.subscribers.events import Subscriber
from resources.subscribers.factory import feed_subscriber
from snapshot_assets.config import TableConfig


class SubscriberResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    def open(self, table: TableConfig) -> Subscriber:
        """A subscriber for `table` that feeds a buffer (`feed_subscriber`)."""
        return feed_subscriber(table)
