"""The hand-off from an artifact asset (snapshot, diff) to the manifest asset, through Dagster's instance.

The artifact asset's output is the built `Artifact` (the manifest entry: positions, epoch, counts,
each format's URI and size). `ArtifactIOManager` stores it as the materialization's `artifact`
metadata, i.e. in the instance's event log, which every run worker of a deployment shares on
whatever host it runs; the manifest asset's input loads it back from the materialization of the
run that produced it (this run, or the run a re-execution from failure continues). Nothing is
written beside the buffer, and the UI shows the artifact on the materialization.

A run that fails after its artifact step leaves that materialization without a manifest event
after it. If the failure was an ambiguous manifest write (the connection died, the write landed
later), the artifact is committed although its run failed, and its events were never sent:
`unsettled` finds such a leftover (the newest artifact materialization of the table, when no
manifest materialization or settlement observation came after it) so the next artifact step can
settle it (`TablePipeline.settle`) and record that it did (`settled`).
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from snapshot_assets.archive.manifest import Artifact, load_artifact

ARTIFACT = "artifact"
"""The materialization metadata key that carries the built artifact (its manifest entry, as JSON)."""


def artifact_metadata(art: Artifact) -> dict[str, dg.MetadataValue]:
    return {ARTIFACT: dg.MetadataValue.json(art.to_json())}


def _artifact_of(record: dg.EventLogRecord, source: str) -> Artifact | None:
    """The artifact a materialization record carries (None for one written before the hand-off existed)."""
    materialization = record.asset_materialization
    entry = materialization.metadata.get(ARTIFACT) if materialization is not None else None
    return None if entry is None else load_artifact(entry.value, source=source)


def built_in_run(instance: dg.DagsterInstance, run_id: str, key: dg.AssetKey, partition: str) -> Artifact | None:
    """The artifact that run `run_id` materialized for `key` / `partition`, if it did."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    for record in reversed(records):
        materialization = record.asset_materialization
        if materialization is not None and (materialization.asset_key, materialization.partition) == (key, partition):
            return _artifact_of(record, f"run {run_id} {key.to_user_string()}[{partition}]")
    return None


class ArtifactIOManager(dg.ConfigurableIOManager):
    """Keeps the artifact asset's output in the instance's event log (see the module docstring)."""

    def handle_output(self, context: dg.OutputContext, obj: Artifact) -> None:
        context.add_output_metadata(artifact_metadata(obj))

    def load_input(self, context: dg.InputContext) -> Artifact | None:
        """The artifact the upstream asset built in this run's lineage; None when it did not run there
        (the manifest asset has both artifact assets upstream, a run builds one)."""
        upstream = context.upstream_output
        try:
            run_id = upstream.run_id if upstream is not None else None
        except dg.DagsterInvariantViolationError:  # the upstream asset is not part of this run
            run_id = None
        if run_id is None:
            return None
        return built_in_run(context.instance, run_id, context.asset_key, context.asset_partition_key)


def _latest(fetch: Any, key: dg.AssetKey, partition: str) -> dg.EventLogRecord | None:
    records = fetch(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1).records
    return records[0] if records else None


def unsettled(instance: dg.DagsterInstance, partition: str, built: list[dg.AssetKey],
              manifest: dg.AssetKey) -> Artifact | None:
    """The table's newest built artifact when no manifest materialization or settlement came after it."""
    candidates = [r for r in (_latest(instance.fetch_materializations, k, partition) for k in built) if r is not None]
    if not candidates:
        return None
    newest = max(candidates, key=lambda r: r.storage_id)
    handled = [r.storage_id for r in (_latest(instance.fetch_materializations, manifest, partition),
                                      _latest(instance.fetch_observations, manifest, partition)) if r is not None]
    if handled and max(handled) > newest.storage_id:
        return None
    return _artifact_of(newest, f"run {newest.run_id} [{partition}]")


def settled(art: Artifact, partition: str, manifest: dg.AssetKey, *, committed: bool) -> dg.AssetObservation:
    """The observation that records a leftover as handled, so no later step settles it again."""
    return dg.AssetObservation(asset_key=manifest, partition=partition, metadata={
        "settled": art.describe(), "was_committed": committed, **artifact_metadata(art)})
