"""The change buffer resource: opens a table's durable change buffer for its one writer, the ingest.

Registered in Definitions as `change_buffers`; the ingest run appends the subscriber's changes to
the buffer it opens here. Where a table's buffer lives and when it seals is the table's `buffer`
configuration.
"""

from __future__ import annotations

import dagster as dg

from resources.buffer import ChangeBuffer
from snapshot_assets.config import TableConfig


class ChangeBufferResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    def open_writer(self, table: TableConfig, ordering: str) -> ChangeBuffer:
        """The buffer's writer (one per table: the ingest), positions compared as `ordering`."""
        return ChangeBuffer(table.buffer.path, table.name, ordering=ordering,
                            seal_interval=table.buffer.seal_interval.total_seconds(),
                            seal_changes=table.buffer.seal_changes)
