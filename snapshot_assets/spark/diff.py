"""The diff job: buffer changes in (from, to] -> one net change per key -> every diff format, staged as parts.

What runs where:
  driver  lists nothing big: the segment paths come from the buffer index; one aggregate finds the
          last TRUNCATE; it writes the TRUNCATE part (part 0, so the TRUNCATE is first in every
          format) and collects the tasks' part reports.
  tasks   read the segment files (seq-filtered), explode changes into key effects, and after the
          shuffle by key fold each key and encode its net change straight into the part files
          (`effects.fold_sorted` -> `parts.PartSink`): the net changes never leave the executors.

The result equals `algebra.collapse` over the same window up to the order of the per-key changes
(each touches only its own key, so order does not change what a reader folds); the TRUNCATE, if
any, comes first. `assemble.py` turns the parts into the objects the archive layout names.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from resources.buffer.reader import SegmentRef
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.spark.effects import (
    default_partitions,
    effective_window,
    explode,
    fold_sorted,
    group_by_key,
    read_window,
    spread_for,
)
from snapshot_assets.spark.parts import (
    PART_DDL,
    BuiltArtifact,
    PartSink,
    collect_parts,
    prepare_staging,
    task_index,
    write_items,
)

log = logging.getLogger(__name__)

TRUNCATE_PART = 0  # the driver's part; task parts are numbered from 1


def _diff_task(batches: Iterable[Any], staging_dir: str, formats: tuple[str, ...], key_fields: tuple[str, ...],
               truncated: bool) -> Iterator[Any]:
    changes = (net.change for net in fold_sorted(batches, key_fields, truncated=truncated))
    return write_items(changes, staging_dir, formats, task_index(TRUNCATE_PART + 1), "diff", key_fields)


def build_diff(spark: SparkSession, segments: Sequence[SegmentRef], from_position: str, to_position: str,
               key_fields: Sequence[str], formats: Sequence[str], staging_dir: Path | str, *,
               partitions: int | None = None) -> BuiltArtifact:
    """Collapse the buffer changes of `segments` (the window (from, to]) and stage every diff format.

    `partitions` is the shuffle width (default `spark.sql.shuffle.partitions`), hence the number
    of parts per format at most (empty partitions write none).
    """
    if not from_position or not to_position or from_position == to_position:
        raise ValueError(f"a diff needs two different, non-empty positions (got {from_position!r}, {to_position!r})")
    if not formats:
        raise ValueError("a diff needs at least one format")
    started = time.monotonic()
    fields, fmts = tuple(key_fields), tuple(formats)
    staging = prepare_staging(staging_dir, fmts)
    window = effective_window(read_window(spark, segments))
    width = partitions or default_partitions(spark)
    func = functools.partial(_diff_task, staging_dir=str(staging), formats=fmts, key_fields=fields,
                             truncated=window.truncated)
    effects = explode(window.changes, fields, spread=spread_for(segments, width))
    reports: list[Any] = list(group_by_key(effects, width).mapInArrow(func, PART_DDL).collect())
    if window.truncated:
        sink = PartSink(staging, fmts, TRUNCATE_PART, "diff", fields)
        sink.write(Change(Action.TRUNCATE))
        reports.extend(dict(zip(("format", "part", "path", "bytes", "count"), r, strict=True)) for r in sink.close())
    staged, count = collect_parts(reports, fmts)
    built = BuiltArtifact("diff", from_position, to_position, count, staged, window.truncated,
                          time.monotonic() - started, {"segments": len(segments), "partitions": width})
    log.info("diff (%s, %s]: %d net changes%s from %d segments in %.2fs", from_position, to_position, count,
             " (TRUNCATE first)" if window.truncated else "", len(segments), built.seconds)
    return built
