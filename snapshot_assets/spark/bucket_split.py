"""Splitting the buckets a re-base would grow out of balance, and only those.

Why: a table that only appends (ids from a sequence, snowflake ids) sends every new row to its last
bucket. Left alone, that bucket outgrows `MAX_GROWTH` times its target after about three targets of
new rows, and the next build used to re-bucket the whole table from the state: at 10,000,000 rows
with 8 MiB buckets, 8 min 24 s for a re-base whose changes were 2% of the table. Here the one bucket
is cut into parts of about the target size while every other bucket keeps its bounds, rows file and
bytes, so the re-base still costs what changed.

How: before the incremental write, each touched bucket's size after the merge is bounded from above
(its stored jsonl bytes plus its changed rows' new images: a replaced row counted twice, so a bucket
near the limit may split a little early, never late). A bucket over the limit is read whole (its
stored rows with its changes laid over them, `latest_images`), sampled for new bounds inside its key
range, and handed to the writer as rows of new buckets that have no stored file. Python handles the
sampled sort keys only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.buffer.segments import TYPED_COLUMN
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.spark.bases import latest_images, with_cells
from snapshot_assets.spark.effects import materialize
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.parquet_artifact import image_type
from snapshot_assets.spark.remote_io import read_parquet_files
from snapshot_assets.spark.state import (
    MAX_GROWTH,
    ROWS_DDL,
    SAMPLES_PER_BUCKET,
    Bucket,
    StateBase,
    bounds_of,
    bucket_expr,
)

#: The size a bucket is measured by, here as in the full build's census: its jsonl bytes.
SIZE_FORMAT = "jsonl"
#: The SQL of one row's bytes in that measure (its jsonl line; a deleted key's: none), for the full
#: build's census and a re-base's growth alike.
GROWN_SQL = "CASE WHEN row IS NULL THEN 0 ELSE octet_length(row) + 1 END"


@dataclass(frozen=True, slots=True)
class Growth:
    """What one bucket's changes add at most: rows, and jsonl bytes of new images."""

    rows: int
    bytes: int


def too_big(size: int, bucket_bytes: int) -> bool:
    """Whether a bucket of `size` (SIZE_FORMAT bytes) is out of balance for a target of `bucket_bytes`."""
    return size > MAX_GROWTH * bucket_bytes


def out_of_balance(state: StateBase, bucket_bytes: int) -> bool:
    """Whether any bucket of `state` is too big all the same (e.g. the target was made smaller):
    the next build re-buckets the table."""
    return any(too_big(b.sizes.get(SIZE_FORMAT, 0), bucket_bytes) for b in state.buckets)


def overgrowing(state: StateBase, growth: Mapping[int, Growth], bucket_bytes: int) -> dict[int, int]:
    """The buckets of `state` whose merged size may pass `MAX_GROWTH` x `bucket_bytes`, each with how
    many parts of about `bucket_bytes` to cut it into. An archive without jsonl has no such measure
    (as for the full build's re-balancing): its buckets keep their bounds."""
    if SIZE_FORMAT not in state.formats:
        return {}
    parts: dict[int, int] = {}
    for i, grown in growth.items():
        if not grown.bytes:
            continue
        bound = state.buckets[i].sizes.get(SIZE_FORMAT, 0) + grown.bytes
        if too_big(bound, bucket_bytes):
            parts[i] = max(2, math.ceil(bound / bucket_bytes))
    return parts


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """An incremental write with some buckets split.

    `buckets`: the state's buckets, each split one replaced by its parts (no rows file yet: the
    writer fills them from `changes` alone); `changes`: what the writer merges (the other buckets'
    changes, and every row of the split buckets with their changes applied); `touched`: the new
    indexes written; `origins`: for each new bucket, the index of the previous bucket it is (None
    for a part), which is where its bytes sit in the previous snapshot object."""

    buckets: tuple[Bucket, ...]
    changes: DataFrame
    touched: tuple[int, ...]
    origins: tuple[int | None, ...]


def _stored_rows(spark: SparkSession, state: StateBase, indexes: Sequence[int], cells: RowSchema | None) -> DataFrame:
    """The stored rows (ROWS_DDL, and the typed columns of `cells`) of the given buckets."""
    paths = [p for p in (state.buckets[i].path for i in indexes) if p is not None]
    if not paths:  # a bucket the changes alone overgrow
        return with_cells(spark.createDataFrame([], ROWS_DDL), cells)
    columns = [c.split()[0] for c in ROWS_DDL.split(",")]
    typed = [F.col(TYPED_COLUMN).cast(image_type(cells)).alias(TYPED_COLUMN)] if cells is not None else []
    return read_parquet_files(spark, paths, s3=state.s3).select(*columns, *typed)


def split_buckets(spark: SparkSession, state: StateBase, changes: DataFrame, parts: Mapping[int, int],
                  growth: Mapping[int, Growth], touched: Sequence[int], cells: RowSchema | None,
                  scratch: Location) -> SplitPlan:
    """Plan the write of `changes` (ROWS_DDL changes, bucketed by `state`'s bounds, falling in
    `touched`) with the buckets of `parts` cut as `overgrowing` asks. The split buckets' merged rows
    are kept in `scratch` (read twice: sampled for bounds, then written)."""
    bounds = state.bounds
    which = bucket_expr(bounds)
    chosen = ", ".join(str(i) for i in sorted(parts))
    inside = f"({which}) IN ({chosen})"
    extra = [TYPED_COLUMN] if cells is not None else []
    merged = latest_images([_stored_rows(spark, state, sorted(parts), cells), changes.where(inside)], ROWS_DDL, extra)
    merged = materialize(merged.where("row IS NOT NULL"), scratch / "split")
    # Sampled per bucket, about SAMPLES_PER_BUCKET sort keys per part, collected to the driver.
    fractions = {i: min(1.0, SAMPLES_PER_BUCKET * k / max(1, state.buckets[i].rows + growth[i].rows))
                 for i, k in parts.items()}
    sampled = merged.selectExpr(f"{which} AS b", "sk").sampleBy("b", fractions, seed=7).collect()
    samples: dict[int, list[bytes]] = {i: [] for i in parts}
    for r in sampled:
        samples[int(r["b"])].append(bytes(r["sk"]))
    new: list[Bucket] = []
    origins: list[int | None] = []
    renumbered: dict[int, int] = {}
    for i, bucket in enumerate(state.buckets):
        if i not in parts:
            renumbered[i] = len(new)
            new.append(bucket)
            origins.append(i)
            continue
        cuts = [c for c in bounds_of(sorted(samples[i]), parts[i]) if bucket.lower is None or c > bucket.lower]
        for lower in (bucket.lower, *cuts):
            new.append(Bucket(lower, None, 0))
            origins.append(None)
    written = {renumbered[i] for i in touched if i in renumbered}
    written.update(j for j, origin in enumerate(origins) if origin is None)
    rest = changes.where(f"NOT {inside}").select(*merged.columns)
    return SplitPlan(tuple(new), rest.unionByName(merged), tuple(sorted(written)), tuple(origins))


__all__ = ["GROWN_SQL", "Growth", "SplitPlan", "out_of_balance", "overgrowing", "split_buckets", "too_big"]
