"""PySpark jobs: diff, snapshot and reconstruct over the change buffer and the archive.

Every job reuses the archive's single-process code inside Spark tasks (the change algebra, the
format writers and readers) and only adds the distribution: read files, shuffle by key, write
parts. `session.open_spark` provides the runtime (a local Spark Connect server by default).
"""

from snapshot_assets.spark.assemble import assemble
from snapshot_assets.spark.bases import ArtifactBase, BufferSnapshotBase, EmptyBase, StateBase, choose_base
from snapshot_assets.spark.connect_server import stop_local_connect_server
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.parts import BuiltArtifact, StagedFormat, StagingNotShared
from snapshot_assets.spark.reconstruct import Reconstructed, reconstruct_to_path
from snapshot_assets.spark.session import SparkRuntime, open_spark
from snapshot_assets.spark.snapshot import build_snapshot

__all__ = [
    "ArtifactBase",
    "BufferSnapshotBase",
    "BuiltArtifact",
    "EmptyBase",
    "Reconstructed",
    "SparkRuntime",
    "StagedFormat",
    "StagingNotShared",
    "StateBase",
    "assemble",
    "build_diff",
    "build_snapshot",
    "choose_base",
    "open_spark",
    "reconstruct_to_path",
    "stop_local_connect_server",
]
