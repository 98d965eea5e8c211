"""The snapshot job: previous state + every change since it -> the full table at `to_position`.

What runs where:
  driver  picks nothing big: `bases.choose_base` names the base and the buffer segments; one
          aggregate finds the window's last TRUNCATE (which drops the base); it collects the
          tasks' part reports and the row count (an aggregate), never a row.
  tasks   explode, complete and fold the changes by key (`window.advance`), anti-join them against
          the base (Spark's join), write the new STATE dataset (Spark's Parquet writer), then re-read
          it and encode every snapshot format into part files (`parts.encode_snapshot_parts`).

The STATE dataset written here is the next snapshot's base (`bases.StateBase`), the fast path:
a columnar scan instead of decoding a jsonl artifact. The snapshot parts are encoded from the
written dataset rather than from the join, so the join runs once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from resources.buffer.reader import SegmentRef
from snapshot_assets.spark.bases import Base, StateBase, write_state
from snapshot_assets.spark.effects import default_partitions
from snapshot_assets.spark.parts import BuiltArtifact, collect_parts, encode_snapshot_parts, prepare_staging
from snapshot_assets.spark.window import advance

log = logging.getLogger(__name__)


def build_snapshot(spark: SparkSession, base: Base, segments: Sequence[SegmentRef], to_position: str,
                   key_fields: Sequence[str], formats: Sequence[str], staging_dir: Path | str,
                   state_dir: Path | str, *, partitions: int | None = None) -> BuiltArtifact:
    """Build the snapshot at `to_position` from `base` and the changes of `segments` (which must
    be the window (base.position, to_position]); writes the new STATE dataset to `state_dir` and
    stages every format. `details["state"]` is the written `StateBase`."""
    if not to_position:
        raise ValueError("a snapshot needs a non-empty position")
    if not formats:
        raise ValueError("a snapshot needs at least one format")
    started = time.monotonic()
    fields, fmts = tuple(key_fields), tuple(formats)
    staging = prepare_staging(staging_dir, fmts)
    width = partitions or default_partitions(spark)
    table, truncated = advance(spark, base, segments, fields, partitions=width, scratch=staging / "_work")
    state = write_state(table, state_dir, to_position, fields)
    reports = encode_snapshot_parts(spark.read.schema("key STRING, row STRING").parquet(state.path), staging,
                                    fmts, fields)
    staged, rows = collect_parts(reports, fmts)
    if rows != state.rows:
        raise RuntimeError(f"snapshot parts hold {rows} rows but the state dataset {state.rows}")
    built = BuiltArtifact("snapshot", None, to_position, rows, staged, truncated, time.monotonic() - started,
                          {"state": state, "base": base.describe(), "segments": len(segments)})
    log.info("snapshot at %s from %s + %d segments%s: %d rows in %.2fs", to_position, base.describe(),
             len(segments), " (TRUNCATE drops the base)" if truncated else "", rows, built.seconds)
    return built


__all__ = ["StateBase", "build_snapshot"]
