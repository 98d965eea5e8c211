"""The configured tables of this code location: config loaded once, one pipeline per table.

Partitions are the configured tables (`schema.table`): adding a table to the config adds a
partition when the code location reloads. Nothing here opens a connection at import time.
"""

from __future__ import annotations

import functools

import dagster as dg

from snapshot_assets.config import SnapshotterConfig, load_config
from snapshot_assets.pipeline.table import TablePipeline

TABLE_TAG = "snapshotter/table"
TRIGGER_TAG = "snapshotter/trigger"
FROM_TAG = "snapshotter/from_position"
TO_TAG = "snapshotter/to_position"
BOUNDARY_TAG = "snapshotter/boundary"  # `table:kind:from:to`: every attempt at one artifact carries it
ATTEMPT_TAG = "snapshotter/attempt"  # 0 for the first run of a boundary, N for its Nth retry
RETRY_OF_TAG = "snapshotter/retry_of"  # the failed run a retry follows
INGEST_TABLE_TAG = "snapshotter/ingest_table"  # the one table an ingest run feeds


@functools.cache
def config() -> SnapshotterConfig:
    return load_config()


def partitions() -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition([t.name for t in config().tables])


@functools.cache
def pipeline(table: str) -> TablePipeline:
    return TablePipeline(config().table(table))


def pipelines() -> list[TablePipeline]:
    return [pipeline(t.name) for t in config().tables]
