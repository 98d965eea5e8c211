"""Where a table's working files live: its working root (a local directory or an S3 prefix,
`buffer.path`) and its change buffer under it.

Apart from the `change_buffers` Dagster resource (buffer_resource.py) so that the paths which start
no Dagster run (the CLI's ingest, the decision, a `run --once` with nothing to write) need no Dagster.
"""

from __future__ import annotations

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


def open_buffer_writer(table: TableConfig, ordering: str) -> ChangeBuffer:
    """The buffer's writer (one per table: the ingest), positions compared as `ordering`."""
    return ChangeBuffer(table.buffer.path, table.name, ordering=ordering,
                        seal_interval=table.buffer.seal_interval.total_seconds(),
                        seal_changes=table.buffer.seal_changes, storage=buffer_storage(table))
