"""A window of buffer changes as one net change per key, with complete row images.

The one path every build takes from buffer segments to net changes: read the window (seq-filtered
segments), cut it at its last TRUNCATE, explode changes into per-key effects (written once, so the
steps after it never recompute the Python explode), complete their images against the base
(`images.resolve_images`: unchanged TOASTed values, before-images), fold each key.
`advance` applies that to the base: the table at the window's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from resources.buffer.reader import SegmentRef
from snapshot_assets.spark.bases import Base
from snapshot_assets.spark.effects import (
    EFFECT_DDL,
    apply_net,
    effective_window,
    explode,
    materialize,
    net_changes,
    read_window,
    spread_for,
)
from snapshot_assets.spark.images import resolve_images


@dataclass(frozen=True, slots=True)
class NetWindow:
    """The net changes of a window (NET_DDL rows) and whether it held a TRUNCATE (written first)."""

    net: DataFrame
    truncated: bool


def net_window(spark: SparkSession, segments: Sequence[SegmentRef], base: Base, key_fields: Sequence[str], *,
               partitions: int, scratch: Path) -> NetWindow:
    """The window `segments` (which must start at `base.position`) as one net change per key."""
    fields = tuple(key_fields)
    window = effective_window(read_window(spark, segments))
    effects = materialize(explode(window.changes, fields, spread=spread_for(segments, partitions)),
                          scratch / "effects", EFFECT_DDL)
    complete = resolve_images(spark, effects, None if window.truncated else base, fields, partitions=partitions,
                              scratch=scratch / "images", window=window.changes)
    return NetWindow(net_changes(complete, fields, truncated=window.truncated, partitions=partitions),
                     window.truncated)


def advance(spark: SparkSession, base: Base, segments: Sequence[SegmentRef], key_fields: Sequence[str], *,
            partitions: int, scratch: Path) -> tuple[DataFrame, bool]:
    """The table at the end of `segments` (STATE_DDL), and whether a TRUNCATE dropped the base."""
    if not segments:
        return base.frame(spark, key_fields), False
    window = net_window(spark, segments, base, key_fields, partitions=partitions, scratch=scratch)
    previous = base.frame(spark, key_fields)
    if window.truncated:
        previous = previous.limit(0)  # the TRUNCATE wiped the base
    return apply_net(previous, window.net), window.truncated
