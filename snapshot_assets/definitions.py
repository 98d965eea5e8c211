"""The code location: everything Dagster loads from `snapshot_assets.definitions`.

The configuration (`SNAPSHOTTER_CONFIG`, else the shipped demo config) decides the partitions
(one per table) and the Spark runtime; nothing connects to a source, a store or Spark at import.
"""

import dagster as dg

from resources.spark import SparkResource
from sensors.ingest_supervisor import ingest_supervisor
from sensors.outbox_retry import outbox_retry
from sensors.rebase_trigger import rebase_trigger
from sensors.run_failure import run_failure_alert
from snapshot_assets.archive_jobs import verify_archive_job
from snapshot_assets.assets import archive_is_sound, change_buffer, diff, manifest, snapshot
from snapshot_assets.jobs import diff_job, force_snapshot, ingest_job, reconstruct_job, snapshot_job
from snapshot_assets.redaction import install_log_redaction
from snapshot_assets.tables import config

install_log_redaction()  # every Dagster process of the code location (server, daemon, runs) imports this
_spark = config().spark

defs = dg.Definitions(
    assets=[change_buffer, snapshot, diff, manifest],
    asset_checks=[archive_is_sound],
    jobs=[diff_job, snapshot_job, force_snapshot, ingest_job, reconstruct_job, verify_archive_job],
    sensors=[rebase_trigger, ingest_supervisor, outbox_retry, run_failure_alert],
    resources={"spark": SparkResource(remote=_spark.remote, master=_spark.master, conf=dict(_spark.conf))},
)
