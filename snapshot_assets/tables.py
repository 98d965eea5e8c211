"""The configured tables of this code location: config loaded once, one pipeline per table.

Partitions are the configured tables (`schema.table`): adding a table to the config adds a
partition when the code location reloads. Nothing here opens a connection at import time.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from resources.aws_credentials import CredentialProfiles
from snapshot_assets.config import SnapshotterConfig, load_config
from snapshot_assets.pipeline.decide import NextArtifact
from snapshot_assets.pipeline.table import TablePipeline

if TYPE_CHECKING:  # Dagster is imported where it is used: a `run --once` with nothing to write needs none
    import dagster as dg

    from resources.destinations_resource import DestinationsResource
    from resources.sinks_resource import EventSinksResource

PARTITION_TAG = "dagster/partition"  # Dagster's own: the table of an artifact run (the run queue's one-per-table key)
TABLE_TAG = "snapshotter/table"
TRIGGER_TAG = "snapshotter/trigger"
FROM_TAG = "snapshotter/from_position"
TO_TAG = "snapshotter/to_position"
BOUNDARY_TAG = "snapshotter/boundary"  # `table:kind:from:to`: every attempt at one artifact carries it
ATTEMPT_TAG = "snapshotter/attempt"  # 0 for the first run of a boundary, N for its Nth retry
RETRY_OF_TAG = "snapshotter/retry_of"  # the failed run a retry follows
INGEST_TABLE_TAG = "snapshotter/ingest_table"  # the one table an ingest run feeds


def boundary(table: str, nxt: NextArtifact) -> str:
    """The BOUNDARY_TAG of every run (and attempt) that builds `nxt` for `table`."""
    return f"{table}:{nxt.run_key}"


@functools.cache
def config() -> SnapshotterConfig:
    return load_config()


def partitions() -> dg.StaticPartitionsDefinition:
    import dagster as dg

    return dg.StaticPartitionsDefinition([t.name for t in config().tables])


@functools.cache
def pipeline(table: str) -> TablePipeline:
    """The table's pipeline for the cheap reads of sensors, status and the CLI (default resources)."""
    return TablePipeline(config().table(table))


def table_pipeline(table: str, destinations: DestinationsResource, sinks: EventSinksResource) -> TablePipeline:
    """The table's pipeline on the run's resources (the assets' and jobs' destinations and sinks)."""
    cfg = config().table(table)
    profiles = CredentialProfiles.shared(cfg.credentials)
    return TablePipeline(cfg, destinations=destinations.for_table(cfg, profiles),
                         sinks=sinks.for_table(cfg, profiles), profiles=profiles)


def pipelines() -> list[TablePipeline]:
    return [pipeline(t.name) for t in config().tables]
