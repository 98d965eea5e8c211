"""The change algebra as Spark SQL: a window of buffer changes -> per-key effects -> one net change per key.

The rules are `archive.algebra`'s (KeyNet.start / fold / to_change, `key_effects`, `Collapser.add`),
stated over `(key, seq)` columns so that the JVM runs them and no image is decoded:

  driver   `window_facts`: one aggregate over the window: the seq of its last TRUNCATE (the cut:
           it wipes everything before it, and after it every key starts absent), and whether
           anything after the cut may need an optional step (a before-image from the base, a
           DELETE named from an after-image, a fill of omitted values, a legacy upgrade).
  cut      `after_cut`: the changes after the cut, each marked `truncated` or not.
  explode  `explode`: `inline` of an array per change: one effect, or two for a primary-key change
           (delete the old key, insert the new one: `key_effects`). Every key is the buffer's
           canonical JSON (`key`, `old_key`), every key string laredo's (`change_key`,
           `old_change_key`), and what a before-image holds is a flag (`old_partial`,
           `old_carries_key`): all computed at ingest from the decoded change.
  shuffle  `fold`: repartition by key, sort by (key, seq), one aggregate per key: the first
           effect (existed, before-image, key string) and the last (after-image, key string):
           `min_by` / `max_by` over seq.
  project  `net_rows`: insert / update / delete / nothing from (existed at the start, present at
           the end); after a TRUNCATE every key starts absent.

Images travel as the Go-JSON text the buffer holds and are never re-encoded, with one exception
handled in Python because it makes a new image: a net DELETE whose first before-image does not name
its key (`KeyNet.start`'s `delete_old`: the key values come from the first after-image). That and
the legacy upgrade run only on the rows that need them; images.py completes omitted values (also
only for the keys that need it). Everything else is SQL, so the Python work is proportional to the
changes that need it, never to the window or the table.

`scope` columns (empty in production) make each distinct value of them its own window: the
property tests fold many generated windows in one Spark job that way.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.buffer.reader import SegmentRef
from resources.buffer.segments import RECORD_COLUMN, SCHEMA, derived_columns, with_images
from resources.destinations.s3 import S3Connection
from snapshot_assets.archive import gojson, versions
from snapshot_assets.archive.algebra import KeyEffect, KeyNet, carries_key, key_effects, partial_image
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import key_json, laredo_row_key, row_key
from snapshot_assets.spark.locations import Location, read_dataset, write_dataset
from snapshot_assets.spark.remote_io import read_parquet_files

_SPARK_TYPES = {pa.string(): "STRING", pa.int64(): "BIGINT", pa.int32(): "INT", pa.bool_(): "BOOLEAN",
                pa.binary(): "BINARY", pa.list_(pa.string()): "ARRAY<STRING>"}


def ddl_of(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema of flat (or string-list) columns, so each layout is defined once."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


BUFFER_DDL = ddl_of(SCHEMA)
# An effect: what one change does to one key (`algebra.KeyEffect`). `partial` and `named` say
# whether `before` is a partial image (`algebra.partial_image`) and carries the key
# (`algebra.carries_key`), `change_key` is laredo's key string of the image that names the key,
# `missing` the columns `after` lacks (unchanged TOASTed values, a JSON array), `link` the other
# key of a primary-key change.
EFFECT_ARROW = pa.schema([("key", pa.string()), ("seq", pa.int64()), ("existed", pa.bool_()),
                          ("before", pa.string()), ("partial", pa.bool_()), ("named", pa.bool_()),
                          ("after", pa.string()), ("change_key", pa.string()), ("missing", pa.string()),
                          ("link", pa.string())])
EFFECT_DDL = ddl_of(EFFECT_ARROW)
EFFECT_COLUMNS = tuple(EFFECT_ARROW.names)
# `ver`: the version of the key's last change (archive/versions.py), null where unknown. `old_pb`:
# the protobuf SnapshotRow of `old` when `old` is a row of the base that kept one (the diff's record
# reuses its Struct, diff_records.py), else null.
NET_DDL = "key STRING, action STRING, change_key STRING, old STRING, new STRING, ver STRING, old_pb BINARY"
NET_COLUMNS = tuple(c.split()[0] for c in NET_DDL.split(","))
#: A table state: each key's row (Go-JSON), its version, and its protobuf snapshot record when the row
#: was encoded as it entered (a copied row, a state's stored row), else null (`state.encode_rows`
#: encodes it then).
STATE_ARROW = pa.schema([("key", pa.string()), ("row", pa.string()), ("ver", pa.string()), RECORD_COLUMN])
STATE_DDL = ddl_of(STATE_ARROW)
#: A buffer row's version text (`archive.versions.version_text` in SQL): the one definition over the buffer's
#: columns (`copy_tasks.copy_versions` is its Arrow form for copied rows, held to it by tests/spark/test_copy_tasks.py).
VERSION_SQL = (f"concat_ws('{versions.SEP}', position, coalesce(commit_time, ''), "
               f"IF(action = 'SNAPSHOT', '{versions.COPY}', '{versions.CHANGE}'))")
_CHANGES = "action IN ('INSERT', 'UPDATE', 'DELETE')"
_BEFORE = "action IN ('UPDATE', 'DELETE') OR (action = 'INSERT' AND old IS NOT NULL)"  # a change with a before-image

EffectRow = tuple[str | None, int, bool | None, str | None, bool | None, bool | None, str | None, str | None,
                  str | None, str | None]


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


# --- the single-process reading of buffer rows (oracle, reconstruction) ----------------------------


def buffer_change(action: str, key: str | None, old: str | None, new: str | None,
                  key_fields: Sequence[str]) -> Change:
    """A buffer row as the `Change` the source sent.

    The change's key string is laredo's, computed from its image (the buffer's `change_key` holds
    the same), or from the typed key for an image-less row. The single-process oracle in tests
    reads the buffer with it.
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


def change_effects(seq: int, change: Change, key_fields: Sequence[str]) -> list[EffectRow]:
    """`algebra.key_effects` of one decoded change as effect rows (images re-encoded): for
    changes that come decoded (an archived diff being reconstructed), not from the buffer."""

    def text(image: Row | None) -> str | None:
        return None if image is None else encode_row(image, key_fields)

    effects = key_effects(change, key_fields)
    moved = len(effects) == 2
    return [(key_json(e.key), seq, e.existed, text(e.before), partial_image(e.before, key_fields),
             carries_key(e.before, key_fields), text(e.after),
             gojson.valid_text(laredo_row_key(e.before, key_fields) if moved and e.after is None else e.source_key),
             None, key_json(effects[1 - i].key) if moved else None)
            for i, e in enumerate(effects)]


def truncate_effect(seq: int) -> EffectRow:
    """The effect row of a TRUNCATE (no key): readers of archived diffs order it by seq."""
    return (None, seq, None, None, None, None, None, None, None, None)


def arrow_batch(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> Any:
    """Row tuples as an Arrow batch of `schema` (what a `mapInArrow` task yields)."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)],
                                      schema=schema)


def effect_batch(rows: Sequence[EffectRow]) -> Any:
    """An Arrow batch in EFFECT_DDL layout."""
    return arrow_batch(rows, EFFECT_ARROW)


# --- reading the buffer ------------------------------------------------------------------------------


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


def read_window(spark: SparkSession, segments: Sequence[SegmentRef], s3: S3Connection | None = None, *,
                records: bool = False) -> DataFrame:
    """The buffer rows of `segments` (paths + seq filter, which Parquet statistics prune locally).
    Segments in S3 (`s3://` paths, signed by `s3`) are read by the tasks themselves (remote_io).
    With `records`, the frame has one more column, `pb` (`segments.RECORD_COLUMN`): the protobuf
    snapshot record of each copied text row, encoded beside its JSON."""
    if not segments:
        return spark.createDataFrame([], f"{BUFFER_DDL}, {_RECORD_DDL}" if records else BUFFER_DDL)
    return text_images(buffer_rows(spark, segments, s3), records=records)


def buffer_rows(spark: SparkSession, segments: Sequence[SegmentRef], s3: S3Connection | None = None) -> DataFrame:
    """The rows of `segments` as the buffer stores them (`read_window` without the images: a
    PostgreSQL row's images are still its column text). What a question about the rows' keys or
    count reads, since it need not type and encode every image in Python."""
    paths = list(dict.fromkeys(s.path for s in segments))
    return read_parquet_files(spark, paths, s3=s3, ddl=BUFFER_DDL).filter(seq_predicate(segments))


_TEXT_COLUMNS = ("old_text", "new_text")
_RECORD_DDL = ddl_of(pa.schema([RECORD_COLUMN]))
_NO_RECORD = f"CAST(NULL AS BINARY) AS {RECORD_COLUMN.name}"


def _image_batches(batches: Iterable[Any], records: bool) -> Iterator[Any]:
    """`with_images` of each batch, without the column texts it consumed: nothing after reads them,
    and sending a table's worth of them back to the JVM doubled the cost of reading a copy."""
    for batch in batches:
        batch = with_images(batch, records=records)
        for name in _TEXT_COLUMNS:
            index = batch.schema.get_field_index(name)
            field = batch.schema.field(index)
            batch = batch.set_column(index, field, pa.nulls(batch.num_rows, field.type))
        yield batch


def text_images(rows: DataFrame, *, records: bool = False) -> DataFrame:
    """Buffer rows kept as column text (PostgreSQL changes) get their images and derived columns, in
    tasks, with ingest's `encode_change` (`segments.with_images`); the other rows pass through.
    With `records`, every row has `pb` too (null but for copied text rows)."""
    text = F.col("codec").isNotNull()
    plain = rows.filter(~text)
    schema = rows.schema
    if records:
        plain = plain.withColumn(RECORD_COLUMN.name, F.lit(None).cast("binary"))
        schema = schema.add(RECORD_COLUMN.name, "binary")
    func = functools.partial(_image_batches, records=records)
    return plain.unionByName(rows.filter(text).mapInArrow(func, schema))


# --- the window: its facts, its cut, legacy rows -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowFacts:
    """What one aggregate over a window says about it (over every scope, for `scope` columns).

    `cuts` is a tiny local frame (scope columns, `cut`: the last TRUNCATE's seq or null) that
    `after_cut` joins; the flags say whether any change after the cut may need a step: `partial`
    a before-image from the base, `unnamed` a net DELETE named from its first after-image (an
    UPDATE whose before-image lacks a key field), `gaps` a fill, `legacy` an upgrade; and
    `befores` whether any net change can have a before-image at all (false: INSERTs only, none
    carrying an old image, as an append-only table's windows are).
    """

    cuts: DataFrame
    truncated: bool
    partial: bool
    unnamed: bool
    gaps: bool
    legacy: bool
    truncate_version: str | None = None  # the version of the last TRUNCATE (one scope: production)
    befores: bool = True


def window_facts(rows: DataFrame, scope: Sequence[str] = ()) -> WindowFacts:
    """One aggregate over the buffer rows (collected: one row per scope, one in production).

    Legacy rows (their derived columns null) count as needing every step they might need.
    """
    seq = F.col("seq")
    facts = rows.groupBy(*scope).agg(
        F.max(F.when(F.col("action") == "TRUNCATE", seq)).alias("cut"),
        F.max(F.when(F.col("action").isin("UPDATE", "DELETE") & F.coalesce("old_partial", F.lit(True)), seq))
        .alias("partial"),
        F.max(F.when((F.col("action") == "UPDATE") & ~F.coalesce("old_carries_key", F.lit(False)), seq))
        .alias("unnamed"),
        F.max(F.when(F.col("unchanged").isNotNull(), seq)).alias("gap"),
        F.max(F.when(F.expr(_CHANGES) & F.col("change_key").isNull(), seq)).alias("legacy"),
        F.max(F.when(F.expr(_BEFORE), seq)).alias("before"),
        F.max_by(F.expr(VERSION_SQL), F.when(F.col("action") == "TRUNCATE", seq)).alias("truncate_version"),
    ).collect()

    def any_after(name: str) -> bool:
        return any(r[name] is not None and (r["cut"] is None or r[name] > r["cut"]) for r in facts)

    schema = ", ".join([*(f"`{c}` {rows.schema[c].dataType.simpleString()}" for c in scope), "cut BIGINT"])
    cuts = rows.sparkSession.createDataFrame([(*(r[c] for c in scope), r["cut"]) for r in facts], schema)
    truncates = [r["truncate_version"] for r in facts if r["cut"] is not None]
    return WindowFacts(cuts, any(r["cut"] is not None for r in facts), any_after("partial"), any_after("unnamed"),
                       any_after("gap"), any_after("legacy"), truncates[0] if len(truncates) == 1 else None,
                       any_after("before"))


def after_cut(rows: DataFrame, facts: WindowFacts, scope: Sequence[str] = ()) -> DataFrame:
    """The changes after each scope's last TRUNCATE (it is written first and wipes the rest), with
    `truncated`: whether there was one (then every key starts absent: `KeyNet.start`)."""
    cuts = F.broadcast(facts.cuts)
    joined = rows.join(cuts, list(scope), "inner") if scope else rows.crossJoin(cuts)
    return (joined.filter(F.expr(_CHANGES) & (F.col("cut").isNull() | (F.col("seq") > F.col("cut"))))
            .withColumn("truncated", F.col("cut").isNotNull()).drop("cut"))


_DERIVED = ("old_key", "change_key", "old_change_key", "old_partial", "old_carries_key")


def _legacy_batches(batches: Iterable[Any], key_fields: tuple[str, ...]) -> Iterator[Any]:
    for batch in batches:
        columns = {name: batch.column(name).to_pylist() for name in ("action", "key", "old", "new", "position")}
        derived = [derived_columns(Action(action), key, decode_row(old), decode_row(new), key_fields,
                                   f"{action} at {pos}")
                   for action, key, old, new, pos in zip(*columns.values(), strict=True)]
        for name, values in zip(_DERIVED, zip(*derived, strict=True), strict=True):
            index = batch.schema.get_field_index(name)
            batch = batch.set_column(index, batch.schema.field(index), pa.array(values, batch.schema.field(index).type))
        yield batch


def upgrade_legacy(changes: DataFrame, key_fields: Sequence[str]) -> DataFrame:
    """Rows from segments written before the derived columns existed get them (in a task, with
    ingest's `derived_columns`); the other rows pass through untouched."""
    legacy = F.col("change_key").isNull()
    func = functools.partial(_legacy_batches, key_fields=tuple(key_fields))
    derived = changes.filter(legacy).mapInArrow(func, changes.schema)
    return changes.filter(~legacy).unionByName(derived)


# --- explode, fold, net ------------------------------------------------------------------------------

_NULL = "CAST(NULL AS STRING)"
_EXPLODE = f"""inline(CASE WHEN old_key IS NOT NULL THEN array(
    named_struct('key', old_key, 'existed', true, 'before', old, 'partial', old_partial, 'named', old_carries_key,
                 'after', {_NULL}, 'change_key', old_change_key, 'missing', {_NULL}, 'link', key),
    named_struct('key', key, 'existed', false, 'before', {_NULL}, 'partial', true, 'named', false,
                 'after', new, 'change_key', change_key, 'missing', unchanged, 'link', old_key))
  ELSE array(named_struct('key', key, 'existed', action <> 'INSERT', 'before', IF(action = 'INSERT', NULL, old),
                 'partial', action = 'INSERT' OR old_partial, 'named', action <> 'INSERT' AND old_carries_key,
                 'after', IF(action = 'DELETE', NULL, new), 'change_key', change_key,
                 'missing', IF(action = 'DELETE', NULL, unchanged), 'link', {_NULL})) END)"""


def explode(changes: DataFrame, scope: Sequence[str] = ()) -> DataFrame:
    """Changes (after the cut) -> effects (EFFECT_DDL, then scope and `truncated`): `key_effects`."""
    return changes.selectExpr(*scope, "truncated", "seq", _EXPLODE).select(*EFFECT_COLUMNS, *scope, "truncated")


def fold(effects: DataFrame, *, partitions: int, scope: Sequence[str] = ()) -> DataFrame:
    """Each key's effects -> its first and last (KeyNet.start / fold): one row per key with
    `existed` (at the window's start), `before`, `partial`, `named`, `first_after`, `first_key`
    (the first effect's images, their flags and key string) and `after`, `last_key` (the last
    effect's).

    One shuffle by key, sorted by (key, seq) inside the partitions, so the per-key aggregate runs
    on sorted input without another sort.
    """
    by = [*scope, "key"]
    first = F.min_by(F.struct("existed", "truncated", "before", "partial", "named", "after", "change_key"), "seq")
    last = F.max_by(F.struct("after", "change_key"), "seq")
    return (effects.repartition(partitions, *by).sortWithinPartitions(*by, "seq")
            .groupBy(*by).agg(first.alias("first"), last.alias("last"))
            .select(*by, (F.col("first.existed") & ~F.col("first.truncated")).alias("existed"),
                    F.col("first.before").alias("before"), F.col("first.partial").alias("partial"),
                    F.col("first.named").alias("named"), F.col("first.after").alias("first_after"),
                    F.col("first.change_key").alias("first_key"), F.col("last.after").alias("after"),
                    F.col("last.change_key").alias("last_key")))


def _named_batches(batches: Iterable[Any], key_fields: tuple[str, ...]) -> Iterator[Any]:
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in ("before", "first_after")]
        old = []
        for before, first_after in zip(*columns, strict=True):
            effect = KeyEffect((), True, decode_row(before), decode_row(first_after), "")
            named = KeyNet.start(effect, truncated=False, key_fields=key_fields).delete_old
            old.append(None if named is None else encode_row(named, key_fields))
        index = batch.schema.get_field_index("before")
        batch = batch.set_column(index, batch.schema.field(index), pa.array(old, batch.schema.field(index).type))
        if BEFORE_RECORD in batch.schema.names:  # a new image: the base's record is not its record
            index = batch.schema.get_field_index(BEFORE_RECORD)
            batch = batch.set_column(index, batch.schema.field(index), pa.nulls(batch.num_rows, pa.binary()))
        yield batch


#: A folded key's column holding the base's protobuf record of its `before` image, when
#: `images.complete_befores` took that image from the base (else absent or null).
BEFORE_RECORD = "before_pb"


def net_rows(folded: DataFrame, key_fields: Sequence[str], scope: Sequence[str] = (), *,
             unnamed: bool = True) -> DataFrame:
    """Folded keys -> net changes (NET_DDL, then scope): KeyNet.to_change.

    start absent, end present: INSERT; present, present: UPDATE first before -> last after;
    present, absent: DELETE with the first before-image (named with its key); absent, absent:
    nothing. The key string is the last after-image's, or for a DELETE the first image's.
    `unnamed=False` (no UPDATE in the window sent a before-image without its key) skips the
    Python branch that names a DELETE's before-image; with it, `folded` is read twice (materialize
    it first).
    """
    present, existed = F.col("after").isNotNull(), F.col("existed")
    rows = folded.filter(present | existed)
    if unnamed:
        # KeyNet.start's delete_old: a before-image that does not name its key takes the key values
        # of the first after-image (a new image, so Python encodes it; only such DELETEs go there).
        need = ~present & F.col("first_after").isNotNull() & ~F.coalesce("named", F.lit(False))
        func = functools.partial(_named_batches, key_fields=tuple(key_fields))
        rows = rows.filter(~need).unionByName(rows.filter(need).mapInArrow(func, rows.schema))
    record = F.col(BEFORE_RECORD) if BEFORE_RECORD in folded.columns else F.lit(None).cast("binary")
    return rows.select(
        "key",
        F.when(present, F.when(existed, F.lit("UPDATE")).otherwise(F.lit("INSERT"))).otherwise(F.lit("DELETE"))
        .alias("action"),
        F.when(present, F.col("last_key")).otherwise(F.col("first_key")).alias("change_key"),
        F.when(existed, F.col("before")).alias("old"),
        F.col("after").alias("new"),
        F.lit(None).cast("string").alias("ver"),
        F.when(existed, record).alias("old_pb"),
        *scope)


def net_changes(effects: DataFrame, key_fields: Sequence[str], *, truncated: bool, partitions: int) -> DataFrame:
    """Effects (EFFECT_DDL, complete images) -> one net change per key (NET_DDL)."""
    marked = effects.select(*EFFECT_COLUMNS, F.lit(truncated).alias("truncated"))
    return net_rows(fold(marked, partitions=partitions), key_fields)


def key_versions(changes: DataFrame) -> DataFrame:
    """(key, ver): every key the changes touch (both keys of a primary-key change) with the version
    of its last change, by seq. Over the changes after the cut: proportional to the window."""
    touched = changes.selectExpr("seq", f"{VERSION_SQL} AS ver", "explode(array_compact(array(key, old_key))) AS key")
    return touched.groupBy("key").agg(F.max_by("ver", "seq").alias("ver"))


def with_versions(net: DataFrame, changes: DataFrame) -> DataFrame:
    """Net changes (NET_DDL) with `ver` from `key_versions` of the changes they were folded from."""
    return net.drop("ver").join(key_versions(changes), "key", "left").select(*NET_COLUMNS)


def apply_net(base: DataFrame, net: DataFrame) -> DataFrame:
    """The new state (STATE_DDL): base rows whose key no net change touches, plus every key whose
    net change leaves a row (INSERT/UPDATE: its `new`, its version). A net DELETE just removes the key."""
    untouched = base.join(net.select("key"), "key", "left_anti")
    return untouched.unionByName(net.filter("new IS NOT NULL").selectExpr("key", "new AS row", "ver", _NO_RECORD))


def materialize(frame: DataFrame, where: Path | Location) -> DataFrame:
    """Write `frame` once and read it back, so the steps after it never recompute it. A scratch
    location in S3 is written and read by the tasks (remote_io): on a cluster no disk is shared."""
    place = Location.of(where)
    write_dataset(frame, place)
    if not place.remote:
        return frame.sparkSession.read.schema(frame.schema).parquet(place.uri)
    return read_dataset(frame.sparkSession, place)


def default_partitions(spark: SparkSession) -> int:
    """The shuffle width: `spark.sql.shuffle.partitions` (small by default on a local runtime)."""
    return max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or "4"))


WINDOW_CHANGES_CONF = "spark.snapshotter.windowChangesPerPartition"
"""The Spark setting (`spark.conf` in the config file) of how many of a window's changes one
partition of its shuffles takes at least; WINDOW_CHANGES_PER_PARTITION when unset."""
WINDOW_CHANGES_PER_PARTITION = 20_000


def window_partitions(spark: SparkSession, segments: Sequence[SegmentRef]) -> int:
    """The shuffle width for the window of `segments`: `default_partitions`, but no more than one
    partition per WINDOW_CHANGES_CONF changes of the window (the segments' counts: an upper bound).

    Why: the width is an explicit `repartition(n, key)`, which adaptive execution does not coalesce,
    and on a cluster each partition of a materialized step is a scratch file in S3 that a task of
    its own writes and another reads back. With Spark's default of 200, a diff of a few dozen
    changes ran stages of 200 tasks and took 2.5 minutes against a Connect server. The artifacts'
    bytes do not depend on the width (their rows are encoded in key order); at 20,000 changes a
    partition, a window of 100,000 still fills the 4 partitions of a local runtime's two cores.
    """
    per = int(spark.conf.get(WINDOW_CHANGES_CONF, str(WINDOW_CHANGES_PER_PARTITION)) or WINDOW_CHANGES_PER_PARTITION)
    if per < 1:
        raise ValueError(f"{WINDOW_CHANGES_CONF} must be a positive number of changes, got {per}")
    changes = sum(s.changes for s in segments)
    return max(1, min(default_partitions(spark), -(-changes // per)))
