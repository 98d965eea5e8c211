"""The snapshot job: previous state + every change since it -> the full table at `to_position`.

Two ways, both ending in a new STATE dataset (`state.StateBase`) and the artifact's pieces:

  incremental  the base is a bucketed state (with the deltas of the diffs after it) and nothing
               since wiped the table: the keys changed since the state are encoded (Python per
               changed key only), the buckets they fall in are read, merged with them and rewritten
               (`state.write_buckets`); every other bucket keeps its rows file, and its bytes in the
               new object are a `Reuse` of the previous snapshot object's range (`previous_keys`)
               or, without one, its stored bytes concatenated again (`regenerate`). Cost: the changed
               buckets, not the table.
  full         anything else (the initial load, a re-sync, a TRUNCATE, an artifact base, a state
               whose buckets grew out of balance): the table is computed, its rows encoded once,
               range-bucketed on sampled sort-key bounds and written.

What runs where: the driver collects bucket reports and a few aggregates (row counts, the touched
bucket ids), never a row. Parquet is written from the state's rows by its own writer.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from resources.buffer.reader import SegmentRef
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.spark.bases import Base, LayeredBase, latest_images
from snapshot_assets.spark.effects import default_partitions, materialize
from snapshot_assets.spark.parquet_artifact import SchemaMisfit, infer_row_schema, typed_columns, write_snapshot
from snapshot_assets.spark.parts import BuiltArtifact, Reuse, StagedFormat, prepare_staging
from snapshot_assets.spark.state import (
    BYTE_FORMATS,
    MAX_GROWTH,
    ROWS_DDL,
    TARGET_BUCKET_BYTES,
    StateBase,
    bucket_count,
    bucket_expr,
    buckets_from_reports,
    concatenated,
    emptied,
    encode_rows,
    sample_bounds,
    write_buckets,
)
from snapshot_assets.spark.window import advance, net_window

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StateBuild:
    """A written state and which of its buckets this build wrote (the rest are reused)."""

    state: StateBase
    written: frozenset[int]
    blobs: Mapping[tuple[str, int], Path]
    mode: str


def _incremental_base(base: Base, fields: tuple[str, ...], formats: Sequence[str],
                      schema: RowSchema | None) -> LayeredBase | None:
    """The layered bucketed state an incremental build can start from, or None."""
    layered = LayeredBase(base, ()) if isinstance(base, StateBase) else base
    if not isinstance(layered, LayeredBase) or not layered.state.buckets or layered.truncated:
        return None
    state = layered.state
    if state.key_fields != fields or set(formats) != set(state.formats):
        return None  # the bytes or typed columns of another set of formats
    if "parquet" in formats and (state.schema is None or (schema is not None and schema != state.schema)):
        return None  # the table's shape changed: type every row again
    return layered


def _blobs(reports: Iterable[Any]) -> dict[tuple[str, int], Path]:
    return {(r["format"], int(r["bucket"])): Path(r["blob"]) for r in reports if r["format"]}


def _full(spark: SparkSession, table: DataFrame, fields: tuple[str, ...], formats: Sequence[str], pool: Path,
          staging: Path, state_dir: Path, position: str, bucket_bytes: int, schema: RowSchema | None) -> StateBuild:
    stats = table.selectExpr("count(*) AS n", "coalesce(sum(octet_length(row) + 1), 0) AS b").collect()[0]
    rows, size = int(stats["n"]), int(stats["b"])
    bounds = sample_bounds(table, bucket_count(rows, size, bucket_bytes), rows)
    encoded = encode_rows(table, fields, formats)
    if "parquet" in formats:  # the typed columns, once per row as it enters; the schema once per epoch
        schema = schema or infer_row_schema(table)
        encoded = typed_columns(encoded, schema)
    reports = write_buckets(encoded, bounds, len(bounds) + 1, pool, staging, formats)
    buckets = buckets_from_reports(reports, bounds)
    state = StateBase(str(state_dir), position, sum(b.rows for b in buckets), fields, buckets, tuple(formats),
                      schema if "parquet" in formats else None)
    return StateBuild(state, frozenset(i for i, b in enumerate(buckets) if b.path), _blobs(reports), "full")


def _incremental(spark: SparkSession, layered: LayeredBase, window: DataFrame | None, fields: tuple[str, ...],
                 formats: Sequence[str], pool: Path, staging: Path, state_dir: Path, position: str) -> StateBuild:
    """Rewrite the buckets the changes since the state fall in. SchemaMisfit when a changed row does
    not fit the state's typed columns (the caller re-types the table with a new schema)."""
    state = layered.state
    layers = [d.rows(spark, formats) or encode_rows(d.frame(spark).selectExpr("key", "new AS row"), fields, formats)
              for d in layered.deltas]
    if window is not None:
        layers.append(encode_rows(window.selectExpr("key", "new AS row"), fields, formats))
    bounds = state.bounds
    if not layers:
        return StateBuild(replace(state, path=str(state_dir), position=position), frozenset(), {}, "incremental")
    changed = materialize(latest_images(layers, ROWS_DDL), staging / "_work" / "changed")
    touched = sorted(int(r["b"]) for r in changed.selectExpr(f"{bucket_expr(bounds)} AS b").distinct().collect())
    upserts = changed.filter("row IS NOT NULL")
    if state.schema is not None:
        old = state.typed_frame(spark, touched) if any(state.buckets[i].path for i in touched) else None
        upserts = typed_columns(upserts, state.schema)
    else:
        old = state.rows_frame(spark, touched)
    merged = upserts if old is None else \
        old.join(changed.select("key"), "key", "left_anti").unionByName(upserts)
    reports = write_buckets(merged, bounds, len(touched), pool, staging, formats)
    buckets = buckets_from_reports(reports, bounds, emptied(state.buckets, touched, formats))
    built = replace(state, path=str(state_dir), position=position, rows=sum(b.rows for b in buckets),
                    buckets=buckets)
    return StateBuild(built, frozenset(touched), _blobs(reports), "incremental")


def _out_of_balance(state: StateBase, bucket_bytes: int) -> bool:
    return any(b.sizes.get("jsonl", 0) > MAX_GROWTH * bucket_bytes for b in state.buckets)


# --- the artifact's pieces ---------------------------------------------------------------------------


def _regenerate_task(batches: Iterable[Any], staging: str, formats: tuple[str, ...]) -> Iterator[Any]:
    """Re-concatenate the stored bytes of whole buckets (rows files), no decoding."""
    from snapshot_assets.spark.state import _lines

    done: list[tuple[str, int, str, int]] = []
    for batch in batches:
        for bucket, path in zip(batch.column("bucket").to_pylist(), batch.column("path").to_pylist(), strict=True):
            outs = {f: open(Path(staging) / f / f"bucket-{bucket:05d}", "wb") for f in formats}  # noqa: SIM115
            try:
                for rows in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=["row", "pb"]):
                    for fid, out in outs.items():
                        out.write(concatenated(_lines(rows) if fid == "jsonl" else rows.column("pb")))
            finally:
                for out in outs.values():
                    out.close()
            done.extend((f, bucket, str(Path(staging) / f / f"bucket-{bucket:05d}"), 0) for f in formats)
    columns = list(zip(*done, strict=True)) if done else [(), (), (), ()]
    yield pa.RecordBatch.from_arrays([pa.array(columns[0], pa.string()), pa.array(columns[1], pa.int32()),
                                      pa.array(columns[2], pa.string()), pa.array(columns[3], pa.int64())],
                                     names=["format", "bucket", "blob", "bytes"])


def regenerate(spark: SparkSession, state: StateBase, indexes: Sequence[int], staging: Path,
               formats: Sequence[str]) -> dict[tuple[str, int], Path]:
    """Blobs of untouched buckets from their stored bytes (when no previous object can be copied)."""
    todo = [(i, state.buckets[i].path) for i in indexes if state.buckets[i].path]
    if not todo:
        return {}
    fids = tuple(f for f in formats if f in BYTE_FORMATS)
    frame = spark.createDataFrame(todo, "bucket INT, path STRING").repartition(len(todo))
    func = functools.partial(_regenerate_task, staging=str(staging), formats=fids)
    rows = frame.mapInArrow(func, "format STRING, bucket INT, blob STRING, bytes BIGINT").collect()
    return {(r["format"], int(r["bucket"])): Path(r["blob"]) for r in rows}


def byte_pieces(build: StateBuild, format_id: str, previous: StateBase | None,
                previous_key: str | None) -> StagedFormat:
    """The object of one byte format, bucket by bucket: fresh blobs, and ranges of the previous object."""
    pieces: list[Path | Reuse] = []
    starts = previous.offsets(format_id) if previous is not None else []
    total = 0
    for i, bucket in enumerate(build.state.buckets):
        size = bucket.sizes.get(format_id, 0)
        total += size
        if size == 0:
            continue
        blob = build.blobs.get((format_id, i))
        if blob is not None:
            pieces.append(blob)
            continue
        if previous is None or previous_key is None:
            raise RuntimeError(f"bucket {i} of {format_id} has neither a fresh blob nor a previous object")
        start = starts[i]
        last = pieces[-1] if pieces else None
        if isinstance(last, Reuse) and last.start + last.length == start:
            pieces[-1] = Reuse(previous_key, last.start, last.length + size)
        else:
            pieces.append(Reuse(previous_key, start, size))
    return StagedFormat(format_id, tuple(pieces), total)


# --- the job -----------------------------------------------------------------------------------------


def build_snapshot(spark: SparkSession, base: Base, segments: Sequence[SegmentRef], to_position: str,
                   key_fields: Sequence[str], formats: Sequence[str], staging_dir: Path | str,
                   state_dir: Path | str, *, partitions: int | None = None,
                   previous_keys: Mapping[str, str] | None = None,
                   bucket_bytes: int = TARGET_BUCKET_BYTES, schema: RowSchema | None = None) -> BuiltArtifact:
    """Build the snapshot at `to_position` from `base` and the changes of `segments` (the window
    (base.position, to_position]); writes the new STATE dataset to `state_dir` (bucket files to the
    pool beside it) and stages every format. `previous_keys` (format -> object key of the snapshot the
    base's state was built for, present on every destination) lets untouched buckets be copied from
    it; `bucket_bytes` is the jsonl size a full build aims at per bucket; `schema` is the table's row
    schema for parquet's typed columns (None: inferred from the rows, once per epoch).
    `details["state"]` is the written `StateBase`."""
    if not to_position:
        raise ValueError("a snapshot needs a non-empty position")
    if not formats:
        raise ValueError("a snapshot needs at least one format")
    started = time.monotonic()
    fields, fmts = tuple(key_fields), tuple(formats)
    staging = prepare_staging(staging_dir, fmts)
    state_path = Path(state_dir)
    pool = state_path.resolve().parent / "buckets"
    width = partitions or default_partitions(spark)
    layered = _incremental_base(base, fields, fmts, schema)
    truncated = False
    build: StateBuild | None = None
    if layered is not None:
        window = None
        if segments:
            net = net_window(spark, segments, layered, fields, partitions=width, scratch=staging / "_work")
            truncated, window = net.truncated, net.net
        if not truncated:
            try:
                build = _incremental(spark, layered, window, fields, fmts, pool, staging, state_path, to_position)
            except SchemaMisfit:
                if schema is not None:
                    raise  # the source's own schema: a real misfit
                log.info("snapshot at %s: a changed row does not fit the inferred columns; re-typing", to_position)
    if build is not None and _out_of_balance(build.state, bucket_bytes):
        log.info("snapshot at %s: a bucket outgrew %d x its target; re-bucketing", to_position, MAX_GROWTH)
        build = _full(spark, build.state.frame(spark, fields), fields, fmts, pool, staging, state_path, to_position,
                      bucket_bytes, build.state.schema)
    elif build is None:
        table, truncated = advance(spark, base, segments, fields, partitions=width, scratch=staging / "_work")
        build = _full(spark, table, fields, fmts, pool, staging, state_path, to_position, bucket_bytes, schema)
    state = build.state
    previous = layered.state if layered is not None and build.mode == "incremental" else None
    keys = previous_keys or {}
    untouched = [i for i in range(len(state.buckets)) if i not in build.written]
    if previous is not None and any(f not in keys for f in fmts if f in BYTE_FORMATS):
        build = StateBuild(state, build.written,
                           {**build.blobs, **regenerate(spark, state, untouched, staging, fmts)}, build.mode)
    staged: dict[str, StagedFormat] = {}
    for fid in fmts:
        if fid in BYTE_FORMATS:
            staged[fid] = byte_pieces(build, fid, previous, keys.get(fid))
    if "parquet" in fmts:  # Spark's writer, one file, from the state's typed columns (nothing re-typed)
        target = staging / "parquet" / "snapshot.parquet"
        written = write_snapshot(state.typed_frame(spark), target) if state.rows else \
            write_snapshot(typed_columns(spark.createDataFrame([], "key STRING, row STRING"),
                                         state.schema or RowSchema.of(())), target)
        if written.rows != state.rows:
            raise RuntimeError(f"the parquet snapshot holds {written.rows} rows but the state {state.rows}")
        staged["parquet"] = StagedFormat("parquet", (written.path,), written.bytes)
    state.save()
    built = BuiltArtifact("snapshot", None, to_position, state.rows, staged, truncated, time.monotonic() - started,
                          {"state": state, "base": base.describe(), "segments": len(segments), "mode": build.mode,
                           "buckets": len(state.buckets), "rewritten": len(build.written)})
    log.info("snapshot at %s (%s) from %s + %d segments: %d rows, %d of %d buckets written in %.2fs", to_position,
             build.mode, base.describe(), len(segments), state.rows, len(build.written), len(state.buckets),
             built.seconds)
    return built


__all__ = ["StateBase", "build_snapshot"]
