"""Completing row images before the fold: unchanged TOASTed values and before-images under
PostgreSQL's default replica identity, from the archive's own previous image of each row.

Why here: PostgreSQL does not resend an out-of-line value that an UPDATE left alone, and under
REPLICA IDENTITY DEFAULT an UPDATE or DELETE carries no before-image beyond the key columns. Both
are known to the archive: a row's previous image is the previous change of that key in the window,
or the key's row in the base (the table at the window's start). Asking the source would be wrong
(the row has moved on since) and a cache of the table in one process is unbounded; a join of the
keys that need it against the base is what Spark is for.

How:
  driver  one aggregate over the exploded effects: how many need the base, how many miss columns.
          With none (REPLICA IDENTITY FULL, or no such UPDATE in the window) nothing here runs.
  join    the base rows of the keys that need them (`Base.frame` semi-joined with those keys)
          become stage-0 rows at seq -1, in front of each key's effects.
  task    per key, in seq order (`_resolve`): a partial before-image becomes the key's previous
          image; an after-image takes its missing columns from it; a primary-key change hands
          its old key's image on to the new key as a stage-0 "carried" row.
  rounds  a carried image reaches the new key in the next pass, which runs over the keys still
          missing values only; passes repeat while their number falls (a chain of k key changes
          of one row in one window takes k + 1 passes; one pass is the usual case).
What is still missing after that has no earlier image anywhere in the archive (the archive started
after the row was written and never held it): `UnfillableValue` names key, columns and position,
and the caller commits nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

from snapshot_assets.archive import gojson
from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.spark.effects import (
    CHANGE_STAGE,
    EFFECT_DDL,
    EffectRow,
    decode_row,
    effect_batch,
    encode_row,
    group_by_key,
    materialize,
    partial_image,
)

if TYPE_CHECKING:
    from snapshot_assets.spark.bases import Base

BASE_SEQ = -1
IMAGE_STAGE = 0
_COLUMNS = ("key", "seq", "stage", "existed", "before", "after", "source_key", "missing", "link", "needs_base")
_REPORTED = 5  # unfillable effects named in the error


class UnfillableValue(ArchiveError):
    """An UPDATE omitted unchanged values that no earlier image of the row in the archive holds."""


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
    """Stage-0 images + effects sorted by (key, seq, stage) -> completed effects + carried images."""
    key: str | None = None
    current: str | None = None  # the key's latest complete image; None: absent or unknown
    carried: dict[int, str | None] = {}
    out: list[EffectRow] = []
    for batch in batches:
        for (k, seq, stage, existed, before, after, source_key, missing, link,
             needs_base) in zip(*(batch.column(c).to_pylist() for c in _COLUMNS), strict=True):
            if k != key:
                key, current, carried = k, None, {}
            if stage == IMAGE_STAGE:
                if seq == BASE_SEQ:
                    current = after
                else:
                    carried[seq] = after
                continue
            if needs_base and existed and current is not None and partial_image(decode_row(before), key_fields):
                before = current
            if after is not None and missing is not None:
                after, missing = _fill(after, missing, carried.get(seq) if link is not None else current, key_fields)
            if after is None and link is not None:  # the old key of a primary-key change: its image moves on
                out.append((link, seq, IMAGE_STAGE, None, None, current, None, None, None, False))
            current = after if missing is None else None
            out.append((k, seq, stage, existed, before, after, source_key, missing, link, needs_base))
            if len(out) >= 4096:
                yield effect_batch(out)
                out = []
    yield effect_batch(out)


def resolve_images(spark: SparkSession, effects: DataFrame, base: Base | None, key_fields: Sequence[str], *,
                   partitions: int, scratch: Path, window: DataFrame) -> DataFrame:
    """Complete every effect's images (see the module docstring); `effects` should be materialized.

    `base` is the table at the window's start (None: the window starts empty, after a TRUNCATE);
    `window` (the buffer rows) is only read to name positions in an error.
    """
    need = effects.selectExpr("count_if(needs_base) AS base", "count_if(missing IS NOT NULL) AS gaps").collect()[0]
    if not need["base"] and not need["gaps"]:
        return effects
    fields = tuple(key_fields)
    images = spark.createDataFrame([], EFFECT_DDL)
    if base is not None and need["base"]:
        wanted = effects.filter("needs_base").select("key").distinct()
        images = base.frame(spark, fields).join(wanted, "key", "left_semi").selectExpr(
            "key", f"CAST({BASE_SEQ} AS BIGINT) AS seq", f"{IMAGE_STAGE} AS stage", "CAST(NULL AS BOOLEAN) AS existed",
            "CAST(NULL AS STRING) AS before", "row AS after", "CAST(NULL AS STRING) AS source_key",
            "CAST(NULL AS STRING) AS missing", "CAST(NULL AS STRING) AS link", "false AS needs_base")
    func = functools.partial(_resolve, key_fields=fields)
    inputs = effects.unionByName(images)

    def run_pass(frame: DataFrame, attempt: int) -> DataFrame:
        path = scratch / f"pass={attempt}"
        group_by_key(frame, partitions).mapInArrow(func, EFFECT_DDL).write.mode("overwrite").parquet(str(path))
        return spark.read.schema(EFFECT_DDL).parquet(str(path))

    done = run_pass(inputs, 0)
    resolved = done.filter(f"stage = {CHANGE_STAGE}")
    carried = done.filter(f"stage = {IMAGE_STAGE} AND after IS NOT NULL")
    previous: int | None = None
    for attempt in range(1, 1 << 16):
        left = resolved.filter("missing IS NOT NULL").count()
        if left == 0:
            return resolved
        if previous is not None and left >= previous:
            break
        previous = left
        # Only the keys still missing values go round again, with every image carried to them so far.
        keys = resolved.filter("missing IS NOT NULL").select("key").distinct()
        again = run_pass(inputs.join(keys, "key", "left_semi").unionByName(carried.join(keys, "key", "left_semi")),
                         attempt)
        kept = resolved.join(keys, "key", "left_anti")
        resolved = materialize(kept.unionByName(again.filter(f"stage = {CHANGE_STAGE}")),
                               scratch / f"resolved={attempt}", EFFECT_DDL)
        carried = carried.unionByName(again.filter(f"stage = {IMAGE_STAGE} AND after IS NOT NULL")) \
            .dropDuplicates(["key", "seq"])
    raise _unfillable(resolved, window, left)


def _unfillable(resolved: DataFrame, window: DataFrame, left: int) -> UnfillableValue:
    rows = (resolved.filter("missing IS NOT NULL").orderBy("seq")
            .select("key", "seq", "missing").limit(_REPORTED).collect())
    seqs = [int(r["seq"]) for r in rows]
    positions = {int(r["seq"]): r["position"] for r in
                 window.filter(window.seq.isin(seqs)).select("seq", "position").collect()} if seqs else {}
    named = "; ".join(f"key {r['key']} columns {gojson.loads(r['missing'])} at position "
                      f"{positions.get(int(r['seq']), '?')}" for r in rows)
    return UnfillableValue(
        f"cannot fill the unchanged (TOASTed) values of {left} UPDATE(s): {named}. No earlier image of "
        "those rows is in the archive (the archive started after they were written and never held "
        "them). Re-sync the table, or make it REPLICA IDENTITY FULL with source.unchanged_toast = require-full")
