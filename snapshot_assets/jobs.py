"""Jobs: artifact runs (diff, snapshot, forced snapshot), the long-running ingest runs, reconstruct, restore.

`force_snapshot` is what an operator launches from the UI or over GraphQL (`launchRun` /
`DagsterGraphQLClient.submit_job_execution` with the table as the partition, tag
`dagster/partition`). One writer per table: the run queue allows one run per partition at a time
(dagster.yaml), and the manifest compare-and-swap refuses a second writer anyway.
"""

import functools
import threading

import dagster as dg

from resources.buffer_resource import ChangeBufferResource
from resources.destinations_resource import DestinationsResource
from resources.sinks_resource import EventSinksResource
from resources.spark import SparkResource
from resources.subscriber_resource import SubscriberResource
from snapshot_assets.assets import diff, manifest, snapshot
from snapshot_assets.restore.errors import RestoreError
from snapshot_assets.restore.run import DEFAULT_STREAM_MAX_ROWS
from snapshot_assets.run_history import INGEST_JOB
from snapshot_assets.services import ingest_table as ingest_loop
from snapshot_assets.services import run_ingest_service
from snapshot_assets.tables import INGEST_TABLE_TAG, config, pipeline, table_pipeline

#: The artifact jobs run their steps (the artifact, the manifest, the archive check) one after the
#: other in the run's own process, as `snapshotter run --once` does. Dagster's default executor
#: starts a process per step: each imports Dagster, PySpark and this project and opens its own Spark
#: session again, seconds of CPU per step for steps that never run side by side anyway (each needs
#: the one before), and a sensor launches such a run every few seconds under load.
ARTIFACT_EXECUTOR = dg.in_process_executor

diff_job = dg.define_asset_job("diff_job", selection=[diff, manifest], executor_def=ARTIFACT_EXECUTOR,
                               description="Write a diff (the net change per key since the head) and commit it.")
snapshot_job = dg.define_asset_job("snapshot_job", selection=[snapshot, manifest], executor_def=ARTIFACT_EXECUTOR,
                                   description="Re-base: write a snapshot and commit it (requested by the trigger).")
force_snapshot = dg.define_asset_job(
    "force_snapshot", selection=[snapshot, manifest], executor_def=ARTIFACT_EXECUTOR,
    description="Write a snapshot of the table now, whatever the policy says, and commit it as a new epoch.")


@dg.op(description="Run one table's subscriber into its change buffer until the run is terminated.")
def ingest_table(context: dg.OpExecutionContext, subscribers: SubscriberResource,
                 change_buffers: ChangeBufferResource) -> None:
    """Ingest the table named by the run's `snapshotter/ingest_table` tag, from the subscriber the
    `subscribers` resource opens into the buffer the `change_buffers` resource opens.

    One run per table (not one run for all tables): a table's ingest failing, crashing or being
    killed ends only its own run, so the others keep running; the failure is that table's failed
    run in Dagster's records, which `snapshotter status`, the metrics and the run-failure alert read
    (tag-filtered), and the ingest_supervisor sensor relaunches that table alone with backoff. An
    in-process supervisor restarting threads could do neither for a crash of the process itself
    (kill -9, out of memory), and would need a side channel for status to see a restarting table.
    """
    table = context.run.tags.get(INGEST_TABLE_TAG, "")
    if not table:
        names = ", ".join(t.name for t in config().tables)
        raise dg.Failure(f"{INGEST_JOB} feeds one table: launch it with the tag {INGEST_TABLE_TAG}=<schema.table> "
                         f"(the ingest_supervisor sensor does); configured: {names}")
    try:
        chosen = config().table(table)
    except KeyError as e:
        raise dg.Failure(str(e.args[0])) from None
    loop = functools.partial(ingest_loop, subscribers=subscribers, buffers=change_buffers)
    try:
        (outcome,) = run_ingest_service(config(), [chosen.name], stop=threading.Event(), ingest=loop)
    except BaseException:  # terminated (SIGTERM, Dagster's termination): sealed by now
        _stopped(context, chosen.name)
        raise
    if outcome.error is not None:
        raise dg.Failure(f"ingest of {outcome.table} failed: {type(outcome.error).__name__}: {outcome.error}")
    context.log.info(f"{outcome.table}: the source ended")


def _stopped(context: dg.OpExecutionContext, table: str) -> None:
    """Graceful shutdown (snapshot_assets/shutdown.py): submit the table's final diff to the code
    location this run came from, and end the run CANCELED, not FAILURE.

    A SIGTERM from outside Dagster (a pod deleted on a redeploy) is a stop request, as Dagster's
    own termination is; Dagster records an interruption it did not request as a failure, which
    would alert and delay the supervisor's relaunch by the failure backoff. Marking the run
    CANCELING first makes Dagster end it CANCELED. Failures here are logged, never raised over
    the interruption.
    """
    from snapshot_assets.launch import launcher_for_run
    from snapshot_assets.shutdown import request_final_artifacts

    run = context.instance.get_run_by_id(context.run_id)
    if run is not None and run.status not in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED):
        context.instance.report_run_canceling(run, message=f"{table}: ingest stopped by a signal (graceful shutdown)")
    try:
        with launcher_for_run(context.instance, context.run) as launcher:
            (request,) = request_final_artifacts([pipeline(table)], context.instance, launcher.submit)
        context.log.info(f"{table}: stopped; {request.detail}")
    except Exception as e:
        context.log.warning(f"{table}: stopped; the final artifact could not be requested: {type(e).__name__}: {e}")


@dg.job(name=INGEST_JOB, description="The long-running ingest run of one table (tag snapshotter/ingest_table); "
                                     "the ingest_supervisor sensor keeps one alive per table.")
def ingest_job() -> None:
    ingest_table()


class ReconstructConfig(dg.Config):
    """Rebuild a table from its archive, as of a position (default: the head), into a path."""

    table: str
    position: str = ""
    output_path: str
    format: str = "parquet"


@dg.op(description="Rebuild the table as of a position from the archive, with Spark, into a path.")
def reconstruct_table(context: dg.OpExecutionContext, config: ReconstructConfig, spark: SparkResource,
                      destinations: DestinationsResource, event_sinks: EventSinksResource) -> dg.Output[int]:
    from snapshot_assets.archive.positions import comparator
    from snapshot_assets.archive.reader import ArchiveReader
    from snapshot_assets.spark.reconstruct import reconstruct_to_path

    pipe = table_pipeline(config.table, destinations, event_sinks)
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


class RestoreConfig(dg.Config):
    """Write a table as of a pinned snapshot (`label`) or a position into PostgreSQL (see
    snapshot_assets/restore). Give `into` as `{env: VAR}` in the run config to keep the DSN's
    password out of the run's stored config."""

    table: str
    label: str = ""
    position: str = ""
    into: str
    target_table: str = ""
    replace: bool = False
    stream_max_rows: int = DEFAULT_STREAM_MAX_ROWS


@dg.op(description="Write the table as of a pinned snapshot or a position from the archive into PostgreSQL.")
def restore_into_postgres(context: dg.OpExecutionContext, config: RestoreConfig, destinations: DestinationsResource,
                          event_sinks: EventSinksResource) -> dg.Output[int]:
    """Spark is opened (from the configuration's `spark` block) only when the table is larger than
    `stream_max_rows`: a small restore does not wait for a session it would not use, which the
    `spark` resource, set up before the op starts, would make it do."""
    from snapshot_assets import tables
    from snapshot_assets.restore.run import restore_table, spark_from_config

    if bool(config.label) == bool(config.position):
        raise dg.Failure("restore needs exactly one of `label` (a pinned snapshot) and `position`")
    pipe = table_pipeline(config.table, destinations, event_sinks)
    try:
        result = restore_table(pipe.destinations[0], pipe.cfg.key_prefix, into=config.into,
                               label=config.label or None, position=config.position or None,
                               target_table=config.target_table or None, replace=config.replace,
                               stream_max_rows=config.stream_max_rows, spark=spark_from_config(tables.config().spark),
                               cmp=pipe.cmp, fallback_key=pipe.cfg.key_fields)
    except RestoreError as e:
        raise dg.Failure(str(e)) from None
    context.log.info(result.describe())
    return dg.Output(result.rows, metadata={
        "position": result.position, "label": result.label or "", "target": result.target,
        "rows": dg.MetadataValue.int(result.rows), "path": result.path, "replaced": result.replaced,
        "seconds": dg.MetadataValue.float(result.seconds)})


@dg.job(description="Restore a table from its archive (a pinned snapshot or a position) into PostgreSQL.")
def restore() -> None:
    restore_into_postgres()
