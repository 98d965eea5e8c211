"""A window of buffer changes as one net change per key, with complete row images.

The one path every build takes from buffer segments to net changes (effects.py and images.py say
how each step works):

  read     the window's segments, seq-filtered (`read_window`)
  facts    one aggregate: the last TRUNCATE and which of the optional steps below are needed
  cut      drop everything up to the last TRUNCATE (`after_cut`)
  legacy   derive the key columns of rows from older segments (`upgrade_legacy`; usually skipped)
  explode  changes -> per-key effects (SQL)
  fill     unchanged TOASTed values from the key's previous image (`images.fill_gaps`; only with
           REPLICA IDENTITY DEFAULT UPDATEs in the window, and only over the keys they touch)
  fold     first and last effect per key (SQL)
  befores  partial first before-images from the base (`images.complete_befores`; only when the
           window holds partial before-images and has no TRUNCATE)
  net      insert / update / delete per key (SQL; a DELETE whose before-image lacks its key is
           named in Python, only when an UPDATE in the window sent such an image)
  version  each net change's `ver`: the position and commit time of the key's last change
           (`effects.key_versions`, one aggregate by key over the changes after the cut)

`advance` applies that to the base: the table at the window's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.buffer.reader import SegmentRef
from resources.destinations.s3 import S3Connection
from snapshot_assets.spark.bases import Base
from snapshot_assets.spark.effects import (
    after_cut,
    apply_net,
    explode,
    fold,
    materialize,
    net_rows,
    read_window,
    upgrade_legacy,
    window_facts,
    with_versions,
)
from snapshot_assets.spark.images import complete_befores, fill_gaps
from snapshot_assets.spark.locations import Location


@dataclass(frozen=True, slots=True)
class NetWindow:
    """The net changes of a window (NET_DDL rows) and whether it held a TRUNCATE (written first),
    with the version of that TRUNCATE (archive/versions.py); `befores` is false when no net change
    has a before-image (`effects.WindowFacts.befores`)."""

    net: DataFrame
    truncated: bool
    truncate_version: str | None = None
    befores: bool = True


def net_window(spark: SparkSession, segments: Sequence[SegmentRef], base: Base, key_fields: Sequence[str], *,
               partitions: int, scratch: Path | Location, s3: S3Connection | None = None) -> NetWindow:
    """The window `segments` (which must start at `base.position`) as one net change per key;
    `s3` signs the reads of segments that live in S3, `scratch` takes the intermediate datasets."""
    fields = tuple(key_fields)
    # Read two or three times below (the facts, the changes, their versions); a PostgreSQL change's
    # images are typed and encoded in Python tasks as the buffer is read, so that happens once
    rows = materialize(read_window(spark, segments, s3), scratch / "window")
    facts = window_facts(rows)
    changes = after_cut(rows, facts)
    if facts.legacy:
        changes = upgrade_legacy(changes, fields)
    effects = explode(changes)
    start = None if facts.truncated else base
    if facts.gaps:
        filled = fill_gaps(spark, effects, start, fields, partitions=partitions, scratch=scratch / "images",
                           window=rows)
        effects = filled.withColumn("truncated", F.lit(facts.truncated))
    folded = fold(effects, partitions=partitions)
    if facts.partial and start is not None:
        folded = complete_befores(folded, start.frame(spark, fields))
    if facts.unnamed:  # net_rows reads it twice
        folded = materialize(folded, scratch / "folded")
    net = with_versions(net_rows(folded, fields, unnamed=facts.unnamed), changes)
    return NetWindow(net, facts.truncated, facts.truncate_version, facts.befores)


def advance(spark: SparkSession, base: Base, segments: Sequence[SegmentRef], key_fields: Sequence[str], *,
            partitions: int, scratch: Path | Location, s3: S3Connection | None = None) -> tuple[DataFrame, bool]:
    """The table at the end of `segments` (STATE_DDL), and whether a TRUNCATE dropped the base."""
    if not segments:
        return base.frame(spark, key_fields), False
    window = net_window(spark, segments, base, key_fields, partitions=partitions, scratch=scratch, s3=s3)
    previous = base.frame(spark, key_fields)
    if window.truncated:
        previous = previous.limit(0)  # the TRUNCATE wiped the base
    return apply_net(previous, window.net), window.truncated
