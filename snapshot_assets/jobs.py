"""Jobs: artifact runs (diff, snapshot, forced snapshot), the long-running ingest run, reconstruct.

`force_snapshot` is what an operator launches from the UI or over GraphQL (`launchRun` /
`DagsterGraphQLClient.submit_job_execution` with the table as the partition, tag
`dagster/partition`). One writer per table: the run queue allows one run per partition at a time
(dagster.yaml), and the manifest compare-and-swap refuses a second writer anyway.
"""

import threading

import dagster as dg

from resources.spark import SparkResource
from snapshot_assets.assets import diff, manifest, snapshot
from snapshot_assets.services import run_ingest_service
from snapshot_assets.tables import config, pipeline

diff_job = dg.define_asset_job("diff_job", selection=[diff, manifest],
                               description="Write a diff (the net change per key since the head) and commit it.")
snapshot_job = dg.define_asset_job("snapshot_job", selection=[snapshot, manifest],
                                   description="Re-base: write a snapshot and commit it (requested by the trigger).")
force_snapshot = dg.define_asset_job(
    "force_snapshot", selection=[snapshot, manifest],
    description="Write a snapshot of the table now, whatever the policy says, and commit it as a new epoch.")


@dg.op(description="Run every configured table's subscriber into its change buffer until the run is terminated.")
def ingest_tables(context: dg.OpExecutionContext) -> None:
    stop = threading.Event()
    outcomes = run_ingest_service(config(), stop=stop)
    failed = [o for o in outcomes if o.error is not None]
    for o in outcomes:
        context.log.info(f"{o.table}: {'failed: ' + str(o.error) if o.error else 'source ended'}")
    if failed:
        raise dg.Failure(f"ingest failed for {', '.join(o.table for o in failed)}: {failed[0].error}")


@dg.job(description="The long-running ingest run (kept alive by the ingest_supervisor sensor).",
        tags={"snapshotter/ingest": "all"})
def ingest_job() -> None:
    ingest_tables()


class ReconstructConfig(dg.Config):
    """Rebuild a table from its archive, as of a position (default: the head), into a path."""

    table: str
    position: str = ""
    output_path: str
    format: str = "parquet"


@dg.op(description="Rebuild the table as of a position from the archive, with Spark, into a path.")
def reconstruct_table(context: dg.OpExecutionContext, config: ReconstructConfig,
                      spark: SparkResource) -> dg.Output[int]:
    from snapshot_assets.archive.positions import comparator
    from snapshot_assets.archive.reader import ArchiveReader
    from snapshot_assets.spark.reconstruct import reconstruct_to_path

    pipe = pipeline(config.table)
    reader = ArchiveReader(pipe.destinations[0], pipe.cfg.key_prefix, key_fields=pipe.key_fields,
                           cmp=comparator("lsn"))
    result = reconstruct_to_path(spark.spark_session, reader, config.position or None, config.output_path,
                                 config.format)
    if result is None:
        raise dg.Failure(f"the archive of {config.table} cannot reach position {config.position}: "
                         "it is before the first snapshot")
    context.log.info(f"{config.table} at {result.position}: {result.rows} rows → {config.output_path}")
    return dg.Output(result.rows, metadata={"position": result.position, "rows": result.rows,
                                            "path": config.output_path, "format": config.format})


@dg.job(description="Rebuild a table at a position from its archive (Spark) into a path.")
def reconstruct_job() -> None:
    reconstruct_table()
