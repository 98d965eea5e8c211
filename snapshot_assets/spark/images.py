"""Completing row images: before-images and unchanged TOASTed values under PostgreSQL's default
replica identity, from the archive's own previous image of each row.

Why here: PostgreSQL does not resend an out-of-line value that an UPDATE left alone, and under
REPLICA IDENTITY DEFAULT an UPDATE or DELETE carries no before-image beyond the key columns. Both
are known to the archive: a row's previous image is the previous change of that key in the window,
or the key's row in the base (the table at the window's start). Asking the source would be wrong
(the row has moved on since) and a cache of the table in one process is unbounded; a join of the
keys that need it against the base is what Spark is for.

Before-images (`complete_befores`, SQL): only a key's first effect says what the key was at the
window's start, so after the fold a partial first before-image (absent, or key columns only) of a
key that existed becomes the key's row in the base: one left join of the folded keys with it.

Omitted values (`fill_gaps`): a filled after-image is a new image (it is encoded once, here,
where it enters the archive), and each fill needs the one before it (a hot key's chain of
TOAST-sparing updates), so this step runs in Python, over the keys that need it only:
  keys    the keys of the effects that miss values and the old keys of the primary-key changes
          among them (whose image moves on to the new key); every other effect passes untouched.
  join    the base rows of those keys become stage-0 rows at seq -1, in front of each key's effects.
  task    per key, in seq order (`_resolve`): an after-image takes its missing columns from the
          key's previous image; a primary-key change hands its old key's image on to the new key
          as a stage-0 "carried" row.
  rounds  a carried image reaches the new key in the next pass, which runs over the keys still
          missing values only; passes repeat while their number falls (a chain of k key changes
          of one row in one window takes k + 1 passes; one pass is the usual case).
What a key's net after-image still misses then has no earlier image anywhere in the archive (the
archive started after the row was written and never held it): `UnfillableValue` names key,
columns and position, and the caller commits nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapshot_assets.archive import gojson
from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.spark.effects import (
    BEFORE_RECORD,
    EFFECT_ARROW,
    EFFECT_COLUMNS,
    arrow_batch,
    ddl_of,
    decode_row,
    encode_row,
    materialize,
)
from snapshot_assets.spark.locations import Location

if TYPE_CHECKING:
    from snapshot_assets.spark.bases import Base

BASE_SEQ = -1
IMAGE_STAGE = 0
CHANGE_STAGE = 1
# An effect row of the fill passes: stage 1 is an effect, stage 0 an image put in front of a key's
# effects (its base row at seq -1, or the image a primary-key change carries over at its seq).
_FILL_ARROW = pa.schema([*EFFECT_ARROW, pa.field("stage", pa.int32())])
_FILL_DDL = ddl_of(_FILL_ARROW)
_FILL_COLUMNS = tuple(_FILL_ARROW.names)
_REPORTED = 5  # unfillable effects named in the error

FillRow = tuple[str | None, int, bool | None, str | None, bool | None, bool | None, str | None, str | None,
                str | None, str | None, int]


class UnfillableValue(ArchiveError):
    """An UPDATE omitted unchanged values that no earlier image of the row in the archive holds."""


def complete_befores(folded: DataFrame, base: DataFrame) -> DataFrame:
    """Folded keys (`effects.fold`) whose first before-image is partial take the base's row as it,
    and its protobuf record as BEFORE_RECORD (null where the base kept none, or kept its own).

    `base` is the table at the window's start (STATE_DDL). A key the base lacks keeps what its
    change sent (an archive that never held the row cannot know more).

    The base is cut down to the keys that need it first (a semi-join with those keys, which Spark's
    adaptive execution broadcasts when they are few enough), so the table's rows are scanned but
    never shuffled: only the wanted rows meet the folded keys in the join.
    """
    wanted = folded.filter(F.col("existed") & F.col("partial")).select("key")
    need = F.col("existed") & F.col("partial") & F.col("_base").isNotNull()
    rows = base.join(wanted, "key", "left_semi").select("key", F.col("row").alias("_base"),
                                                         F.col("pb").alias("_base_pb"))
    return (folded.join(rows, "key", "left")
            .withColumn("named", F.col("named") | need)  # a row of the base carries its key
            .withColumn("before", F.when(need, F.col("_base")).otherwise(F.col("before")))
            .withColumn(BEFORE_RECORD, F.when(need, F.col("_base_pb"))).drop("_base", "_base_pb"))


def _fill(after: str, missing: str, source: str | None, key_fields: Sequence[str]) -> tuple[str, str | None]:
    """`after` with the `missing` columns taken from `source` (a complete image), and what is still missing."""
    if source is None:
        return after, missing
    wanted: list[str] = gojson.loads(missing)
    previous = decode_row(source) or {}
    row = decode_row(after) or {}
    still = [name for name in wanted if name not in previous]
    row.update({name: previous[name] for name in wanted if name in previous})
    return encode_row(row, key_fields), (gojson.dumps(still) if still else None)


def _resolve(batches: Iterable[Any], key_fields: tuple[str, ...]) -> Iterator[Any]:
    """Stage-0 images + effects sorted by (key, seq, stage) -> filled effects + carried images."""
    key: str | None = None
    current: str | None = None  # the key's latest complete image; None: absent or unknown
    carried: dict[int, str | None] = {}
    out: list[FillRow] = []
    for batch in batches:
        for (k, seq, existed, before, partial, named, after, change_key, missing, link,
             stage) in zip(*(batch.column(c).to_pylist() for c in _FILL_COLUMNS), strict=True):
            if k != key:
                key, current, carried = k, None, {}
            if stage == IMAGE_STAGE:
                if seq == BASE_SEQ:
                    current = after
                else:
                    carried[seq] = after
                continue
            if after is not None and missing is not None:
                after, missing = _fill(after, missing, carried.get(seq) if link is not None else current, key_fields)
            if after is None and link is not None:  # the old key of a primary-key change: its image moves on
                out.append((link, seq, None, None, None, None, current, None, None, None, IMAGE_STAGE))
            current = after if missing is None else None
            out.append((k, seq, existed, before, partial, named, after, change_key, missing, link, stage))
            if len(out) >= 4096:
                yield arrow_batch(out, _FILL_ARROW)
                out = []
    yield arrow_batch(out, _FILL_ARROW)


def fill_gaps(spark: SparkSession, effects: DataFrame, base: Base | None, key_fields: Sequence[str], *,
              partitions: int, scratch: Path | Location, window: DataFrame) -> DataFrame:
    """`effects` (EFFECT_DDL) with every after-image that misses values completed (see the module
    docstring). `base` is the table at the window's start (None: the window starts empty, after a
    TRUNCATE); `window` (the buffer rows) is only read to name positions in an error."""
    fields = tuple(key_fields)
    effects = effects.select(*EFFECT_COLUMNS)
    gapped = effects.filter("missing IS NOT NULL")
    keys = materialize(gapped.select("key").unionByName(gapped.filter("link IS NOT NULL").selectExpr("link AS key"))
                       .distinct(), scratch / "keys")
    staged = effects.join(keys, "key", "left_semi").withColumn("stage", F.lit(CHANGE_STAGE))
    if base is not None:
        from snapshot_assets.spark.bases import rows_for  # bases imports this package's effects

        images = rows_for(base, spark, fields, keys).selectExpr(
            "key", f"CAST({BASE_SEQ} AS BIGINT) AS seq", "CAST(NULL AS BOOLEAN) AS existed",
            "CAST(NULL AS STRING) AS before", "CAST(NULL AS BOOLEAN) AS partial", "CAST(NULL AS BOOLEAN) AS named",
            "row AS after", "CAST(NULL AS STRING) AS change_key",
            "CAST(NULL AS STRING) AS missing", "CAST(NULL AS STRING) AS link", f"{IMAGE_STAGE} AS stage")
        staged = staged.unionByName(images)
    func = functools.partial(_resolve, key_fields=fields)

    def run_pass(frame: DataFrame, attempt: int) -> DataFrame:
        return materialize(frame.repartition(partitions, "key").sortWithinPartitions("key", "seq", "stage")
                           .mapInArrow(func, _FILL_DDL), scratch / f"pass={attempt}")

    inputs = materialize(staged, scratch / "inputs")
    done = run_pass(inputs, 0)
    resolved = done.filter(f"stage = {CHANGE_STAGE}")
    carried = done.filter(f"stage = {IMAGE_STAGE} AND after IS NOT NULL")
    previous: int | None = None
    for attempt in range(1, 1 << 16):
        left = resolved.filter("missing IS NOT NULL").count()
        if left == 0 or (previous is not None and left >= previous):
            break
        previous = left
        # Only the keys still missing values go round again, with every image carried to them so far.
        again_keys = resolved.filter("missing IS NOT NULL").select("key").distinct()
        again = run_pass(inputs.join(again_keys, "key", "left_semi")
                         .unionByName(carried.join(again_keys, "key", "left_semi")), attempt)
        kept = resolved.join(again_keys, "key", "left_anti")
        resolved = materialize(kept.unionByName(again.filter(f"stage = {CHANGE_STAGE}")),
                               scratch / f"resolved={attempt}")
        carried = carried.unionByName(again.filter(f"stage = {IMAGE_STAGE} AND after IS NOT NULL")) \
            .dropDuplicates(["key", "seq"])
    # Only a key's last image reaches the net change: an earlier one that stays incomplete is
    # overwritten by a later complete image (and cannot be the source of a later fill).
    unfilled = (resolved.groupBy("key").agg(F.max_by(F.struct("seq", "missing"), "seq").alias("last"))
                .select("key", "last.seq", "last.missing").filter("missing IS NOT NULL"))
    if unfilled.limit(1).count():
        raise _unfillable(unfilled, window)
    return effects.join(keys, "key", "left_anti").unionByName(resolved.select(*EFFECT_COLUMNS))


def _unfillable(unfilled: DataFrame, window: DataFrame) -> UnfillableValue:
    left = unfilled.count()
    rows = unfilled.orderBy("seq").limit(_REPORTED).collect()
    seqs = [int(r["seq"]) for r in rows]
    positions = {int(r["seq"]): r["position"] for r in
                 window.filter(window.seq.isin(seqs)).select("seq", "position").collect()}
    named = "; ".join(f"key {r['key']} columns {gojson.loads(r['missing'])} at position "
                      f"{positions.get(int(r['seq']), '?')}" for r in rows)
    return UnfillableValue(
        f"cannot fill the unchanged (TOASTed) values of {left} UPDATE(s): {named}. No earlier image of "
        "those rows is in the archive (the archive started after they were written and never held "
        "them). Re-sync the table, or make it REPLICA IDENTITY FULL with source.unchanged_toast = require-full")
