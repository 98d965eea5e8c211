"""The change buffer resource: opens a table's durable change buffer for its one writer, the ingest.

Registered in Definitions as `change_buffers`; the ingest run appends the subscriber's changes to
the buffer it opens here. Where a table's buffer lives (a local directory or an S3 prefix: the
working root, `buffer.path`: table_storage.py) and when it seals is the table's `buffer`
configuration.
"""

from __future__ import annotations

import dagster as dg

from resources.buffer import ChangeBuffer
from resources.table_storage import open_buffer_writer
from snapshot_assets.config import TableConfig


class ChangeBufferResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    def open_writer(self, table: TableConfig, ordering: str) -> ChangeBuffer:
        """The buffer's writer (`open_buffer_writer`)."""
        return open_buffer_writer(table, ordering)
