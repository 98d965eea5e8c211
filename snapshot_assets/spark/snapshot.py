"""The snapshot job: previous state + every change since it -> the full table at `to_position`.

Two ways, both ending in a new STATE dataset (`state.StateBase`) and the artifact's pieces:

  incremental  the base is a bucketed state (with the deltas of the diffs after it) and nothing
               since wiped the table: the keys changed since the state are encoded (Python per
               changed key only) and shuffled to the buckets they fall in; the task rewriting such
               a bucket reads its stored rows file itself and merges them in with Arrow kernels
               (`state.write_buckets(into=...)`); every other bucket keeps its rows file, and its bytes in the
               new object are a `Reuse` of the previous snapshot object's range (`previous_keys`)
               or, without one, its stored bytes concatenated again (`regenerate`). A bucket the
               changes would grow out of balance is cut into parts (bucket_split.py). Cost: the
               changed buckets, not the table.
  full         anything else (the initial load, a re-sync, a TRUNCATE, an artifact base, a state
               whose buckets are out of balance all the same): the table is computed, its rows encoded once,
               range-bucketed on sampled sort-key bounds and written.

What runs where: the driver collects bucket reports and a few aggregates (row counts, the touched
bucket ids), never a row. Parquet is written from the state's rows by its own writer.

Where things live (locations.py): the buffer's segments, the state (bucket files + marker) and the
staging folder are local paths or S3 locations. With `targets` the tasks send each bucket's bytes
straight into the artifact's destinations (pieces.py: one multipart upload per format and
destination, begun here, completed by `assemble`); without, they stage files locally (a local
runtime only). On a cluster everything is in S3 and nothing is read or written through a disk
the driver shares with the executors.
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
from pyspark.sql import functions as F

from resources.buffer.reader import SegmentRef
from resources.buffer.segments import TYPED_COLUMN
from resources.destinations.s3 import S3Connection
from snapshot_assets.archive import versions
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.formats.parquet_merge import MAGIC
from snapshot_assets.archive.key_index import block_bytes_for
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.spark.bases import Base, BufferSnapshotBase, Census, LayeredBase, latest_images, with_cells
from snapshot_assets.spark.bucket_split import GROWN_SQL, Growth, out_of_balance, overgrowing, split_buckets
from snapshot_assets.spark.effects import materialize, window_partitions
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.parquet_artifact import (
    PARQUET_FORMAT,
    SchemaMisfit,
    check_names,
    infer_row_schema,
    snapshot_arrow_schema,
    typed_columns,
)
from snapshot_assets.spark.parquet_pieces import BucketParquet, parquet_object, piece_of, piece_writer
from snapshot_assets.spark.parts import BuiltArtifact, StagedFormat, bucket_pieces, prepare_staging
from snapshot_assets.spark.pieces import Sent, Targets, Uploads
from snapshot_assets.spark.remote_io import input_file
from snapshot_assets.spark.state import (
    BYTE_FORMATS,
    MAX_GROWTH,
    ROWS_DDL,
    TARGET_BUCKET_BYTES,
    StateBase,
    bucket_count,
    bucket_expr,
    bucket_writer,
    buckets_from_reports,
    emptied,
    encode_rows,
    piece_bytes,
    piece_formats,
    write_buckets,
)
from snapshot_assets.spark.window import advance, net_window

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StateBuild:
    """A written state and which of its buckets this build wrote (the rest are reused)."""

    state: StateBase
    written: frozenset[int]
    blobs: Mapping[tuple[str, int], Path | Sent]
    mode: str
    shuffle: str = "spark"  # how the rows reached their buckets: Spark's shuffle, or a copy's "runs" (copy_tasks)
    #: each bucket's index in the previous state (None: a part of a split bucket, written fresh);
    #: None when the bounds are the previous state's (bucket_split.py)
    origins: tuple[int | None, ...] | None = None

    def previous_starts(self, previous: StateBase | None, format_id: str) -> list[int | None]:
        """Where each of this state's buckets starts in the previous state's snapshot object of
        `format_id` (None: a split bucket's part, which is not in it and is always written fresh)."""
        if previous is None:
            return []
        starts = previous.offsets(format_id)
        if self.origins is None:
            return list(starts)
        return [starts[o] if o is not None else None for o in self.origins]


class _Pieces:
    """Where this build's byte-format pieces go: files in the local staging folder, or (with
    targets) the uploads of the attempt that writes them, sent into by the tasks."""

    def __init__(self, staging: Location, targets: Targets | None, object_keys: Mapping[str, str]) -> None:
        self.staged = None if targets is not None else staging.path
        self._targets, self._keys = targets, object_keys
        self.uploads: Uploads | None = None

    def begin(self, pieces: int) -> Uploads | None:
        """Fresh uploads for an attempt that writes up to `pieces` buckets (an abandoned attempt's are
        aborted); two more pieces for parquet's magic and footer (parquet_pieces.py)."""
        self.abort()
        if self._targets is not None and self._keys:
            self.uploads = Uploads.begin(self._targets.destinations, self._keys, pieces + 2)
        return self.uploads

    def current(self, pieces: int) -> Uploads | None:
        """The attempt's uploads (begun now if the attempt wrote no bucket)."""
        return self.uploads if self.uploads is not None else self.begin(pieces)

    def abort(self) -> None:
        if self.uploads is not None:
            self.uploads.abort()
            self.uploads = None

    def blobs(self, reports: Iterable[Any]) -> dict[tuple[str, int], Path | Sent]:
        """Each reported piece (format, bucket) as the driver assembles it."""
        return {(r["format"], int(r["bucket"])): Sent.parse(piece_of(r["format"], int(r["bucket"])), int(r["bytes"]),
                                                            r["blob"])
                if self._targets is not None else Path(r["blob"]) for r in reports if r["format"]}


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
    if any(b.index is None and b.rows for b in state.buckets):
        return None  # a state written before buckets kept key index entries: one full build writes them
    return layered


def _full(spark: SparkSession, table: DataFrame | None, fields: tuple[str, ...], formats: Sequence[str],
          pool: Location, pieces: _Pieces, state_dir: Location, position: str, bucket_bytes: int,
          schema: RowSchema | None, copy: BufferSnapshotBase | None = None, scratch: Location | None = None
          ) -> StateBuild:
    """Type, encode and bucket every row of `table`, or of the `copy` (initial load, re-sync: encoded
    once into sorted runs in `scratch` whose reports are its census, and merged into buckets by
    copy_tasks' own tasks without Spark's shuffle, unless a row needs typing in the JVM). `table`
    is read three times (its count and size, a sample of its keys, its rows): it must be cheap to
    read again."""
    parquet = _parquet_schema(formats, schema)
    block = block_bytes_for(bucket_bytes)
    if copy is not None:
        assert scratch is not None, "a copy's runs go to the build's scratch folder"
        with copy.sorted_runs(spark, fields, formats, schema, scratch, bucket_bytes) as runs:
            if runs is not None:
                census = Census(runs.rows, runs.jsonl_bytes, samples=runs.samples)
                bounds = census.bounds(bucket_count(census.rows, census.jsonl_bytes, bucket_bytes))
                write = bucket_writer(pool, pieces.staged, formats, pieces.begin(len(bounds) + 1), block,
                                      parquet=parquet)
                return _state_build_of(runs.write(spark, bounds, write), bounds, pieces, state_dir, position, fields,
                                       formats, schema, "runs")
        log.info("snapshot at %s: a copied row needs the JVM's typing; bucketing through Spark's shuffle", position)
        census = copy.census(spark)
        encoded = copy.encoded(spark, fields, formats, schema)
    else:
        assert table is not None, "a full build reads a table or a copy"
        stats = table.selectExpr("count(*) AS n", f"coalesce(sum({GROWN_SQL}), 0) AS b").collect()[0]
        census = Census(int(stats["n"]), int(stats["b"]), table)
        encoded = encode_rows(table, fields, formats)
        if "parquet" in formats:  # the typed columns, once per row as it enters; the schema once per epoch
            schema = schema or infer_row_schema(table)
            encoded = typed_columns(encoded, schema)
            parquet = _parquet_schema(formats, schema)
    bounds = census.bounds(bucket_count(census.rows, census.jsonl_bytes, bucket_bytes))
    uploads = pieces.begin(len(bounds) + 1)
    reports = write_buckets(encoded, bounds, range(len(bounds) + 1), pool, pieces.staged, formats, uploads, block,
                            parquet=parquet)
    return _state_build_of(reports, bounds, pieces, state_dir, position, fields, formats, schema, "spark")


def _state_build_of(reports: list[Any], bounds: Sequence[bytes], pieces: _Pieces, state_dir: Location, position: str,
                    fields: tuple[str, ...], formats: Sequence[str], schema: RowSchema | None,
                    shuffle: str) -> StateBuild:
    """A full build's new state, from its bucket tasks' reports."""
    buckets = buckets_from_reports(reports, bounds)
    state = StateBase(state_dir.uri, position, sum(b.rows for b in buckets), fields, buckets, tuple(formats),
                      schema if "parquet" in formats else None, state_dir.s3)
    return StateBuild(state, frozenset(i for i, b in enumerate(buckets) if b.path), pieces.blobs(reports), "full",
                      shuffle)


def _incremental(spark: SparkSession, layered: LayeredBase, window: DataFrame | None, fields: tuple[str, ...],
                 formats: Sequence[str], pool: Location, pieces: _Pieces, scratch: Location, state_dir: Location,
                 position: str, bucket_bytes: int) -> StateBuild:
    """Rewrite the buckets the changes since the state fall in. SchemaMisfit when a changed row does
    not fit the state's typed columns (the caller re-types the table with a new schema)."""
    state = layered.state
    cells = state.schema  # the typed columns the changed rows need (None: the archive has no parquet)
    stored = [d.rows(spark, formats, cells) for d in layered.deltas]
    layers = [rows if rows is not None else with_cells(encode_rows(d.images(spark), fields, formats), cells)
              for d, rows in zip(layered.deltas, stored, strict=True)]
    if window is not None:
        images = window.selectExpr("key", "new AS row", "ver", "CAST(NULL AS BINARY) AS pb")
        layers.append(with_cells(encode_rows(images, fields, formats), cells))
    bounds = state.bounds
    moved = replace(state, path=state_dir.uri, s3=state_dir.s3, position=position)
    if not layers:
        return StateBuild(moved, frozenset(), {}, "incremental")
    changed = latest_images(layers, ROWS_DDL, [TYPED_COLUMN] if cells is not None else [])
    if not (window is None and len(stored) == 1 and stored[0] is not None):
        # Read twice below: kept in scratch, unless it is one diff's encoded delta (the usual
        # re-base), which is on disk already and read at a read's cost each time.
        changed = materialize(changed, scratch / "changed")
    # One pass over the changes says which buckets they fall in, what they add to each at most, and
    # whether any row still needs typing.
    untyped = f"row IS NOT NULL AND {TYPED_COLUMN} IS NULL" if cells is not None else "false"
    facts = changed.selectExpr(f"{bucket_expr(bounds)} AS b", f"{untyped} AS untyped", f"{GROWN_SQL} AS grown") \
        .groupBy("b").agg(F.max("untyped").alias("untyped"), F.count("*").alias("n"), F.sum("grown").alias("grown")) \
        .collect()
    touched: Sequence[int] = sorted(int(r["b"]) for r in facts)
    growth = {int(r["b"]): Growth(int(r["n"]), int(r["grown"])) for r in facts}
    if cells is not None and any(r["untyped"] for r in facts):
        # rows the diffs did not type (a window since the last diff, an older delta): typed now; a
        # deleted key's cells stay null
        changed = typed_columns(changed, cells, given=TYPED_COLUMN)
    into, origins = state, None
    parts = overgrowing(state, growth, bucket_bytes)
    if parts:
        log.info("snapshot at %s: splitting %d overgrowing bucket(s) into %d", position, len(parts),
                 sum(parts.values()))
        plan = split_buckets(spark, state, changed, parts, growth, touched, cells, scratch)
        into, changed, touched, origins = replace(state, buckets=plan.buckets), plan.changes, plan.touched, plan.origins
    uploads = pieces.begin(len(into.buckets))
    reports = write_buckets(changed, into.bounds, touched, pool, pieces.staged, formats, uploads,
                            block_bytes_for(bucket_bytes), into=into, parquet=_parquet_schema(formats, state.schema))
    buckets = buckets_from_reports(reports, into.bounds, emptied(into.buckets, touched, formats))
    built = replace(moved, rows=sum(b.rows for b in buckets), buckets=buckets)
    return StateBuild(built, frozenset(touched), pieces.blobs(reports), "incremental", origins=origins)


def _parquet_schema(formats: Sequence[str], schema: RowSchema | None) -> pa.Schema | None:
    """The schema of the buckets' parquet pieces, when the archive has parquet."""
    if "parquet" not in formats:
        return None
    return snapshot_arrow_schema(schema or RowSchema.of(()))


# --- the artifact's pieces ---------------------------------------------------------------------------


_REGENERATED_DDL = "format STRING, bucket INT, blob STRING, bytes BIGINT, footer BINARY"
_REGENERATED_ARROW = pa.schema([("format", pa.string()), ("bucket", pa.int32()), ("blob", pa.string()),
                                ("bytes", pa.int64()), ("footer", pa.binary())])


def _regenerate_task(batches: Iterable[Any], staging: str | None, formats: tuple[str, ...], uploads: Uploads | None,
                     s3: S3Connection | None, parquet: pa.Schema | None) -> Iterator[Any]:
    """Re-concatenate the stored bytes of whole buckets (rows files), no decoding; with a `parquet`
    schema, write each bucket's parquet piece again from its stored typed columns."""
    done: list[tuple[str, int, str, int, bytes | None]] = []
    stage = None if staging is None else Path(staging)
    for batch in batches:
        for bucket, path in zip(batch.column("bucket").to_pylist(), batch.column("path").to_pylist(), strict=True):
            outs = {f: piece_writer(f, bucket, stage, uploads) for f in formats}
            typed = None if parquet is None else BucketParquet(bucket, parquet, stage, uploads)
            try:
                with input_file(path, s3) as source:
                    wanted = ["row", "pb", "ver", *([TYPED_COLUMN] if typed is not None else [])]
                    for rows in pq.ParquetFile(source).iter_batches(batch_size=65536, columns=wanted):
                        for fid, out in outs.items():
                            out.stream.write(piece_bytes(rows, fid))
                        if typed is not None:
                            typed.add(rows.column(TYPED_COLUMN))
            except BaseException:
                for out in outs.values():
                    out.abort()
                raise
            for fid, out in outs.items():
                where, size = out.close()
                done.append((fid, bucket, where, size, None))
            if typed is not None:
                done.append((PARQUET_FORMAT, bucket, *typed.close()))
    columns: list[Any] = list(zip(*done, strict=True)) if done else [()] * len(_REGENERATED_ARROW)
    yield pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, _REGENERATED_ARROW, strict=True)],
                                     schema=_REGENERATED_ARROW)


def regenerate(spark: SparkSession, state: StateBase, indexes: Sequence[int], staging: Path | None,
               formats: Sequence[str], uploads: Uploads | None = None) -> tuple[StateBase, list[Any]]:
    """Pieces of untouched buckets from their stored bytes (when no previous object can be copied):
    staged in `staging`, or sent into `uploads`. The state with the regenerated buckets' parquet
    pieces (their sizes and footers), and the tasks' reports (format, bucket, blob, bytes, footer)."""
    todo = [(i, state.buckets[i].path) for i in indexes if state.buckets[i].path]
    if not todo:
        return state, []
    frame = spark.createDataFrame(todo, "bucket INT, path STRING").repartition(len(todo))
    func = functools.partial(_regenerate_task, staging=None if staging is None else str(staging),
                             formats=piece_formats(formats), uploads=uploads, s3=state.s3,
                             parquet=_parquet_schema(formats, state.schema))
    reports = list(frame.mapInArrow(func, _REGENERATED_DDL).collect())
    buckets = list(state.buckets)
    for r in reports:
        if r["format"] == PARQUET_FORMAT:
            i = int(r["bucket"])
            buckets[i] = replace(buckets[i], sizes={**buckets[i].sizes, PARQUET_FORMAT: int(r["bytes"])},
                                 footer=bytes(r["footer"]))
    return replace(state, buckets=tuple(buckets)), reports


def byte_pieces(build: StateBuild, format_id: str, previous: StateBase | None,
                previous_key: str | None) -> StagedFormat:
    """The object of one byte format, bucket by bucket: fresh pieces, and ranges of the previous object."""
    sizes = [bucket.sizes.get(format_id, 0) for bucket in build.state.buckets]
    fresh = {i: blob for (fid, i), blob in build.blobs.items() if fid == format_id}
    starts = build.previous_starts(previous, format_id)
    return StagedFormat(format_id, tuple(bucket_pieces(format_id, sizes, fresh, starts, previous_key)), sum(sizes))


# --- the job -----------------------------------------------------------------------------------------


def build_snapshot(spark: SparkSession, base: Base, segments: Sequence[SegmentRef], to_position: str,
                   key_fields: Sequence[str], formats: Sequence[str], staging_dir: Path | str | Location,
                   state_dir: Path | str | Location, *, partitions: int | None = None,
                   previous_keys: Mapping[str, str] | None = None,
                   bucket_bytes: int = TARGET_BUCKET_BYTES, schema: RowSchema | None = None,
                   targets: Targets | None = None, buffer_s3: S3Connection | None = None) -> BuiltArtifact:
    """Build the snapshot at `to_position` from `base` and the changes of `segments` (the window
    (base.position, to_position]); writes the new STATE dataset to `state_dir` (bucket files to the
    pool beside it) and stages every format. `previous_keys` (format -> object key of the snapshot the
    base's state was built for, present on every destination) lets untouched buckets be copied from
    it; `bucket_bytes` is the jsonl size a full build aims at per bucket; `schema` is the table's row
    schema for parquet's typed columns (None: inferred from the rows, once per epoch).
    `details["state"]` is the written `StateBase`.

    Locations (a local path, or a `Location` in S3 with its connection; `buffer_s3` signs the reads
    of segments in S3): with `targets` the tasks send the pieces into the destinations and
    `assemble` completes them (required when staging is in S3: a cluster); without, pieces are
    staged in `staging_dir` (a local runtime)."""
    if not to_position:
        raise ValueError("a snapshot needs a non-empty position")
    if not formats:
        raise ValueError("a snapshot needs at least one format")
    started = time.monotonic()
    fields, fmts = tuple(key_fields), tuple(formats)
    staging = prepare_staging(staging_dir, fmts)
    if staging.remote and targets is None:
        raise ValueError(f"staging {staging.uri} is in S3: the build needs its targets (the tasks send the pieces)")
    object_keys = {f: targets.key("snapshot", None, to_position, get_format(f).extension)
                   for f in fmts} if targets is not None else {}
    if targets is not None:
        object_keys[VERSIONS] = targets.key("snapshot", None, to_position, versions.EXTENSION)
    pieces = _Pieces(staging, targets, {f: k for f, k in object_keys.items()
                                        if f in piece_formats(fmts) or f == PARQUET_FORMAT})
    try:
        state_path = Location.of(state_dir)
        build, previous, truncated = _state_build(
            spark, base, segments, to_position, fields, fmts, staging, state_path, pieces,
            width=partitions or window_partitions(spark, segments), bucket_bytes=bucket_bytes, schema=schema,
            buffer_s3=buffer_s3)
        state = build.state
        keys = previous_keys or {}
        untouched = [i for i in range(len(state.buckets)) if i not in build.written]
        wanted = (*piece_formats(fmts), *([PARQUET_FORMAT] if PARQUET_FORMAT in fmts else []))
        regenerated = 0
        if previous is not None and any(f not in keys for f in wanted):
            state, again = regenerate(spark, state, untouched, pieces.staged, fmts, pieces.current(len(state.buckets)))
            build = replace(build, state=state, blobs={**build.blobs, **pieces.blobs(again)})
            regenerated = len({int(r["bucket"]) for r in again})
        staged: dict[str, StagedFormat] = {}
        for fid in fmts:
            if fid in BYTE_FORMATS:
                staged[fid] = byte_pieces(build, fid, previous, keys.get(fid))
        sidecars = {VERSIONS: byte_pieces(build, VERSIONS, previous, keys.get(VERSIONS))}
        if PARQUET_FORMAT in fmts:  # the buckets' pieces, the driver's magic and merged footer
            table_schema = state.schema or RowSchema.of(())
            check_names(spark, table_schema.names)
            staged[PARQUET_FORMAT] = parquet_object(
                [b.sizes.get(PARQUET_FORMAT, 0) for b in state.buckets], [b.footer for b in state.buckets],
                {i: blob for (fid, i), blob in build.blobs.items() if fid == PARQUET_FORMAT},
                [None if start is None else start + len(MAGIC)
                 for start in build.previous_starts(previous, PARQUET_FORMAT)],
                keys.get(PARQUET_FORMAT), snapshot_arrow_schema(table_schema), staging=pieces.staged,
                uploads=pieces.current(len(state.buckets)) if targets is not None else None)
        state.save()
    except BaseException:
        pieces.abort()
        raise
    uploads = pieces.uploads
    built = BuiltArtifact("snapshot", None, to_position, state.rows, staged, truncated, time.monotonic() - started,
                          {"state": state, "base": base.describe(), "segments": len(segments), "mode": build.mode,
                           "shuffle": build.shuffle,
                           "buckets": len(state.buckets), "rewritten": len(build.written),
                           "regenerated": regenerated}, uploads, sidecars)
    log.info("snapshot at %s (%s) from %s + %d segments: %d rows, %d of %d buckets written (%d regenerated: no "
             "previous object to copy from) in %.2fs", to_position, build.mode, base.describe(), len(segments),
             state.rows, len(build.written), len(state.buckets), regenerated, built.seconds)
    return built


def _state_build(spark: SparkSession, base: Base, segments: Sequence[SegmentRef], to_position: str,
                 fields: tuple[str, ...], fmts: tuple[str, ...], staging: Location, state_path: Location,
                 pieces: _Pieces, *, width: int, bucket_bytes: int, schema: RowSchema | None,
                 buffer_s3: S3Connection | None) -> tuple[StateBuild, StateBase | None, bool]:
    """The new state (incremental when the base allows, else full), the state whose snapshot object
    the untouched buckets' bytes come from (None after a full build), and whether a TRUNCATE was seen."""
    pool = state_path.parent / "buckets"
    scratch = staging / "_work"
    layered = _incremental_base(base, fields, fmts, schema)
    truncated = False
    build: StateBuild | None = None
    if layered is not None:
        window = None
        if segments:
            net = net_window(spark, segments, layered, fields, partitions=width, scratch=scratch, s3=buffer_s3)
            truncated, window = net.truncated, net.net
        if not truncated:
            try:
                build = _incremental(spark, layered, window, fields, fmts, pool, pieces, scratch, state_path,
                                     to_position, bucket_bytes)
            except SchemaMisfit:
                if schema is not None:
                    raise  # the source's own schema: a real misfit
                log.info("snapshot at %s: a changed row does not fit the inferred columns; re-typing", to_position)
    if build is not None and out_of_balance(build.state, bucket_bytes):
        log.info("snapshot at %s: a bucket outgrew %d x its target; re-bucketing", to_position, MAX_GROWTH)
        build = _full(spark, build.state.frame(spark, fields), fields, fmts, pool, pieces, state_path, to_position,
                      bucket_bytes, build.state.schema)
    elif build is None:
        if isinstance(base, BufferSnapshotBase) and not segments and (schema is not None or "parquet" not in fmts):
            # A copy (initial load, re-sync): counted, sampled and encoded by tasks reading the
            # buffer's segment (copy_tasks.py), each row typed and encoded once
            build = _full(spark, None, fields, fmts, pool, pieces, state_path, to_position, bucket_bytes, schema,
                          copy=base, scratch=scratch)
        else:
            # `_full` reads the table three times (its size, the bucket sample, the buckets); from the
            # buffer each read would compute the rows' images in Python tasks again, and fold the window
            table, truncated = advance(spark, base, segments, fields, partitions=width, scratch=scratch, s3=buffer_s3)
            table = materialize(table, scratch / "table")
            build = _full(spark, table, fields, fmts, pool, pieces, state_path, to_position, bucket_bytes, schema)
    previous = layered.state if layered is not None and build.mode == "incremental" else None
    return build, previous, truncated


__all__ = ["StateBase", "build_snapshot"]
