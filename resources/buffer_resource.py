"""The change buffer resource: opens a table's durable change buffer for its one writer, the ingest.

Registered in Definitions as `change_buffers`; the ingest run appends the subscriber's changes to
the buffer it opens here. Where a table's buffer lives (a local directory or an S3 prefix: the
working root, `buffer.path`) and when it seals is the table's `buffer` configuration.
"""

from __future__ import annotations

import dagster as dg

from resources.aws_credentials import CredentialProfiles
from resources.buffer import ChangeBuffer
from resources.buffer.object_storage import table_storage
from resources.buffer.storage import BufferStorage
from resources.work_storage import WorkRoot
from snapshot_assets.config import TableConfig


def work_root(table: TableConfig, profiles: CredentialProfiles | None = None) -> WorkRoot:
    """The table's working root, signed (for S3) as the profile its `buffer.s3.credentials` names."""
    return WorkRoot.open(table.buffer.path, table.buffer.s3,
                         profiles=profiles if profiles is not None else CredentialProfiles.shared(table.credentials))


def buffer_storage(table: TableConfig, work: WorkRoot | None = None) -> BufferStorage:
    """Where `table`'s buffer lives: `<root>/<table>/` under its working root."""
    return table_storage(work or work_root(table), table.name, lease_seconds=table.buffer.lease.total_seconds())


class ChangeBufferResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    def open_writer(self, table: TableConfig, ordering: str) -> ChangeBuffer:
        """The buffer's writer (one per table: the ingest), positions compared as `ordering`."""
        return ChangeBuffer(table.buffer.path, table.name, ordering=ordering,
                            seal_interval=table.buffer.seal_interval.total_seconds(),
                            seal_changes=table.buffer.seal_changes, storage=buffer_storage(table))
