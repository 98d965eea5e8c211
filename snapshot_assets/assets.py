"""The partitioned assets: change_buffer → snapshot / diff → manifest, one partition per table.

One materialization of `snapshot` or `diff` is one artifact (built by Spark, uploaded to every
destination); the `manifest` materialization in the same run commits it. The boundary of the
artifact comes from the run's tags when a sensor requested it (so a re-execution rebuilds exactly
the same artifact), otherwise it is decided now (a manual or forced run). Artifacts are never
partitions: a partition per artifact would be thousands a day.
"""

import time
from typing import Any

import dagster as dg

from resources.spark import SparkResource
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.metrics import table_metadata
from snapshot_assets.pipeline.decide import SNAPSHOT_ONLY_TRIGGERS, NextArtifact
from snapshot_assets.pipeline.pending import clear_pending, load_pending, save_pending
from snapshot_assets.tables import FROM_TAG, TO_TAG, TRIGGER_TAG, partitions, pipeline

PARTITIONS = partitions()

change_buffer = dg.AssetSpec(
    "change_buffer",
    partitions_def=PARTITIONS,
    description="The durable change buffer of each table, fed by the ingest run; observed by the re-base "
                "trigger sensor (durable position, buffered changes and bytes, lag).",
    group_name="snapshotter",
)


def _requested(context: dg.AssetExecutionContext, kind: str) -> NextArtifact:
    tags = context.run.tags
    pipe = pipeline(context.partition_key)
    if tags.get(TO_TAG):
        return NextArtifact(kind, tags.get(TRIGGER_TAG, "sensor"), tags.get(FROM_TAG) or None, tags[TO_TAG])
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


def _build(context: dg.AssetExecutionContext, spark: SparkResource, kind: str) -> dg.MaterializeResult:  # type: ignore[type-arg]
    pipe = pipeline(context.partition_key)
    leftover = load_pending(pipe.buffer_root, pipe.name)
    if leftover is not None and pipe.settle(leftover[0]):  # a run that failed after its manifest write landed
        context.log.warning(f"{pipe.name}: {leftover[0].describe()} was committed by a failed run; events sent now")
        clear_pending(pipe.buffer_root, pipe.name)
    nxt = _requested(context, kind)
    if nxt.to_position is None:
        raise dg.Failure(f"{pipe.name}: nothing has been ingested yet")
    started = time.monotonic()
    built = pipe.build(spark.spark_session, nxt)
    art = built.artifact
    save_pending(pipe.buffer_root, pipe.name, art, {"trigger": nxt.trigger})
    metadata: dict[str, Any] = {
        "kind": art.kind,
        "epoch": art.epoch,
        "from_position": art.from_position or "",
        "to_position": art.to_position,
        "trigger": nxt.trigger,
        "rows" if art.is_snapshot else "changes": art.row_count if art.is_snapshot else art.change_count,
        "duration_s": round(time.monotonic() - started, 3),
        "spark_s": round(built.seconds, 3),
    }
    for fid, ref in art.formats.items():
        metadata[f"bytes_{fid}"] = ref.size_bytes
        metadata[f"uri_{fid}"] = dg.MetadataValue.url(ref.uri) if ref.uri.startswith("s3://") else ref.uri
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(partitions_def=PARTITIONS, deps=[change_buffer], kinds={"spark"}, group_name="snapshotter",
          description="A full base snapshot of the table (opens a new epoch), in every snapshot format.")
def snapshot(context: dg.AssetExecutionContext, spark: SparkResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
    return _build(context, spark, "snapshot")


@dg.asset(partitions_def=PARTITIONS, deps=[change_buffer], kinds={"spark"}, group_name="snapshotter",
          description="The net change per key since the manifest head, in every diff format.")
def diff(context: dg.AssetExecutionContext, spark: SparkResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
    return _build(context, spark, "diff")


@dg.asset(partitions_def=PARTITIONS, deps=[snapshot, diff], group_name="snapshotter",
          description="The manifest (the commit point): commits this run's artifact on every destination with "
                      "compare-and-swap, applies retention, and notifies the event sinks through the outbox.")
def manifest(context: dg.AssetExecutionContext) -> dg.MaterializeResult:  # type: ignore[type-arg]
    pipe = pipeline(context.partition_key)
    pending = load_pending(pipe.buffer_root, pipe.name)
    if pending is None:
        raise dg.Failure(f"{pipe.name}: no built artifact to commit (run snapshot or diff first)")
    art, info = pending
    previous_head = pipe.manifest().head_position
    report = pipe.commit(art)
    clear_pending(pipe.buffer_root, pipe.name)
    m = report.commit.manifest
    return dg.MaterializeResult(metadata={
        "head_position": m.head_position,
        "previous_head": previous_head,
        "epoch": m.epoch,
        "artifacts": len(m.artifacts),
        "committed": art.describe(),
        "trigger": info.get("trigger", ""),
        "already_committed": report.commit.already_committed,
        "cas_retries": report.commit.cas_retries,
        "brought_forward": ", ".join(report.commit.brought_forward) or "none",
        "pruned_artifacts": len(report.commit.pruned),
        "orphans_collected": report.orphans,
        "events_delivered": report.delivery.delivered,
        "outbox_depth": report.delivery.pending,
        "buffer_segments_released": report.released_segments,
        **table_metadata(pipe, context.instance),
    })


def _readers(table: str) -> list[ArchiveReader]:
    pipe = pipeline(table)
    return [ArchiveReader(d, pipe.cfg.key_prefix, key_fields=pipe.key_fields, cmp=comparator("lsn"))
            for d in pipe.destinations]


@dg.asset_check(asset=manifest, description="Chain contiguous on every destination, "
                "every object present in every format with its recorded size, head not behind the previous head.")
def archive_is_sound(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    table = context.run.tags.get("dagster/partition") or ""
    problems: list[str] = []
    for reader in _readers(table):
        problems += [f"{reader.dest.name}: {p}" for p in verify_archive(reader)]
    pipe = pipeline(table)
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
