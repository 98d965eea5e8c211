"""Group test helpers: member buffers written as a PostgreSQL source writes them, without a database."""

from __future__ import annotations

from resources.buffer import ChangeBuffer
from resources.subscribers.events import (
    Column,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
)
from snapshot_assets.config import SnapshotterConfig

ACCOUNTS, TRANSFERS = "public.accounts", "public.transfers"


def feed(cfg: SnapshotterConfig, table: str, *events: Event) -> None:
    """Append events to the table's buffer as its ingest would, and seal."""
    t = cfg.table(table)
    with ChangeBuffer(t.buffer.path, t.name, seal_interval=0) as buffer:
        for event in events:
            buffer.append(event)
        buffer.seal()


def schema(table: str) -> TableSchema:
    return TableSchema(table, (Column("id", "integer", False, True, 1, 1), Column("v", "bigint", ordinal=2)))


def initial_copy(table: str, position: str) -> list[Event]:
    """The initial load of a one-row table, consistent at `position`."""
    return [SchemaEvent(schema(table)), ResyncBegin("initial load"), SnapshotRow({"id": 1, "v": 10}),
            ResyncEnd(position, 1)]
