"""The change algebra on Spark: a window of changes -> per-key effects -> one net change per key.

Nothing here re-states a rule of the algebra; Spark only moves data so that the single-process
pieces of `archive.algebra` can run on it in parallel:

  driver   `last_truncate_seq`: one small aggregate (max seq of the TRUNCATEs) decides where the
           window really starts: a TRUNCATE wipes everything before it, and after it every key
           starts absent (`KeyNet.start(truncated=True)`), exactly as `Collapser.add` does.
  task     `explode`: each change -> `algebra.key_effects` (a primary-key-changing UPDATE gives two
           effects, delete old key + insert new key), keyed by the canonical JSON of the typed key.
  shuffle  repartition by that key, sort each partition by (key, seq): a key's effects are adjacent
           and in source order.
  task     `fold_sorted`: each key group -> `KeyNet.start` / `.fold` / `.to_change`.

Rows travel as Go-JSON text (`gojson`) between the steps and are decoded only inside tasks; a row
image that passes through a step unchanged keeps its original text (no re-encoding).
The functions handed to `mapInArrow` are module-level (pickled by reference), so executors import
this module: on a local runtime from this venv, on a cluster from the shipped code
(`session.ship_project_code`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from resources.buffer.reader import SegmentRef
from snapshot_assets.archive import gojson
from snapshot_assets.archive.algebra import KeyEffect, KeyNet, key_effects
from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.keys import TypedKey, laredo_row_key, row_key

BUFFER_DDL = ("seq BIGINT, position STRING, action STRING, key STRING, old STRING, new STRING, "
              "commit_time STRING, unchanged STRING")
# An effect row. `stage` 1 is an effect of a change; stage 0 rows are images the resolution step
# (images.py) puts in front of them: the key's row in the base (seq -1) or the image a primary-key
# change carries over from its old key (at the change's seq). `missing` lists the columns `after`
# still lacks (unchanged TOASTed values), `link` names the other key of a primary-key change, and
# `needs_base` says the effect cannot be completed from the window alone.
EFFECT_DDL = ("key STRING, seq BIGINT, stage INT, existed BOOLEAN, before STRING, after STRING, source_key STRING, "
              "missing STRING, link STRING, needs_base BOOLEAN")
NET_DDL = "key STRING, action STRING, change_key STRING, old STRING, new STRING"
STATE_DDL = "key STRING, row STRING"

_EFFECT_ARROW = pa.schema([("key", pa.string()), ("seq", pa.int64()), ("stage", pa.int32()),
                           ("existed", pa.bool_()), ("before", pa.string()), ("after", pa.string()),
                           ("source_key", pa.string()), ("missing", pa.string()), ("link", pa.string()),
                           ("needs_base", pa.bool_())])
_NET_ARROW = pa.schema([("key", pa.string()), ("action", pa.string()), ("change_key", pa.string()),
                        ("old", pa.string()), ("new", pa.string())])

EffectRow = tuple[str | None, int, int, bool | None, str | None, str | None, str | None, str | None, str | None,
                  bool]
CHANGE_STAGE = 1


def key_json(key: TypedKey) -> str:
    """The grouping key of a typed key: canonical JSON, exact integers (equal to the buffer's `key`)."""
    return gojson.dumps(list(key))


def decode_row(text: str | None) -> Row | None:
    """A row image from its Go-JSON text (None stays None)."""
    if text is None:
        return None
    value = gojson.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"a row image must be a JSON object, got {text[:80]!r}")
    return value


def encode_row(row: Row, key_fields: Sequence[str]) -> str:
    return gojson.encode_row(row, lambda: row_key(row, key_fields))


# --- buffer rows -> changes -> effects ---------------------------------------------------------


def buffer_change(action: str, key: str | None, old: str | None, new: str | None,
                  key_fields: Sequence[str]) -> Change:
    """A buffer row as the `Change` the source sent.

    The buffer stores no `%v` key string (its `key` column is the typed key as JSON); the change's
    key string is laredo's, computed from its image, or from the typed key for an image-less row.
    Public so the single-process oracle in tests reads the buffer exactly as the Spark job does.
    """
    old_row, new_row = decode_row(old), decode_row(new)
    image = new_row if new_row is not None else old_row
    if image is not None:
        text = laredo_row_key(image, key_fields)
    elif key is not None:
        text = laredo_row_key(dict(zip(key_fields, gojson.loads(key), strict=False)), key_fields)
    else:
        text = ""
    return Change(Change.parse_action(action), text, old_row, new_row)


def change_effects(seq: int, change: Change, old_text: str | None, new_text: str | None,
                   key_fields: Sequence[str], unchanged: Sequence[str] = ()) -> list[EffectRow]:
    """`algebra.key_effects` of one change as effect rows; images keep their original text.

    `unchanged` names the columns the change's `new` omits (they kept their value): the effect
    whose `after` is that image carries them as `missing`. An effect needs the key's base row when
    it claims the key existed but its before-image is partial (PostgreSQL's default replica
    identity sends only the key columns, or nothing), or when its `after` misses columns.
    """

    def text(image: Row | None) -> str | None:
        if image is None:
            return None
        if image is change.old and old_text is not None:
            return old_text
        if image is change.new and new_text is not None:
            return new_text
        return encode_row(image, key_fields)

    effects = key_effects(change, key_fields)
    moved = len(effects) == 2  # a primary-key change: delete the old key, insert the new one
    missing = gojson.dumps(list(unchanged)) if unchanged else None
    rows: list[EffectRow] = []
    for i, e in enumerate(effects):
        gaps = missing if e.after is not None and e.after is change.new else None
        link = key_json(effects[1 - i].key) if moved else None
        needs_base = bool(gaps and not moved) or (e.existed and partial_image(e.before, key_fields))
        rows.append((key_json(e.key), seq, CHANGE_STAGE, e.existed, text(e.before), text(e.after),
                     gojson.valid_text(e.source_key), gaps, link, needs_base))
    return rows


def truncate_effect(seq: int) -> EffectRow:
    """The effect row of a TRUNCATE (no key): readers of archived diffs order it by seq."""
    return (None, seq, CHANGE_STAGE, None, None, None, None, None, None, False)


def partial_image(image: Row | None, key_fields: Sequence[str]) -> bool:
    """True when a before-image is absent or holds no more than the key columns (a key-only image)."""
    return image is None or set(image) <= set(key_fields)


def effect_batch(rows: Sequence[EffectRow]) -> Any:
    """An Arrow batch in EFFECT_DDL layout."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(_EFFECT_ARROW)
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, _EFFECT_ARROW, strict=True)],
                                      schema=_EFFECT_ARROW)


def _explode_batches(batches: Iterable[Any], key_fields: tuple[str, ...]) -> Iterator[Any]:
    for batch in batches:
        rows: list[EffectRow] = []
        columns = [batch.column(name).to_pylist() for name in ("seq", "action", "key", "old", "new", "unchanged")]
        for seq, action, key, old, new, unchanged in zip(*columns, strict=True):
            change = buffer_change(action, key, old, new, key_fields)
            gaps = gojson.loads(unchanged) if unchanged else ()
            rows.extend(change_effects(seq, change, old, new, key_fields, gaps))
        yield effect_batch(rows)


# --- reading the buffer --------------------------------------------------------------------------


def seq_predicate(segments: Sequence[SegmentRef]) -> str:
    """The rows of `segments` as one SQL predicate on seq (adjacent ranges merged; seqs are unique
    across the whole buffer, so one predicate over all the files selects exactly each file's rows)."""
    merged: list[list[int]] = []
    for low, high in sorted((s.seq_from_exclusive, s.seq_to_inclusive) for s in segments):
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return " OR ".join(f"(seq > {low} AND seq <= {high})" for low, high in merged) or "false"


def read_window(spark: SparkSession, segments: Sequence[SegmentRef]) -> DataFrame:
    """The buffer rows of `segments` (paths + seq filter, which Parquet statistics prune)."""
    if not segments:
        return spark.createDataFrame([], BUFFER_DDL)
    paths = list(dict.fromkeys(s.path for s in segments))
    return spark.read.schema(BUFFER_DDL).parquet(*paths).filter(seq_predicate(segments))


def last_truncate_seq(changes: DataFrame) -> int | None:
    """The seq of the window's last TRUNCATE (a one-row aggregate on the driver), or None."""
    row = changes.filter("action = 'TRUNCATE'").selectExpr("max(seq) AS t").collect()[0]
    return None if row["t"] is None else int(row["t"])


@dataclass(frozen=True, slots=True)
class Window:
    """The part of a change window that matters: the changes after its last TRUNCATE, if any."""

    changes: DataFrame
    truncated: bool


def effective_window(changes: DataFrame) -> Window:
    """Drop everything at or before the last TRUNCATE (it is written first, and wipes the rest)."""
    cut = last_truncate_seq(changes)
    if cut is None:
        return Window(changes.filter("action <> 'TRUNCATE'"), False)
    return Window(changes.filter(f"seq > {cut} AND action <> 'TRUNCATE'"), True)


def explode(changes: DataFrame, key_fields: Sequence[str], *, spread: int | None = None) -> DataFrame:
    """Buffer rows (no TRUNCATEs) -> effect rows (EFFECT_DDL), one task per input partition.

    `spread` first deals the rows round-robin over that many partitions: a window of one or two
    segments is only one or two scan partitions (a segment's row groups hold 64k changes), which
    would leave the Python work of the explode on one core. Moving raw rows is cheap next to it.
    """
    func = functools.partial(_explode_batches, key_fields=tuple(key_fields))
    rows = changes.select("seq", "action", "key", "old", "new", "unchanged")
    if spread:
        rows = rows.repartition(spread)
    return rows.mapInArrow(func, EFFECT_DDL)


def spread_for(segments: Sequence[SegmentRef], partitions: int) -> int | None:
    """How widely to spread a window before the explode (None: its scan is already wide enough)."""
    return partitions if 0 < len(segments) < partitions else None


def group_by_key(effects: DataFrame, partitions: int) -> DataFrame:
    """Each key's effects in one partition, adjacent and in source order (images before effects)."""
    return effects.repartition(partitions, "key").sortWithinPartitions("key", "seq", "stage")


def materialize(frame: DataFrame, path: Path, ddl: str) -> DataFrame:
    """Write `frame` once and read it back, so the steps after it never recompute it."""
    frame.write.mode("overwrite").parquet(str(path))
    return frame.sparkSession.read.schema(ddl).parquet(str(path))


# --- the fold --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NetChange:
    """One key's net change, with the original text of the images it reuses (None: re-encode)."""

    key: str
    change: Change
    old_text: str | None
    new_text: str | None


class _Group:
    """The key being folded: its KeyNet and the texts of the images the net change may reuse."""

    def __init__(self, key: str, effect: KeyEffect, before: str | None, after: str | None, *,
                 truncated: bool, key_fields: tuple[str, ...]) -> None:
        self.key = key
        self.typed = effect.key
        self.net = KeyNet.start(effect, truncated=truncated, key_fields=key_fields)
        self.first_before, self.before_text = effect.before, before
        self.last_after, self.after_text = effect.after, after

    def fold(self, effect: KeyEffect, after: str | None) -> None:
        self.net.fold(effect)
        self.last_after, self.after_text = effect.after, after

    def result(self, key_fields: tuple[str, ...]) -> NetChange | None:
        change = self.net.to_change(laredo_row_key, key_fields)
        if change is None:
            return None
        old_text = self.before_text if change.old is not None and change.old is self.first_before else None
        new_text = self.after_text if change.new is not None and change.new is self.last_after else None
        return NetChange(self.key, change, old_text, new_text)


def fold_sorted(batches: Iterable[Any], key_fields: Sequence[str], *, truncated: bool) -> Iterator[NetChange]:
    """Fold effect batches sorted by (key, seq) into one net change per key (keys whose net
    movement is nothing, e.g. insert then delete, yield nothing). A group may span batches."""
    fields = tuple(key_fields)
    group: _Group | None = None
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in ("key", "existed", "before", "after", "source_key")]
        for key, existed, before, after, source_key in zip(*columns, strict=True):
            if group is not None and key == group.key:
                group.fold(KeyEffect(group.typed, existed, decode_row(before), decode_row(after), source_key), after)
                continue
            if group is not None and (net := group.result(fields)) is not None:
                yield net
            effect = KeyEffect(tuple(gojson.loads(key)), existed, decode_row(before), decode_row(after), source_key)
            group = _Group(key, effect, before, after, truncated=truncated, key_fields=fields)
    if group is not None and (net := group.result(fields)) is not None:
        yield net


def _net_batches(batches: Iterable[Any], key_fields: tuple[str, ...], truncated: bool) -> Iterator[Any]:
    rows: list[tuple[str, str, str, str | None, str | None]] = []

    def text(image: Row | None, known: str | None) -> str | None:
        return known if known is not None or image is None else encode_row(image, key_fields)

    for net in fold_sorted(batches, key_fields, truncated=truncated):
        change = net.change
        rows.append((net.key, change.action.value, gojson.valid_text(change.key),
                     text(change.old, net.old_text), text(change.new, net.new_text)))
        if len(rows) >= 4096:
            yield _net_batch(rows)
            rows = []
    yield _net_batch(rows)


def _net_batch(rows: Sequence[tuple[str, str, str, str | None, str | None]]) -> Any:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(_NET_ARROW)
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, _NET_ARROW, strict=True)],
                                      schema=_NET_ARROW)


def net_changes(effects: DataFrame, key_fields: Sequence[str], *, truncated: bool, partitions: int) -> DataFrame:
    """Effects -> one net change per key as rows (NET_DDL: key, action, change_key, old, new)."""
    func = functools.partial(_net_batches, key_fields=tuple(key_fields), truncated=truncated)
    return group_by_key(effects, partitions).mapInArrow(func, NET_DDL)


def apply_net(base: DataFrame, net: DataFrame) -> DataFrame:
    """The new state (STATE_DDL): base rows whose key no net change touches, plus every key whose
    net change leaves a row (INSERT/UPDATE: its `new`). A net DELETE just removes the key."""
    untouched = base.join(net.select("key"), "key", "left_anti")
    return untouched.unionByName(net.filter("new IS NOT NULL").selectExpr("key", "new AS row"))


def default_partitions(spark: SparkSession) -> int:
    """The shuffle width: `spark.sql.shuffle.partitions` (small by default on a local runtime)."""
    return max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or "4"))

