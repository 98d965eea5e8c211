"""The diff job: buffer changes in (from, to] -> one net change per key -> every diff format, staged as parts.

What runs where:
  driver  lists nothing big: the segment paths come from the buffer index; one aggregate finds the
          last TRUNCATE; it writes the TRUNCATE part (part 0, so the TRUNCATE is first in every
          format) and collects the tasks' part reports.
  tasks   read the segment files (seq-filtered), explode changes into key effects, complete their
          images against the base (`images`: unchanged TOASTed values, before-images), fold each
          key after the shuffle by key (`window.net_window`), write the net changes once as the
          state's delta for this step (`bases.DeltaSet`), and encode the part files from it
          (`parts.encode_diff_parts`): the net changes never leave the executors.

The result equals `algebra.collapse` over the same window up to the order of the per-key changes
(each touches only its own key, so order does not change what a reader folds); the TRUNCATE, if
any, comes first. `assemble.py` turns the parts into the objects the archive layout names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from resources.buffer.reader import SegmentRef
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.spark.bases import Base, write_delta
from snapshot_assets.spark.effects import default_partitions
from snapshot_assets.spark.parquet_artifact import infer_row_schema, write_diff
from snapshot_assets.spark.parts import (
    BuiltArtifact,
    PartSink,
    StagedFormat,
    collect_parts,
    encode_diff_parts,
    prepare_staging,
)
from snapshot_assets.spark.window import net_window

log = logging.getLogger(__name__)

TRUNCATE_PART = 0  # the driver's part; task parts are numbered from 1


def build_diff(spark: SparkSession, segments: Sequence[SegmentRef], base: Base, to_position: str,
               key_fields: Sequence[str], formats: Sequence[str], staging_dir: Path | str, delta_dir: Path | str, *,
               partitions: int | None = None, state_formats: Sequence[str] = (),
               schema: RowSchema | None = None) -> BuiltArtifact:
    """Collapse the buffer changes of `segments` (the window (base.position, to]) and stage every diff format.

    `base` is the table at the diff's `from` (the images the window's changes omit come from it);
    the net changes are written to `delta_dir` (the state's step to `to_position`, see
    `bases.DeltaSet`) and the parts are encoded from there. `details["delta"]` is that DeltaSet.
    `partitions` is the shuffle width (default `spark.sql.shuffle.partitions`); `state_formats` are the
    snapshot formats the delta's new images are encoded for (`state.encode_net`), so the next
    snapshot merges their bytes instead of encoding them; `schema` types the parquet diff (None:
    inferred from the diff's own images).
    """
    from_position = base.position
    if not from_position or not to_position or from_position == to_position:
        raise ValueError(f"a diff needs two different, non-empty positions (got {from_position!r}, {to_position!r})")
    if not formats:
        raise ValueError("a diff needs at least one format")
    started = time.monotonic()
    fields, fmts = tuple(key_fields), tuple(formats)
    staging = prepare_staging(staging_dir, fmts)
    width = partitions or default_partitions(spark)
    window = net_window(spark, segments, base, fields, partitions=width, scratch=staging / "_work")
    delta = write_delta(window.net, delta_dir, from_position, to_position, window.truncated, fields, state_formats)
    encoded = tuple(f for f in fmts if f != "parquet")  # record formats: the project's writers, per net change
    reports = encode_diff_parts(delta.frame(spark), staging, encoded, fields, first_part=TRUNCATE_PART + 1) \
        if encoded else []
    if window.truncated and encoded:
        sink = PartSink(staging, encoded, TRUNCATE_PART, "diff", fields)
        sink.write(Change(Action.TRUNCATE))
        reports.extend(dict(zip(("format", "part", "path", "bytes", "count"), r, strict=True)) for r in sink.close())
    staged, count = collect_parts(reports, encoded)
    if "parquet" in fmts:  # Spark's writer, one file, typed by the table's schema or the diff's own images
        net = delta.frame(spark)
        written = write_diff(net, schema or infer_row_schema(net, texts=("old", "new")),
                             staging / "parquet" / "diff.parquet", fields, truncated=window.truncated)
        if encoded and written.rows != count:
            raise RuntimeError(f"the parquet diff holds {written.rows} changes, the other formats {count}")
        staged["parquet"], count = StagedFormat("parquet", (written.path,), written.bytes), written.rows
    built = BuiltArtifact("diff", from_position, to_position, count, staged, window.truncated,
                          time.monotonic() - started,
                          {"segments": len(segments), "partitions": width, "delta": delta})
    log.info("diff (%s, %s]: %d net changes%s from %d segments in %.2fs", from_position, to_position, count,
             " (TRUNCATE first)" if window.truncated else "", len(segments), built.seconds)
    return built
