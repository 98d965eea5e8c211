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
