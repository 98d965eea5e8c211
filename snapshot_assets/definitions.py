"""The code location: everything Dagster loads from `snapshot_assets.definitions`.

The configuration (`SNAPSHOTTER_CONFIG`, else the shipped demo config) decides the partitions
(one per table) and the Spark runtime; nothing connects to a source, a store or Spark at import.
The resources are the ones the assets, checks and jobs use:
  spark                dagster-pyspark's PySparkResource, pointed at a Spark Connect server (the local
                       one by default, started on first use) or a master (`resources/spark.py`);
  s3                   dagster-aws's S3Resource signed as a credentials profile: the S3 defaults of every
                       S3 destination (endpoint, region, path style, profile; a destination's own keys win);
  destinations         each table's archive destinations, S3 ones with clients from `s3`;
  event_sinks          each table's event sinks (SNS, SQS, Kinesis, file);
  subscribers          opens the source stream a table's ingest run reads;
  change_buffers       opens the change buffer the ingest run appends to;
  artifact_io_manager  hands the built artifact from snapshot/diff to manifest through the instance;
  capture              the event capture block's page storage and index (snapshot_assets/capture).
"""

import dagster as dg

from resources.buffer_resource import ChangeBufferResource
from resources.destinations_resource import DestinationsResource
from resources.s3_resource import ProfiledS3Resource
from resources.sinks_resource import EventSinksResource
from resources.spark import SparkResource
from resources.subscriber_resource import SubscriberResource
from sensors.group_cut import group_cut
from sensors.ingest_supervisor import ingest_supervisor
from sensors.outbox_retry import outbox_retry
from sensors.rebase_trigger import rebase_trigger
from sensors.run_failure import run_failure_alert
from snapshot_assets.archive_jobs import verify_archive_job
from snapshot_assets.assets import ARTIFACT_IO, archive_is_sound, change_buffer, diff, manifest, snapshot
from snapshot_assets.capture.assets import capture_index_matches_storage, capture_pages
from snapshot_assets.capture.jobs import capture_reconcile_job, capture_reconcile_schedule
from snapshot_assets.capture.observe import capture_pages_observer
from snapshot_assets.capture.resource import CaptureResource
from snapshot_assets.groups.jobs import group_cut_job, reconstruct_group_job
from snapshot_assets.handoff import ArtifactIOManager
from snapshot_assets.jobs import diff_job, force_snapshot, ingest_job, reconstruct_job, restore, snapshot_job
from snapshot_assets.process_exit import skip_final_collection
from snapshot_assets.redaction import install_log_redaction
from snapshot_assets.tables import config

install_log_redaction()  # every Dagster process of the code location (server, daemon, runs) imports this
skip_final_collection()  # the same processes exit without their last collections (process_exit.py)


def resources() -> dict[str, object]:
    """The code location's resources. `s3` is configured at launch (launchpad or `run_config`
    `resources.s3.config`: endpoint_url, region_name, path_style, credentials, max_attempts), and
    the same instance is nested in `destinations`, so what a run sets there reaches its S3 destinations."""
    s3 = ProfiledS3Resource.configure_at_launch()
    return {
        "spark": SparkResource.from_config(config().spark),
        "s3": s3,
        "destinations": DestinationsResource(s3=s3),
        "event_sinks": EventSinksResource(),
        "subscribers": SubscriberResource(),
        "change_buffers": ChangeBufferResource(),
        ARTIFACT_IO: ArtifactIOManager(),
        "capture": CaptureResource(),
    }


defs = dg.Definitions(
    assets=[change_buffer, snapshot, diff, manifest, capture_pages],
    asset_checks=[archive_is_sound, capture_index_matches_storage],
    jobs=[diff_job, snapshot_job, force_snapshot, ingest_job, reconstruct_job, verify_archive_job,
          capture_reconcile_job, restore, group_cut_job, reconstruct_group_job],
    schedules=[capture_reconcile_schedule],
    sensors=[rebase_trigger, ingest_supervisor, outbox_retry, run_failure_alert, capture_pages_observer, group_cut],
    resources=resources(),
)
