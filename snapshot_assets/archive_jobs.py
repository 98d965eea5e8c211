"""Dagster jobs over an existing archive (read side): verify it from the UI or the GraphQL API.

The pipeline adds the partitioned snapshot/diff/manifest assets; this job already lets an operator
point Dagster at any laredo-format archive (ours or laredo's) and get a pass/fail run with every
problem listed in the run's metadata. (No `from __future__ import annotations` here: Dagster reads
the op's config annotation at runtime.)
"""

from typing import Any

import dagster as dg

from resources.destinations.factory import build_destination, location_spec
from snapshot_assets.archive.positions import comparator
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.verify import verify_archive


class ArchiveLocation(dg.Config):
    """Where one table's archive lives: the `snapshotter` CLI's location flags."""

    store: str = "local"
    path: str = "examples/sample-archive"
    bucket: str = ""
    prefix: str = ""
    region: str = ""
    endpoint_url: str = ""
    path_style: bool = False
    key_prefix: str = "users/"
    positions: str = "lsn"
    deep: bool = False

    def reader(self) -> ArchiveReader:
        spec = location_spec(self.store, path=self.path, bucket=self.bucket, prefix=self.prefix,
                             region=self.region or None, endpoint_url=self.endpoint_url or None,
                             path_style=self.path_style)
        return ArchiveReader(build_destination(spec), self.key_prefix, cmp=comparator(self.positions))


@dg.op(description="Check the manifest chain and that every object of every format is present with its size.")
def verify_archive_op(context: dg.OpExecutionContext, config: ArchiveLocation) -> dg.Output[int]:
    reader = config.reader()
    manifest = reader.load_manifest()
    problems = verify_archive(reader, manifest, deep=config.deep)
    metadata: dict[str, Any] = {
        "table": manifest.table,
        "epoch": manifest.epoch,
        "head_position": manifest.head_position,
        "artifacts": len(manifest.artifacts),
        "problems": dg.MetadataValue.md("\n".join(f"- {p}" for p in problems) or "none"),
    }
    if problems:
        raise dg.Failure(description=f"{len(problems)} problem(s) in the archive of {manifest.table}",
                         metadata=metadata)
    context.log.info(f"archive of {manifest.table} verified: {len(manifest.artifacts)} artifacts")
    return dg.Output(len(manifest.artifacts), metadata=metadata)


@dg.job(description="Verify a laredo-format archive (chain, objects, sizes; optionally row counts).")
def verify_archive_job() -> None:
    verify_archive_op()
