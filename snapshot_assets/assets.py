"""The partitioned assets: change_buffer → snapshot / diff → manifest, one partition per table.

One run is the pipeline's stages for one artifact, each a function here with one entry:
  decide  `_requested`: the boundary comes from the run's tags when a sensor requested it (so a
          re-execution rebuilds the same artifact), unless a run that went first moved the head
          (`decide.still_due`: a diff then starts at the new head, a covered request builds
          nothing and its run skips the manifest); otherwise it is decided now (a manual or
          forced run) by `pipeline/decide.py`;
  build   `snapshot` / `diff`: Spark builds the artifact and uploads it to every destination
          (`TablePipeline.build`); the built `Artifact` is the asset's output, handed to the
          manifest asset through Dagster (`handoff.ArtifactIOManager`: materialization metadata in
          the instance's event log, readable from any run worker on any host);
  commit  `manifest`: the compare-and-swap on every destination (`pipeline/commit.py`), retention,
  notify  then the event outbox to the sinks (`pipeline/outbox.py`), inside `TablePipeline.commit`.
Before building, a leftover of a failed run whose manifest write landed anyway is settled
(`_settle_leftover`). Destinations, sinks and Spark are the registered resources. Artifacts are
never partitions: a partition per artifact would be thousands a day.
"""

import time
from collections.abc import Iterator
from typing import Any

import dagster as dg

from resources.destinations_resource import DestinationsResource
from resources.sinks_resource import EventSinksResource
from resources.spark import SparkResource
from snapshot_assets.archive.manifest import Artifact
from snapshot_assets.archive.pins import pin_of
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.retention import retired_of
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.handoff import settled, unsettled
from snapshot_assets.metrics import table_metadata
from snapshot_assets.pipeline.decide import SNAPSHOT_ONLY_TRIGGERS, NextArtifact, still_due
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.tables import FROM_TAG, TO_TAG, TRIGGER_TAG, partitions, table_pipeline

PARTITIONS = partitions()
ARTIFACT_IO = "artifact_io_manager"
BUILT = [dg.AssetKey("snapshot"), dg.AssetKey("diff")]
MANIFEST = dg.AssetKey("manifest")

change_buffer = dg.AssetSpec(
    "change_buffer",
    partitions_def=PARTITIONS,
    description="The durable change buffer of each table, fed by the ingest run; observed by the re-base "
                "trigger sensor (durable position, buffered changes and bytes, lag).",
    group_name="snapshotter",
)


def _requested(context: dg.AssetExecutionContext, pipe: TablePipeline, kind: str) -> NextArtifact | None:
    """The artifact this run builds, or None when a run that went before it already covered it."""
    tags = context.run.tags
    if tags.get(TO_TAG):
        requested = NextArtifact(kind, tags.get(TRIGGER_TAG, "sensor"), tags.get(FROM_TAG) or None, tags[TO_TAG])
        m = pipe.manifest()
        due = still_due(requested, m, pipe.cmp)
        if due is None:
            context.log.info(f"{pipe.name}: the requested {kind} up to {requested.to_position} is superseded: "
                             f"the head {m.head_position} already covers it; nothing to build")
        elif due != requested:
            context.log.info(f"{pipe.name}: the head moved to {due.from_position} since the diff was requested "
                             f"from {requested.from_position}; it is built from the head")
        return due
    nxt = pipe.decide(force=(kind == "snapshot"))
    if kind == "diff":
        if nxt.kind == "snapshot" and nxt.trigger in SNAPSHOT_ONLY_TRIGGERS:
            raise dg.Failure(f"{pipe.name}: the next artifact must be a snapshot ({nxt.trigger})")
        m = pipe.manifest()
        durable = pipe.buffer().durable_position()
        if not durable or durable == m.head_position:
            raise dg.Failure(f"{pipe.name}: no changes after the head {m.head_position}: nothing to diff")
        return NextArtifact("diff", "manual", m.head_position, durable)
    return NextArtifact("snapshot", tags.get(TRIGGER_TAG, nxt.trigger), None, nxt.to_position)


def _settle_leftover(context: dg.AssetExecutionContext, pipe: TablePipeline) -> None:
    """Finish a failed run's artifact whose manifest write landed after all (events, cleanup), once."""
    leftover = unsettled(context.instance, pipe.name, BUILT, MANIFEST)
    if leftover is None:
        return
    committed = pipe.settle(leftover)
    if committed:
        context.log.warning(f"{pipe.name}: {leftover.describe()} was committed by a failed run; events sent now")
    context.log_event(settled(leftover, pipe.name, MANIFEST, committed=committed))


class SnapshotRequest(dg.Config):
    """The run config of a snapshot: `label` pins it as a user's restore point (`force_snapshot` from
    the UI, GraphQL, `POST /snapshot?label=`, `snapshotter snapshot --label`); without one it is a
    system snapshot that retention prunes (the table's first snapshot is pinned anyway)."""

    label: str = ""


def _build(context: dg.AssetExecutionContext, spark: SparkResource, destinations: DestinationsResource,
           event_sinks: EventSinksResource, kind: str, label: str = "") -> Iterator[dg.Output[Artifact]]:
    """Yields the built artifact, or nothing for a superseded request: the run then succeeds with its
    manifest step skipped (it has no artifact to commit)."""
    pipe = table_pipeline(context.partition_key, destinations, event_sinks)
    _settle_leftover(context, pipe)
    nxt = _requested(context, pipe, kind)
    if nxt is None:
        return
    if nxt.to_position is None:
        raise dg.Failure(f"{pipe.name}: nothing has been ingested yet")
    started = time.monotonic()
    with spark.watching_server(f"{pipe.name}: {nxt.kind} to {nxt.to_position}"):
        built = pipe.build(spark.spark_session, nxt, label=label)
    art = built.artifact
    metadata: dict[str, Any] = {
        "kind": art.kind,
        "epoch": art.epoch,
        "from_position": art.from_position or "",
        "to_position": art.to_position,
        "trigger": nxt.trigger,
        "rows" if art.is_snapshot else "changes": art.row_count if art.is_snapshot else art.change_count,
        "duration_s": round(time.monotonic() - started, 3),
        "spark_s": round(built.seconds, 3),
        "spark_mode": spark.mode,
    }
    # a snapshot build: full or incremental, and how; a diff build: whether its window had before-images
    for name in ("mode", "shuffle", "buckets", "rewritten", "before_images"):
        if name in built.details:
            metadata[f"build_{name}"] = built.details[name]
    pin = pin_of(art)
    if pin is not None:
        metadata["pin"] = pin.label
    for fid, ref in art.formats.items():
        metadata[f"bytes_{fid}"] = ref.size_bytes
        metadata[f"uri_{fid}"] = dg.MetadataValue.url(ref.uri) if ref.uri.startswith("s3://") else ref.uri
    yield dg.Output(art, metadata=metadata)


@dg.asset(partitions_def=PARTITIONS, deps=[change_buffer], kinds={"spark"}, group_name="snapshotter",
          io_manager_key=ARTIFACT_IO, output_required=False,
          description="A full base snapshot of the table (opens a new epoch), in every snapshot format.")
def snapshot(context: dg.AssetExecutionContext, config: SnapshotRequest, spark: SparkResource,
             destinations: DestinationsResource, event_sinks: EventSinksResource) -> Iterator[dg.Output[Artifact]]:
    yield from _build(context, spark, destinations, event_sinks, "snapshot", config.label.strip())


@dg.asset(partitions_def=PARTITIONS, deps=[change_buffer], kinds={"spark"}, group_name="snapshotter",
          io_manager_key=ARTIFACT_IO, output_required=False,
          description="The net change per key since the manifest head, in every diff format.")
def diff(context: dg.AssetExecutionContext, spark: SparkResource, destinations: DestinationsResource,
         event_sinks: EventSinksResource) -> Iterator[dg.Output[Artifact]]:
    yield from _build(context, spark, destinations, event_sinks, "diff")


@dg.asset(partitions_def=PARTITIONS, ins={"snapshot": dg.AssetIn(), "diff": dg.AssetIn()}, group_name="snapshotter",
          description="The manifest (the commit point): commits this run's artifact on every destination with "
                      "compare-and-swap, applies retention, and notifies the event sinks through the outbox.")
def manifest(context: dg.AssetExecutionContext, snapshot: Artifact | None, diff: Artifact | None,
             destinations: DestinationsResource, event_sinks: EventSinksResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
    pipe = table_pipeline(context.partition_key, destinations, event_sinks)
    built = [a for a in (snapshot, diff) if a is not None]
    if len(built) != 1:
        raise dg.Failure(f"{pipe.name}: a manifest run commits one artifact, built in the same run (snapshot_job, "
                         f"diff_job, force_snapshot); this run built {len(built)}")
    art = built[0]
    previous_head = pipe.manifest().head_position
    report = pipe.commit(art)
    m = report.commit.manifest
    return dg.MaterializeResult(metadata={
        "head_position": m.head_position,
        "previous_head": previous_head,
        "epoch": m.epoch,
        "artifacts": len(m.artifacts),
        "committed": art.describe(),
        "already_committed": report.commit.already_committed,
        "cas_retries": report.commit.cas_retries,
        "brought_forward": ", ".join(report.commit.brought_forward) or "none",
        "pruned_artifacts": len(report.commit.pruned),
        "retired_artifacts": len(retired_of(m)),  # out of the manifest, objects kept for retention.grace
        "orphans_collected": report.orphans,
        "events_delivered": report.delivery.delivered,
        "outbox_depth": report.delivery.pending,
        "buffer_segments_released": report.released_segments,
        **table_metadata(pipe, context.instance),
    })


@dg.asset_check(asset=manifest, description="Chain contiguous on every destination, "
                "every object present in every format with its recorded size, head not behind the previous head.")
def archive_is_sound(context: dg.AssetCheckExecutionContext, destinations: DestinationsResource,
                     event_sinks: EventSinksResource) -> dg.AssetCheckResult:
    table = context.run.tags.get("dagster/partition") or ""
    pipe = table_pipeline(table, destinations, event_sinks)
    problems: list[str] = []
    for dest in pipe.destinations:
        reader = ArchiveReader(dest, pipe.cfg.key_prefix, key_fields=pipe.key_fields, cmp=comparator("lsn"))
        problems += [f"{dest.name}: {p}" for p in verify_archive(reader)]
    event = context.instance.get_latest_materialization_event(manifest.key)
    meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
    previous, head = meta.get("previous_head"), meta.get("head_position")
    if previous is not None and head is not None and previous.value and pipe.cmp(str(head.value),
                                                                                 str(previous.value)) < 0:
        problems.append(f"head moved backwards from {previous.value} to {head.value}")
    return dg.AssetCheckResult(passed=not problems, metadata={
        "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none"),
        "destinations": len(pipe.destinations),
    })
