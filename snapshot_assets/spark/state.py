"""The table state between builds: typed-key ranges ("buckets") of rows, each row kept with its bytes.

Layout (one STATE dataset per epoch, `<state_root>/epoch=N/`, plus a pool of bucket files shared by
the epochs, `<state_root>/buckets/`):

  buckets/<token>-<bucket>.parquet   ROWS_DDL: key (canonical key JSON), sk (`sortkey`), row (the
                                     row's Go-JSON text: its jsonl snapshot line without the newline),
                                     pb (its length-delimited protobuf SnapshotRow, null when the
                                     archive has no protobuf format), ver (the version of its last
                                     change: archive/versions.py), sorted by sk.
  epoch=N/_snapshotter_state.json    the marker, written last: position, key fields, formats, and the
                                     ordered bucket list (lower bound, file, rows, bytes per format,
                                     key index entries: archive/key_index.py).

Why: a row is encoded once, when it enters the archive (initial load, re-sync, or a diff's new
image: `encode_rows`, Python per new row only). A snapshot is then the concatenation, bucket by
bucket in key order, of stored bytes (`concatenated`: Arrow buffers, no per-row Python), and a
re-base rewrites only the buckets its changes fall in: the others keep their file, and their bytes
in the new snapshot object are copied from the previous snapshot object (`SnapshotPieces`), so a
re-base costs what changed.

The state root is a local folder or an S3 location (locations.py): the tasks write and read the
bucket files themselves (Arrow's filesystem), the driver only the marker, and the bucket paths in
the marker are full URIs, so a cluster whose hosts share only S3 reads and writes the same state.

Bucket bounds are fixed when a full build writes the state (sampled quantiles of sk, about
`TARGET_BUCKET_BYTES` of jsonl per bucket) and kept by the incremental builds after it, except that
a bucket a re-base would grow past `MAX_GROWTH` times the target is cut into parts in the same
re-base (bucket_split.py: an append-only table's last bucket). Should one outgrow it all the same
(the target made smaller), the next build is a full one, which re-balances.
"""

from __future__ import annotations

import base64
import bisect
import functools
import itertools
import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from resources.buffer.segments import RECORD_COLUMN, TYPED_COLUMN, with_images
from resources.destinations.s3 import S3Connection
from snapshot_assets.archive.errors import EncodeError
from snapshot_assets.archive.formats.json_columns import snapshot_records_of_texts
from snapshot_assets.archive.formats.jsonl import MAX_LINE_BYTES
from snapshot_assets.archive.key_index import (
    BLOCK_BYTES,
    BucketEntries,
    KeyIndex,
    entries_from_json,
    entries_to_json,
)
from snapshot_assets.archive.keys import row_key
from snapshot_assets.archive.row_schema import RowSchema
from snapshot_assets.archive.sortkey import sort_keys
from snapshot_assets.archive.versions import VERSIONS
from snapshot_assets.config import DEFAULT_BUCKET_BYTES
from snapshot_assets.spark import bucket_merge
from snapshot_assets.spark.effects import STATE_ARROW, decode_row
from snapshot_assets.spark.locations import Location
from snapshot_assets.spark.parquet_artifact import PARQUET_FORMAT, refusing_misfits
from snapshot_assets.spark.parquet_pieces import BucketParquet, piece_writer
from snapshot_assets.spark.pieces import Uploads
from snapshot_assets.spark.remote_io import input_file, read_parquet_files
from snapshot_assets.spark.typed_copies import CopyTyper

STATE_MARKER = "_snapshotter_state.json"
STATE_VERSION = 4  # 4: buckets keep their parquet piece's footer (a state of 3 has none: one full build writes them)
ROWS_DDL = "key STRING, sk BINARY, row STRING, pb BINARY, ver STRING"
#: The rows-file columns given a dictionary: only `ver`, whose values repeat (every row a build
#: copied shares one). key, sk, row and pb differ in every row: a dictionary for them is built, found
#: useless and dropped for every page. On the six state buckets of a 1,000,000-row table, writing
#: them without took 1.19 s instead of 1.53 s, reading them 0.39 s instead of 0.45 s, and they were
#: 44.8 MiB instead of 56.4 MiB.
_DICTIONARY_COLUMNS = ["ver"]
#: Formats whose artifact is the concatenation of per-row records (no header, no footer).
BYTE_FORMATS = ("jsonl", "protobuf")


def piece_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """What every bucket writes a piece of: the archive's byte formats, and the versions object
    beside the snapshot (one line per row, in the same order: archive/versions.py)."""
    return (*(f for f in formats if f in BYTE_FORMATS), VERSIONS)
TARGET_BUCKET_BYTES = DEFAULT_BUCKET_BYTES
MAX_GROWTH = 4
SAMPLES_PER_BUCKET = 32

#: A task's report per bucket: its rows file (`format` "", with the bucket's key index entries as
#: JSON in `blob`) and, per byte format, where its piece went (`blob`: a staged file's path, or what
#: the uploads received, see pieces.py) and its size.
#: The parquet piece's report also carries the footer of the bucket's standalone parquet file.
REPORT_DDL = ("bucket INT, lower BINARY, rows BIGINT, path STRING, format STRING, blob STRING, bytes BIGINT, "
              "footer BINARY")
_REPORT_ARROW = pa.schema([("bucket", pa.int32()), ("lower", pa.binary()), ("rows", pa.int64()),
                           ("path", pa.string()), ("format", pa.string()), ("blob", pa.string()),
                           ("bytes", pa.int64()), ("footer", pa.binary())])
_Report = tuple[int, bytes, int, str, str, str, int, bytes | None]


# --- encoding rows as they enter -----------------------------------------------------------------


def _records(texts: pa.Array, known: pa.Array | None, key_fields: tuple[str, ...]) -> pa.Array:
    """The protobuf snapshot record of each row: `known` where it holds one (encoded as the row
    entered), else encoded here from the row's Go-JSON text (null text: a deleted key, no record)."""
    if known is None:
        known = pa.nulls(len(texts), pa.binary())
    missing = pc.and_(pc.is_null(known), pc.is_valid(texts))
    at = np.flatnonzero(missing.to_numpy(zero_copy_only=False))
    if not len(at):
        return known
    encoded = snapshot_records_of_texts(texts.take(at), key_fields, decode_row)
    return pc.replace_with_mask(known, missing, encoded)


def encoded_rows(batch: pa.RecordBatch, key_fields: tuple[str, ...], pbs: pa.Array | None,
                 text_column: str) -> pa.RecordBatch:
    """`batch` (its `pb` column, when it has one, replaced) with each row's sort key `sk` (from its
    key JSON) and protobuf record `pb` (`pbs`; None: null), once its Go-JSON text `text_column` is
    known to fit a jsonl line."""
    texts = batch.column(text_column)
    too_long = pc.greater_equal(pc.binary_length(texts), MAX_LINE_BYTES).fill_null(False)
    if pc.any(too_long).as_py():
        text = texts.filter(too_long)[0].as_py()
        raise EncodeError(f"encoded line is over {MAX_LINE_BYTES} bytes (16 MiB), laredo's jsonl limit",
                          row_key=row_key(decode_row(text), key_fields))
    sks = sort_keys(batch.column("key"))
    kept = [name for name in batch.schema.names if name != "pb"]
    pbs = pa.nulls(batch.num_rows, pa.binary()) if pbs is None else pbs
    return pa.RecordBatch.from_arrays([*(batch.column(name) for name in kept), sks, pbs], names=[*kept, "sk", "pb"])


def _encoded(batch: pa.RecordBatch, key_fields: tuple[str, ...], protobuf: bool, text_column: str) -> pa.RecordBatch:
    """`encoded_rows` with the protobuf record of each row (null unless `protobuf`): the one it
    carries, else encoded here."""
    known = batch.column("pb") if "pb" in batch.schema.names else None
    pbs = _records(batch.column(text_column), known, key_fields) if protobuf else None
    return encoded_rows(batch, key_fields, pbs, text_column)


def _encode_batches(batches: Iterable[Any], key_fields: tuple[str, ...], protobuf: bool,
                    text_column: str) -> Iterator[Any]:
    for batch in batches:
        yield _encoded(batch, key_fields, protobuf, text_column)


def encode_rows(frame: DataFrame, key_fields: Sequence[str], formats: Sequence[str]) -> DataFrame:
    """STATE_DDL rows -> ROWS_DDL: the sort key and the protobuf record of each row (null `row`: a
    key that is deleted keeps only its sort key). A record the row already carries (encoded as it
    entered: a copied row, a state's row) is kept, not encoded again. With `encode_net`, the one
    place rows are encoded."""
    func = functools.partial(_encode_batches, key_fields=tuple(key_fields), protobuf="protobuf" in formats,
                             text_column="row")
    encoded = frame.select(*STATE_ARROW.names).mapInArrow(func, "key STRING, row STRING, ver STRING, sk BINARY, "
                                                                "pb BINARY")
    return encoded.select("key", "sk", "row", "pb", "ver")


def copy_batches(batches: Iterable[Any], key_fields: tuple[str, ...], protobuf: bool,
                 typer: CopyTyper | None) -> Iterator[Any]:
    """A copy's buffer rows (a snapshot segment's, with their `ver`) -> ROWS_DDL in one pass: each
    copied row's Go-JSON text, protobuf record and sort key, and (with `typer`) its typed cells as
    `TYPED_COLUMN` (null where `typer` is not certain: `typed_columns(given=...)` types those). One
    pass, because each pass over a copy is a pass over the whole table (copy_tasks.py runs it)."""
    for batch in batches:
        read = with_images(batch, records=protobuf, typed=typer)
        rows = pa.RecordBatch.from_arrays(
            [read.column("key"), read.column("new"), read.column("ver"),
             read.column(RECORD_COLUMN.name) if protobuf else pa.nulls(read.num_rows, pa.binary())],
            names=["key", "row", "ver", "pb"])
        encoded = _encoded(rows, key_fields, protobuf, "row")
        columns = [encoded.column(name) for name in ("key", "sk", "row", "pb", "ver")]
        if typer is not None:
            columns.append(read.column(TYPED_COLUMN))
        yield pa.RecordBatch.from_arrays(columns, names=["key", "sk", "row", "pb", "ver",
                                                         *([TYPED_COLUMN] if typer is not None else [])])


def _sample_batches(batches: Iterable[Any]) -> Iterator[Any]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays([sort_keys(batch.column("key"))], names=["sk"])


def sample_bounds(frame: DataFrame, buckets: int, rows: int) -> list[bytes]:
    """`buckets - 1` lower bounds (bucket 0 has none) from a sample of the keys' sort keys."""
    if buckets <= 1 or rows == 0:
        return []
    fraction = min(1.0, SAMPLES_PER_BUCKET * buckets / rows)
    sample = frame.select("key").sample(fraction=fraction, seed=7).mapInArrow(_sample_batches, "sk BINARY")
    return bounds_of(sorted(bytes(r["sk"]) for r in sample.collect()), buckets)


def bounds_of(sks: Sequence[bytes], buckets: int) -> list[bytes]:
    """`buckets - 1` lower bounds at the quantiles of the sorted sample `sks` (fewer when it repeats)."""
    if buckets <= 1 or not sks:
        return []
    return sorted({sks[min(len(sks) - 1, (i * len(sks)) // buckets)] for i in range(1, buckets)})


def bucket_expr(bounds: Sequence[bytes]) -> str:
    """The SQL that puts a sort key `sk` into its bucket: the one definition of bucket membership."""
    if not bounds:
        return "0"
    arms = " ".join(f"WHEN sk >= X'{b.hex()}' THEN {i + 1}" for i, b in reversed(list(enumerate(bounds))))
    return f"CASE {arms} ELSE 0 END"


def bucket_of(bounds: Sequence[bytes], sk: bytes) -> int:
    """The same rule in Python: for the driver (which buckets a copy's run batches span) and the
    tests that check which buckets a build touched."""
    return bisect.bisect_right(list(bounds), sk)


def in_bucket(sks: pa.Array | pa.ChunkedArray, bounds: Sequence[bytes], bucket: int) -> pa.Array:
    """The same rule in Arrow: which of the sort keys `sks` fall in `bucket` (its bound at least, the
    next bound not reached)."""
    mask = pc.is_valid(sks)
    if bucket > 0:
        mask = pc.and_(mask, pc.greater_equal(sks, pa.scalar(bounds[bucket - 1], pa.binary())))
    if bucket < len(bounds):
        mask = pc.and_(mask, pc.less(sks, pa.scalar(bounds[bucket], pa.binary())))
    return mask


# --- concatenating stored bytes ----------------------------------------------------------------------


def concatenated(array: Any) -> memoryview:
    """The values of a binary/string Arrow array back to back, straight from its data buffer."""
    if array.null_count:
        raise ValueError("cannot concatenate an array with nulls")
    if len(array) == 0:
        return memoryview(b"")
    large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
    start, end = int(offsets[array.offset]), int(offsets[array.offset + len(array)])
    return memoryview(array.buffers()[2])[start:end]


def _lines(rows: Any) -> Any:
    """The jsonl records of a rows slice: each stored text and a newline, as one Arrow array."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(rows.column("row"), pa.scalar("\n"), pa.scalar(""))


def _version_lines(rows: Any) -> Any:
    """The versions object's lines of a rows slice: each row's version (empty: unknown) and a newline."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(pc.fill_null(rows.column("ver"), ""), pa.scalar("\n"), pa.scalar(""))


def piece_bytes(rows: Any, format_id: str) -> memoryview:
    """A rows slice's bytes in one piece format, back to back (stored bytes, no per-row Python)."""
    if format_id == "jsonl":
        return concatenated(_lines(rows))
    if format_id == VERSIONS:
        return concatenated(_version_lines(rows))
    return concatenated(rows.column("pb"))


# --- writing buckets --------------------------------------------------------------------------------


class _IndexMarks:
    """The key index entries of one bucket as its rows stream past (`archive/key_index.py`): the
    first row starting in each `block_bytes` of the bucket's bytes in the leading format (jsonl
    when the archive has it). Vectorised per batch (Arrow lengths, numpy), Python only per entry."""

    def __init__(self, formats: tuple[str, ...], block_bytes: int) -> None:
        self._formats, self._block_bytes = formats, block_bytes
        self._at = dict.fromkeys(formats, 0)
        self._last_block = -1
        self.sks: list[bytes] = []
        self.offsets: dict[str, list[int]] = {fid: [] for fid in formats}

    def add(self, rows: Any) -> None:
        import pyarrow.compute as pc

        if not self._formats or not rows.num_rows:
            return
        starts: dict[str, Any] = {}
        for fid in self._formats:
            stored = pc.binary_length(rows.column("row")) if fid == "jsonl" else \
                pc.fill_null(pc.binary_length(rows.column("ver")), 0) if fid == VERSIONS else \
                pc.fill_null(pc.binary_length(rows.column("pb")), 0)
            lengths = stored.to_numpy(zero_copy_only=False).astype(np.int64) + (0 if fid == "protobuf" else 1)
            ends = np.cumsum(lengths) + self._at[fid]
            starts[fid] = ends - lengths
            self._at[fid] = int(ends[-1])
        blocks = starts[self._formats[0]] // self._block_bytes
        marked = np.flatnonzero(np.diff(blocks, prepend=self._last_block))
        self._last_block = int(blocks[-1])
        sks = rows.column("sk").take(pa.array(marked)).to_pylist()
        self.sks.extend(sks)
        for fid in self._formats:
            self.offsets[fid].extend(int(v) for v in starts[fid][marked])

    def to_json(self) -> str:
        return json.dumps(entries_to_json((tuple(self.sks), {f: tuple(o) for f, o in self.offsets.items()})))


class _BucketOut:
    """One bucket being written by a task: its rows file in the pool (local or S3, through Arrow's
    filesystem), one piece per byte format (a staged file, or sent into the uploads) and, with a
    `parquet` schema, its parquet piece (parquet_pieces.py)."""

    def __init__(self, bucket: int, lower: bytes, pool: Location, staging: Path | None, token: str,
                 formats: tuple[str, ...], uploads: Uploads | None, block_bytes: int,
                 parquet: pa.Schema | None) -> None:
        self.bucket, self.lower, self.rows = bucket, lower, 0
        name = f"{token}-{bucket:05d}.parquet"
        self.uri = (pool / name).uri
        self._fs, folder = pool.filesystem()
        self._path = f"{folder}/{name}"
        # Locally a temp name renamed into place; an S3 object appears whole when its upload ends.
        self._tmp = self._path if pool.remote else f"{folder}/.{name}.tmp"
        self._stream: Any = None
        self._writer: Any = None
        self._compression = "zstd"
        self._marks = _IndexMarks(tuple(sorted(formats)), block_bytes)  # "jsonl" leads when the archive has it
        self._pieces = {fid: piece_writer(fid, bucket, staging, uploads) for fid in formats}
        self._parquet = None if parquet is None else BucketParquet(bucket, parquet, staging, uploads)

    def write(self, rows: Any) -> None:
        if self._writer is None:  # the rows' schema: ROWS_DDL, plus the typed `columns` struct for parquet
            self._stream = self._fs.open_output_stream(self._tmp)
            self._writer = pq.ParquetWriter(self._stream, rows.schema, compression=self._compression,
                                            use_dictionary=_DICTIONARY_COLUMNS)
        self._writer.write_batch(rows)
        self.rows += rows.num_rows
        self._marks.add(rows)
        for fid, piece in self._pieces.items():
            piece.stream.write(piece_bytes(rows, fid))
        if self._parquet is not None:
            self._parquet.add(rows.column(TYPED_COLUMN))

    def close(self) -> list[_Report]:
        self._writer.close()
        self._stream.close()
        if self._tmp != self._path:
            self._fs.move(self._tmp, self._path)
        reports: list[_Report] = [(self.bucket, self.lower, self.rows, self.uri, "", self._marks.to_json(), 0, None)]
        for fid, piece in self._pieces.items():
            where, size = piece.close()
            reports.append((self.bucket, self.lower, self.rows, self.uri, fid, where, size, None))
        if self._parquet is not None:
            if self._parquet.rows != self.rows:
                raise RuntimeError(f"bucket {self.bucket}: its parquet piece holds {self._parquet.rows} rows, "
                                   f"the bucket {self.rows}")
            where, size, footer = self._parquet.close()
            reports.append((self.bucket, self.lower, self.rows, self.uri, PARQUET_FORMAT, where, size, footer))
        return reports


def _bucket_slices(batches: Iterable[Any]) -> Iterator[tuple[int, Any]]:
    """Rows sorted by (bucket, sk) -> (bucket, its rows without the bucket column), batch slice by slice."""
    for batch in batches:
        buckets = batch.column("bucket").to_numpy(zero_copy_only=False)
        starts = [0, *(np.flatnonzero(np.diff(buckets)) + 1).tolist(), len(buckets)]
        rows = batch.drop_columns(["bucket"])
        for lo, hi in itertools.pairwise(starts):
            if lo < hi:
                yield int(buckets[lo]), rows.slice(lo, hi - lo)


def _merged_buckets(slices: Iterable[tuple[int, Any]], stored: Mapping[int, str],
                    s3: S3Connection | None) -> Iterator[tuple[int, Any]]:
    """Each bucket's changes (a deleted key: null row) merged into its stored rows file, read by
    this task from where it lives (bucket_merge.py: the file's rows minus the changed keys, plus the
    changed rows that have an image, in sk order). One bucket at a time; Python per changed key at most."""
    for bucket, group in itertools.groupby(slices, key=lambda item: item[0]):
        changes = pa.Table.from_batches([rows for _, rows in group])
        path = stored.get(bucket)
        if path is None:
            rows = changes.filter(pc.is_valid(changes.column("row")))
        else:
            with input_file(path, s3) as source:
                rows = bucket_merge.merged(pq.read_table(source, columns=changes.schema.names), changes)
        for batch in bucket_merge.batches(rows):
            yield bucket, batch


def _bucket_task(batches: Iterable[Any], pool: Location, staging: str | None, token: str,
                 formats: tuple[str, ...], uploads: Uploads | None, block_bytes: int,
                 stored: Mapping[int, str] | None, s3: S3Connection | None, parquet: pa.Schema | None) -> Iterator[Any]:
    """Rows sorted by (bucket, sk) -> one rows file and one piece per format for each bucket seen
    (with `stored`: each bucket's changes, merged into its stored rows file first)."""
    reports: list[_Report] = []
    current: _BucketOut | None = None
    slices = _bucket_slices(batches)
    for bucket, rows in slices if stored is None else _merged_buckets(slices, stored, s3):
        if current is None or current.bucket != bucket:
            if current is not None:
                reports.extend(current.close())
            current = _BucketOut(bucket, rows.column("sk")[0].as_py(), pool,
                                 None if staging is None else Path(staging), token, formats, uploads, block_bytes,
                                 parquet)
        current.write(rows)
    if current is not None:
        reports.extend(current.close())
    columns = list(zip(*reports, strict=True)) if reports else [()] * len(_REPORT_ARROW)
    yield pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, _REPORT_ARROW, strict=True)],
                                     schema=_REPORT_ARROW)


_MASK32 = 0xFFFFFFFF


def _rotl32(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK32


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of one INT value (Murmur3_x86_32.hashInt with Spark's seed 42), signed.

    Why here: `repartition(n, column)` places a row in partition `pmod(hash(column), n)`, so bucket
    ids hashed as they are can share a partition while another stays empty (6 buckets fell into 3
    tasks). `bucket_placement` picks for each bucket a value that hashes to a partition of its own."""
    k1 = (value & _MASK32) * 0xCC9E2D51 & _MASK32
    k1 = _rotl32(k1, 15) * 0x1B873593 & _MASK32
    h1 = _rotl32((seed & _MASK32) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


#: Above this many buckets in one build, rows are placed by the bucket id itself: with that many
#: tasks, two buckets sharing one evens out, and the placement expression would grow with the count.
PLACED_BUCKETS = 1024


def bucket_placement(buckets: Sequence[int]) -> str:
    """The SQL of an INT column that sends each of `buckets` to a shuffle partition of its own when
    the frame is repartitioned by it into `len(buckets)` partitions: one task per bucket."""
    ordered = sorted(set(buckets))
    if len(ordered) <= 1:
        return "0"
    width = len(ordered)
    if width > PLACED_BUCKETS:
        return "bucket"
    salts: dict[int, int] = {}  # partition -> the first value hashing to it (about width * ln(width) tries)
    salt = 0
    while len(salts) < width:
        salts.setdefault(spark_int_hash(salt) % width, salt)
        salt += 1
    arms = " ".join(f"WHEN {bucket} THEN {salts[partition]}" for partition, bucket in enumerate(ordered))
    return f"CASE bucket {arms} ELSE 0 END"


BucketWriter = Callable[[Iterable[Any]], Iterator[Any]]


def bucket_writer(pool: Path | Location, staging: Path | None, formats: Sequence[str], uploads: Uploads | None,
                  block_bytes: int, *, into: StateBase | None = None, parquet: pa.Schema | None = None) -> BucketWriter:
    """The task that writes buckets (`write_buckets`' arguments): batches of rows sorted by (bucket,
    sk), with a `bucket` column, in; one report batch (REPORT_DDL) for the buckets it wrote, out.
    Picklable: it runs in the tasks of `write_buckets` and of a copy's merge (copy_tasks.py)."""
    stored = None if into is None else {i: b.path for i, b in enumerate(into.buckets) if b.path is not None}
    return functools.partial(_bucket_task, pool=Location.of(pool).make(),
                             staging=None if staging is None else str(staging), token=uuid.uuid4().hex[:12],
                             formats=piece_formats(formats), uploads=uploads, block_bytes=block_bytes, stored=stored,
                             s3=None if into is None else into.s3, parquet=parquet)


def write_buckets(encoded: DataFrame, bounds: Sequence[bytes], touched: Sequence[int], pool: Path | Location,
                  staging: Path | None, formats: Sequence[str], uploads: Uploads | None = None,
                  block_bytes: int = BLOCK_BYTES, *, into: StateBase | None = None,
                  parquet: pa.Schema | None = None) -> list[Any]:
    """Write the buckets present in `encoded` (ROWS_DDL rows, and the typed `columns` when the archive
    has parquet; `touched`: the buckets its rows fall in, one task each): each bucket's rows sorted
    by sk into one new rows file of the pool, and its bytes in each byte format as a piece: a file
    staged in `staging` (local runtime), or sent into `uploads` (`staging` None); its key index
    entries every `block_bytes`; with a `parquet` schema (the snapshot's: the rows have their typed
    `columns`), its parquet piece and that piece's footer (parquet_pieces.py). Returns the tasks'
    reports (REPORT_DDL); a value that does not fit the typed columns raises SchemaMisfit.

    With `into` (a state with these bounds), `encoded` holds changes (a deleted key: null row) and
    each bucket they fall in is that state's bucket with them merged in: the task rewriting it reads
    the stored rows file itself, so only the changes are shuffled, never the buckets' rows."""
    func = bucket_writer(pool, staging, formats, uploads, block_bytes, into=into, parquet=parquet)
    typed = [TYPED_COLUMN] if TYPED_COLUMN in encoded.columns else []
    frame = encoded.selectExpr(f"CAST({bucket_expr(bounds)} AS INT) AS bucket", "key", "sk", "row", "pb", "ver", *typed)
    frame = frame.selectExpr("*", f"{bucket_placement(touched)} AS task").repartition(max(1, len(set(touched))), "task")
    frame = frame.drop("task").sortWithinPartitions("bucket", "sk")
    with refusing_misfits():
        return list(frame.mapInArrow(func, REPORT_DDL).collect())


# --- the state and its marker ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bucket:
    """One key range of the state: its lower bound (None for the first), rows file, byte sizes (per
    piece format, and its parquet piece's body), key index entries (None: written before the state
    kept them) and the footer of its parquet piece's standalone file (None: no parquet rows)."""

    lower: bytes | None
    path: str | None
    rows: int
    sizes: Mapping[str, int] = field(default_factory=dict)
    index: BucketEntries | None = None
    footer: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        return {"lower": None if self.lower is None else self.lower.hex(), "path": self.path, "rows": self.rows,
                "sizes": dict(self.sizes), "index": None if self.index is None else entries_to_json(self.index),
                "footer": None if self.footer is None else base64.b64encode(self.footer).decode()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Bucket:
        lower, index, footer = data["lower"], data.get("index"), data.get("footer")
        return cls(None if lower is None else bytes.fromhex(lower), data["path"], int(data["rows"]),
                   {str(k): int(v) for k, v in data["sizes"].items()},
                   None if index is None else entries_from_json(index),
                   None if footer is None else base64.b64decode(footer))


@dataclass(frozen=True, slots=True)
class StateBase:
    """A STATE dataset: the table at `position` as ordered buckets (see the module docstring)."""

    path: str
    position: str
    rows: int
    key_fields: tuple[str, ...]
    buckets: tuple[Bucket, ...] = ()
    formats: tuple[str, ...] = ()
    schema: RowSchema | None = None  # the typed columns' schema, when the archive has parquet
    s3: S3Connection | None = None  # signs the marker's and the bucket files' requests when they are in S3

    @property
    def location(self) -> Location:
        return Location.of(self.path, self.s3)

    @classmethod
    def load(cls, path: Path | str | Location, s3: S3Connection | None = None) -> StateBase | None:
        """The dataset at `path` (a local folder or an s3 URI signed by `s3`) if it is complete (its
        marker is written last) and of this version."""
        where = Location.of(path, s3)
        try:
            meta = where.read_json(STATE_MARKER)
            if meta is None or meta.get("version") != STATE_VERSION:
                return None
            schema = RowSchema.from_json(meta["schema"]) if meta.get("schema") else None
            return cls(where.uri, str(meta["position"]), int(meta["rows"]), tuple(meta["key_fields"]),
                       tuple(Bucket.from_json(b) for b in meta["buckets"]), tuple(meta["formats"]), schema,
                       where.s3)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self) -> StateBase:
        """Write the marker (driver side, last: the bucket files it names are already written)."""
        marker = {"position": self.position, "rows": self.rows, "key_fields": list(self.key_fields),
                  "formats": list(self.formats), "buckets": [b.to_json() for b in self.buckets],
                  "schema": self.schema.to_json() if self.schema is not None else None, "version": STATE_VERSION}
        self.location.write_json(STATE_MARKER, marker)
        return self

    @property
    def snapshot_position(self) -> str:
        return self.position

    @property
    def bounds(self) -> list[bytes]:
        return [b.lower for b in self.buckets if b.lower is not None]

    def files(self) -> list[str]:
        return [b.path for b in self.buckets if b.path is not None]

    def rows_frame(self, spark: SparkSession, buckets: Iterable[int] | None = None) -> DataFrame:
        """The stored rows (ROWS_DDL) of all buckets or of the given ones."""
        chosen = self.buckets if buckets is None else [self.buckets[i] for i in buckets]
        paths = [b.path for b in chosen if b.path is not None]
        if not paths:
            return spark.createDataFrame([], ROWS_DDL)
        return read_parquet_files(spark, paths, s3=self.s3, ddl=ROWS_DDL)

    def rows_for(self, spark: SparkSession, key_fields: Sequence[str], keys: DataFrame) -> DataFrame:
        """The rows (STATE_DDL) of the given keys (a `key` column), reading only the buckets they
        fall in: the keys' sort keys are computed (Python per wanted key), their bucket ids collected."""
        if tuple(key_fields) != self.key_fields:
            raise ValueError(f"state at {self.path} is keyed by {list(self.key_fields)}, not {list(key_fields)}")
        wanted = keys.selectExpr("key", "CAST(NULL AS STRING) AS row", "CAST(NULL AS STRING) AS ver",
                                 "CAST(NULL AS BINARY) AS pb")
        located = encode_rows(wanted, key_fields, ())
        found = located.selectExpr(f"{bucket_expr(self.bounds)} AS b").distinct().collect()
        buckets = sorted(int(r["b"]) for r in found)
        return self.rows_frame(spark, buckets).select(*STATE_ARROW.names).join(keys.select("key"), "key", "left_semi")

    def frame(self, spark: SparkSession, key_fields: Sequence[str]) -> DataFrame:
        """The rows as STATE_DDL (key, row, ver, and the protobuf record the state keeps)."""
        if tuple(key_fields) != self.key_fields:
            raise ValueError(f"state at {self.path} is keyed by {list(self.key_fields)}, not {list(key_fields)}")
        return self.rows_frame(spark).select(*STATE_ARROW.names)

    def describe(self) -> str:
        return f"state dataset {self.path} at {self.position} ({self.rows} rows, {len(self.buckets)} buckets)"

    def key_index(self) -> KeyIndex | None:
        """The key index of the snapshot object built from this state (None when a bucket written
        before the state kept its entries has rows: the next full build writes them)."""
        if any(b.index is None and b.rows for b in self.buckets):
            return None
        fids = piece_formats(self.formats)
        return KeyIndex.of_buckets(self.key_fields, self.position,
                                   [b.index or ((), {}) for b in self.buckets],
                                   [{f: b.sizes.get(f, 0) for f in fids} for b in self.buckets])

    def offsets(self, format_id: str) -> list[int]:
        """Where each bucket's bytes start in the snapshot object built from this state."""
        starts, at = [], 0
        for b in self.buckets:
            starts.append(at)
            at += b.sizes.get(format_id, 0)
        return starts


def prune_state(root: Path | str | Location, epoch: int) -> None:
    """Keep only the STATE dataset of `epoch` (the newest snapshot's), the bucket files it names and
    the deltas of its epoch (the head) under the state root `root`, local or in S3."""
    where = Location.of(root)
    keep = f"epoch={epoch}"
    for name in where.folders():
        if name.startswith("epoch=") and name != keep:
            (where / name).clear()
    for name in (where / "deltas").folders():
        if name != keep:
            (where / "deltas" / name).clear()
    state = StateBase.load(where / keep)
    if state is None:
        return
    kept = {uri.rsplit("/", 1)[-1] for uri in state.files()}
    pool = where / "buckets"
    for name in pool.list_files(".parquet"):
        if name not in kept:
            pool.delete(name)


def bucket_count(rows: int, jsonl_bytes: int, bucket_bytes: int = TARGET_BUCKET_BYTES) -> int:
    return max(1, math.ceil(jsonl_bytes / bucket_bytes)) if rows else 1


def buckets_from_reports(reports: Iterable[Any], bounds: Sequence[bytes],
                         previous: Sequence[Bucket] = ()) -> tuple[Bucket, ...]:
    """The new bucket list: `previous` (same bounds) with the reported buckets replaced; a previous
    bucket that the build rewrote but that reports nothing became empty."""
    lowers: list[bytes | None] = [None, *bounds]
    out = list(previous) if previous else [Bucket(lower, None, 0) for lower in lowers]
    written: dict[int, dict[str, Any]] = {}
    for r in reports:
        entry = written.setdefault(int(r["bucket"]), {"path": r["path"], "rows": int(r["rows"]), "sizes": {},
                                                      "index": None, "footer": None})
        if r["format"]:
            entry["sizes"][r["format"]] = int(r["bytes"])
            if r["footer"] is not None:
                entry["footer"] = bytes(r["footer"])
        else:
            entry["index"] = entries_from_json(json.loads(r["blob"]))
    for i, entry in written.items():
        out[i] = Bucket(lowers[i], entry["path"], entry["rows"], entry["sizes"], entry["index"], entry["footer"])
    return tuple(out)


def emptied(buckets: Sequence[Bucket], indexes: Iterable[int], formats: Sequence[str]) -> tuple[Bucket, ...]:
    """`buckets` with the given ones emptied (rewritten, nothing left in them)."""
    out = list(buckets)
    for i in indexes:
        out[i] = replace(out[i], path=None, rows=0, sizes=dict.fromkeys(piece_formats(formats), 0), index=((), {}),
                         footer=None)
    return tuple(out)
