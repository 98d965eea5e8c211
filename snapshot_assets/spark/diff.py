"""The diff job: buffer changes in (from, to] -> one net change per key -> every diff format, staged as parts.

What runs where:
  driver  lists nothing big: the segment paths come from the buffer index; one aggregate finds the
          last TRUNCATE; it writes the TRUNCATE part (part 0, so the TRUNCATE is first in every
          format) and collects the tasks' part reports.
  tasks   read the segment files (seq-filtered), explode changes into key effects, complete their
          images against the base (`images`: unchanged TOASTed values, before-images), fold each
          key after the shuffle by key (`window.net_window`), write the net changes once as the
          state's delta for this step (`bases.DeltaSet`), each with its new image's state bytes
          and its records in the diff's formats, encoded in one pass (`diff_records`), and join
          those records in key order into the parts, with the keys' versions beside them
          (`diff_pieces.encode_diff`): the net changes never leave the executors. With
          `targets` each task sends its parts straight into the destinations (pieces.py), so a
          cluster whose hosts share only S3 builds the same objects as a local runtime.

The result equals `algebra.collapse` over the same window up to the order of the per-key changes
(each touches only its own key, so order does not change what a reader folds); the TRUNCATE, if
any, comes first. `assemble.py` turns the parts into the objects the archive layout names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from resources.buffer.reader import SegmentRef
from resources.buffer.segments import TYPED_COLUMN
from resources.destinations.s3 import S3Connection
from snapshot_assets.archive import versions
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.spark.bases import Base, write_delta
from snapshot_assets.spark.diff_pieces import encode_diff
from snapshot_assets.spark.effects import window_partitions
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.parquet_artifact import infer_row_schema, write_diff
from snapshot_assets.spark.parts import (
    BuiltArtifact,
    PartSink,
    StagedFormat,
    collect_parts,
    prepare_staging,
)
from snapshot_assets.spark.pieces import Targets, Uploads
from snapshot_assets.spark.window import net_window

log = logging.getLogger(__name__)
#: What a diff's log line says of a window without before-images (`details["before_images"]` false).
INSERTS_ONLY_NOTE = "INSERTs only: no before-images"

TRUNCATE_PART = 0  # the driver's part; task parts are numbered from 1


def build_diff(spark: SparkSession, segments: Sequence[SegmentRef], base: Base, to_position: str,
               key_fields: Sequence[str], formats: Sequence[str], staging_dir: Path | str | Location,
               delta_dir: Path | str | Location, *, partitions: int | None = None, state_formats: Sequence[str] = (),
               schema: RowSchema | None = None, targets: Targets | None = None,
               buffer_s3: S3Connection | None = None) -> BuiltArtifact:
    """Collapse the buffer changes of `segments` (the window (base.position, to]) and stage every diff format.

    `base` is the table at the diff's `from` (the images the window's changes omit come from it);
    the net changes are written to `delta_dir` (the state's step to `to_position`, see
    `bases.DeltaSet`) and the parts are encoded from there. `details["delta"]` is that DeltaSet;
    `details["before_images"]` whether any net change can have one (false: INSERTs only,
    `effects.WindowFacts.befores`).
    `partitions` is the shuffle width (default `effects.window_partitions`); `state_formats` are the
    snapshot formats the delta's new images are encoded for (`state.encode_net`), so the next
    snapshot merges their bytes instead of encoding them; `schema` types the parquet diff (None:
    inferred from the diff's own images).

    Locations as for `snapshot.build_snapshot`: with `targets` the tasks send their parts into the
    destinations (required when staging is in S3); `buffer_s3` signs the reads of segments in S3.
    The net changes are encoded in key order, so the objects' bytes do not depend on how the
    delta's files are split into tasks (the same on a local runtime and a cluster).
    """
    from_position = base.position
    if not from_position or not to_position or from_position == to_position:
        raise ValueError(f"a diff needs two different, non-empty positions (got {from_position!r}, {to_position!r})")
    if not formats:
        raise ValueError("a diff needs at least one format")
    started = time.monotonic()
    fields, fmts = tuple(key_fields), tuple(formats)
    staging = prepare_staging(staging_dir, fmts)
    if staging.remote and targets is None:
        raise ValueError(f"staging {staging.uri} is in S3: the build needs its targets (the tasks send the parts)")
    width = partitions or window_partitions(spark, segments)
    encoded = tuple(f for f in fmts if f != "parquet")  # record formats: the project's writers, per net change
    keys = {f: targets.key("diff", from_position, to_position, get_format(f).extension)
            for f in fmts} if targets is not None else {}
    uploads: Uploads | None = None
    try:
        if targets is not None:
            sidecar = targets.key("diff", from_position, to_position, versions.EXTENSION)
            uploads = Uploads.begin(targets.destinations, {**{f: keys[f] for f in encoded}, VERSIONS: sidecar},
                                    width + 1)
            if "parquet" in fmts and staging.remote:
                uploads = uploads.merged(Uploads.begin(targets.destinations, {"parquet": keys["parquet"]}, 1))
        built = _build(spark, segments, base, to_position, fields, fmts, encoded, staging, delta_dir, width,
                       state_formats, schema, uploads, buffer_s3)
    except BaseException:
        if uploads is not None:
            uploads.abort()
        raise
    built = replace(built, seconds=time.monotonic() - started)
    log.info("diff (%s, %s]: %d net changes%s%s from %d segments in %.2fs", from_position, to_position, built.count,
             " (TRUNCATE first)" if built.truncated else "",
             "" if built.details["before_images"] else f" ({INSERTS_ONLY_NOTE})", len(segments),
             built.seconds)
    return built


def _build(spark: SparkSession, segments: Sequence[SegmentRef], base: Base, to_position: str,
           fields: tuple[str, ...], fmts: tuple[str, ...], encoded: tuple[str, ...], staging: Location,
           delta_dir: Path | str | Location, width: int, state_formats: Sequence[str], schema: RowSchema | None,
           uploads: Uploads | None, buffer_s3: S3Connection | None) -> BuiltArtifact:
    from_position = base.position
    assert from_position is not None
    local = None if uploads is not None else staging.path
    window = net_window(spark, segments, base, fields, partitions=width, scratch=staging / "_work", s3=buffer_s3)
    # The new images' typed columns, made once here for the parquet diff and the next snapshot alike
    # (when the diff writes no parquet, the snapshot types its rows: a value that does not fit its
    # column fails the build that writes parquet, as it always did).
    cells = schema if schema is not None and "parquet" in fmts else None
    delta = write_delta(window.net, delta_dir, from_position, to_position, window.truncated, fields, state_formats,
                        cells, diff_formats=encoded)
    ordered = delta.record_frame(spark, encoded).repartitionByRange(width, "key").sortWithinPartitions("key")
    reports, versions_object = encode_diff(ordered, local, encoded, first_part=TRUNCATE_PART + 1, uploads=uploads,
                                           truncate=(window.truncate_version or "") if window.truncated else None)
    if window.truncated and encoded:
        sink = PartSink(local, encoded, TRUNCATE_PART, "diff", fields, uploads)
        sink.write(Change(Action.TRUNCATE))
        reports.extend(dict(zip(("format", "part", "path", "bytes", "count"), r, strict=True)) for r in sink.close())
    staged, count = collect_parts(reports, encoded, sent=uploads is not None)
    sidecars = {VERSIONS: versions_object}
    if "parquet" in fmts:  # Spark's writer, one file, typed by the table's schema or the diff's own images
        typed = delta.typed_frame(spark, cells) if cells is not None else None
        net = typed if typed is not None else delta.frame(spark)
        sent = uploads if uploads is not None and "parquet" in uploads.by_format else None
        written = write_diff(net, schema or infer_row_schema(net, texts=("old", "new")),
                             None if sent is not None else staging.path / "parquet" / "diff.parquet", fields,
                             truncated=window.truncated, uploads=sent,
                             new_cells=TYPED_COLUMN if typed is not None else None, befores=window.befores)
        if encoded and written.rows != count:
            raise RuntimeError(f"the parquet diff holds {written.rows} changes, the other formats {count}")
        staged["parquet"], count = StagedFormat("parquet", (written.path,), written.bytes), written.rows
    return BuiltArtifact("diff", from_position, to_position, count, staged, window.truncated, 0.0,
                         {"segments": len(segments), "partitions": width, "delta": delta,
                          "before_images": window.befores}, uploads, sidecars)
