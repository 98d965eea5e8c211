"""Dagster jobs of co-refresh groups: one cut per run, and a group's Spark reconstruct at a cut.

A `group_cut` run is the group's one writer: it builds and commits every member's artifact for
the cut and then publishes the cut (groups/cut.py), on the run's own resources (Spark, the
destinations and sinks of each member). The `group_cut` sensor (sensors/group_cut.py) requests it.
(No `from __future__ import annotations`: Dagster reads the ops' config annotations at definition.)
"""

import dagster as dg

from resources.destinations_resource import DestinationsResource
from resources.sinks_resource import EventSinksResource
from resources.spark import SparkResource
from snapshot_assets import tables
from snapshot_assets.groups.cut import GroupPipeline

GROUP_TAG = "snapshotter/group"  # the group a cut run writes (one run at a time per group)
CUT_TAG = "snapshotter/cut"  # `group:position`: every attempt at one cut carries it


class GroupCutConfig(dg.Config):
    group: str


def group_pipeline(name: str, destinations: DestinationsResource, sinks: EventSinksResource) -> GroupPipeline:
    """The group's pipeline on the run's resources."""
    group = tables.config().group(name)
    return GroupPipeline(group, [tables.table_pipeline(t, destinations, sinks) for t in group.tables])


@dg.op(description="Bring every member of the group to the next cut (diff, snapshot or nothing each), then "
                   "publish the cut in the group manifest.")
def cut_group(context: dg.OpExecutionContext, config: GroupCutConfig, spark: SparkResource,
              destinations: DestinationsResource, event_sinks: EventSinksResource) -> dg.Output[str]:
    group = group_pipeline(config.group, destinations, event_sinks)
    with spark.watching_server(f"group {config.group}: the cut"):
        outcome = group.advance(spark.spark_session)
    for table, art in outcome.committed:  # the members' artifacts, as the table's own runs record them
        context.log.info(f"{config.group}: {table} {art.describe()}")
        context.log_event(dg.AssetMaterialization(
            asset_key=art.kind, partition=table,
            metadata={"group": config.group, "epoch": dg.MetadataValue.int(art.epoch),
                      "from_position": art.from_position or "", "to_position": art.to_position,
                      "rows" if art.is_snapshot else "changes": dg.MetadataValue.int(
                          art.row_count if art.is_snapshot else art.change_count)}))
    if outcome.cut is None:
        context.log.info(f"{config.group}: no cut ({outcome.reason})")
        return dg.Output("", metadata={"group": config.group, "reason": outcome.reason})
    return dg.Output(outcome.cut.position, metadata={
        "group": config.group, "position": outcome.cut.position,
        "artifacts": dg.MetadataValue.int(len(outcome.committed)),
        **{f"{t}.to_position": m.to_position for t, m in outcome.cut.tables.items()}})


@dg.job(description="One cut of a co-refresh group: every member reaches the cut, then the cut is published.")
def group_cut_job() -> None:
    cut_group()


class GroupReconstructConfig(dg.Config):
    """Rebuild every member of a group at the newest cut at or before `position` (default: the newest)."""

    group: str
    position: str = ""
    output_path: str
    format: str = "parquet"


@dg.op(description="Rebuild every member of a group at one cut with Spark, each into <output_path>/<table>.")
def reconstruct_group(context: dg.OpExecutionContext, config: GroupReconstructConfig,
                      spark: SparkResource) -> dg.Output[str]:
    from snapshot_assets.groups.read import reconstruct_group_to_paths

    cut, done = reconstruct_group_to_paths(spark.spark_session, tables.config(), config.group,
                                           config.position or None, config.output_path, config.format)
    for table, result in done.items():
        context.log.info(f"{table} at {result.position}: {result.rows} rows")
    return dg.Output(cut.position, metadata={"group": config.group, "cut": cut.position, "path": config.output_path,
                                             **{f"{t}.rows": dg.MetadataValue.int(r.rows) for t, r in done.items()}})


@dg.job(description="Rebuild every member of a co-refresh group at one cut (Spark) into a path.")
def reconstruct_group_job() -> None:
    reconstruct_group()
