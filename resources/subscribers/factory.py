"""Build the subscriber a table's `source { ... }` block describes.

`type = laredo` (the default, laredo-snapshotter's own source), `postgres` (logical replication
straight from the database) or `generator` (the embedded synthetic source). PostgreSQL tables are
read with `source.unchanged_toast` (default "fill"): with REPLICA IDENTITY DEFAULT an UPDATE does
not resend unchanged TOASTed values, and the archive fills them from its own previous image of the
row in the Spark build; "require-full" refuses such tables unless they are REPLICA IDENTITY FULL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resources.subscribers.events import Subscriber
from snapshot_assets.config import SourceConfig, TableConfig

_GENERATOR_KEYS = {"seed", "rows", "changes", "mix", "hot_keys", "hot_share", "tx_size", "pk_change",
                   "resync_every", "rate", "start_lsn", "identity"}


def _generator_args(spec: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(spec) - _GENERATOR_KEYS)
    if unknown:
        raise ValueError(f"source.generator: unknown key {unknown[0]!r}; known: {', '.join(sorted(_GENERATOR_KEYS))}")
    args = dict(spec)
    if "tx_size" in args:
        low, high = args["tx_size"]
        args["tx_size"] = (int(low), int(high))
    return args


def slot_name(source: SourceConfig) -> str:
    """A replication slot per table: slots cannot be shared, and names allow [a-z0-9_] only."""
    raw = source.slot or f"snapshotter_{source.schema}_{source.table}"
    return "".join(c if c.isalnum() or c == "_" else "_" for c in raw.lower())[:63]


def build_subscriber(table: TableConfig, *, batched_copy: bool = False) -> Subscriber:
    """The table's source. `batched_copy`: a consumer that takes `SnapshotBatch` events (the buffer)
    gets a copy in batches from the sources that can send them (PostgreSQL)."""
    src = table.source
    if src.type == "generator":
        from resources.subscribers.generator import GeneratorSubscriber

        return GeneratorSubscriber(src.qualified_table, **_generator_args(src.generator))
    if src.type == "postgres":
        from resources.subscribers.postgres import PostgresSubscriber

        return PostgresSubscriber(src.dsn, table=src.table, schema=src.schema, key_fields=table.key_fields,
                                  slot=slot_name(src),
                                  publication=src.publication or slot_name(src), create_slot=src.create_slot,
                                  recreate_slot_on_loss=src.recreate_slot_on_loss,
                                  unchanged_toast=src.unchanged_toast, progress=bool(table.group),
                                  batched_copy=batched_copy)
    if src.type == "laredo":
        from resources.subscribers.laredo import LaredoSubscriber

        url = src.server if "://" in src.server else f"http://{src.server}"
        return LaredoSubscriber(url, src.schema, src.table, protocol=src.protocol,
                                client_id=src.client_id or f"snapshotter-{src.qualified_table}",
                                key_fields=table.key_fields, tls=src.tls)
    raise ValueError(f"unknown source type {src.type!r}")


def feed_subscriber(table: TableConfig) -> Subscriber:
    """A subscriber for `table` that feeds a change buffer (a copy comes in batches, `SnapshotBatch`);
    nothing connects until its events are read. The `subscribers` resource and the CLI's ingest open it."""
    return build_subscriber(table, batched_copy=True)
