"""A snapshot's parquet object made of one piece per bucket, like the byte formats.

Why: a parquet file is row groups followed by a footer that names where each column chunk starts,
so it cannot be concatenated as jsonl lines can. Written whole by one task from every row of the
state, a re-base that changed one bucket rewrote the whole table's parquet, on one core. Instead,
the task that writes a bucket writes its typed columns as a standalone parquet file (Arrow's
writer, the snapshot's schema with Spark's schema JSON: `parquet_artifact.snapshot_arrow_schema`);
the file's body (its row groups) is the bucket's piece of the object and its footer is kept in the
state beside the bucket. The object is then:

    piece 0          the magic "PAR1" (written by the driver)
    piece i + 1      bucket i's body: fresh from this build, or the range of the previous object
                     that held it (copied on the destination, like the byte formats' ranges)
    piece n + 1      the buckets' footers merged (`parquet_merge.merge_footers`: every offset moved
                     to where its body now lands), its length and the magic (written by the driver)

So a re-base rewrites the parquet of the buckets it touches and copies the rest, and a full build
writes every bucket's parquet in parallel, in the tasks that write the buckets. Readers see one
parquet file with a row group (or more) per bucket, in key order, with column statistics per row
group, and no page index (the merged footer does not carry the buckets' page indexes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from snapshot_assets.archive.formats.parquet_merge import MAGIC, merge_footers, split_file, trailer
from snapshot_assets.spark.parquet_artifact import PARQUET_FORMAT, ROW_GROUP_BYTES
from snapshot_assets.spark.parts import Reuse, StagedFormat, bucket_pieces
from snapshot_assets.spark.pieces import PieceWriter, Sent, Uploads

_COMPRESSION = "snappy"  # what Spark's writer uses by default: every reader has it


def piece_of(format_id: str, bucket: int) -> int:
    """The index of bucket `bucket`'s piece among its object's pieces (parquet's piece 0 is the magic)."""
    return bucket + 1 if format_id == PARQUET_FORMAT else bucket


def piece_writer(format_id: str, bucket: int, staging: Path | None, uploads: Uploads | None) -> PieceWriter:
    """Where a task writes bucket `bucket`'s piece of one format: a staged file, or the uploads."""
    staged = None if staging is None else staging / format_id / f"bucket-{bucket:05d}"
    return PieceWriter(format_id, piece_of(format_id, bucket), staged=staged, uploads=uploads)


def parquet_bytes(batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> pa.Buffer:
    """A standalone parquet file of `batches` (cast to `schema`), as every bucket's piece is written.

    The bytes depend on the rows alone, not on how they were batched (Arrow's writer cuts pages
    and row groups where its input's chunks end, and a cluster's tasks receive other batches than
    a local runtime's): the rows are made one contiguous table and cut into equal row groups of
    about ROW_GROUP_BYTES."""
    table = (pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()).combine_chunks()
    groups = max(1, -(-table.nbytes // ROW_GROUP_BYTES))
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, compression=_COMPRESSION) as writer:
        writer.write_table(table, row_group_size=max(1, -(-table.num_rows // groups)))
    return sink.getvalue()


class BucketParquet:
    """One bucket's parquet piece as its task writes it: the rows' typed `columns` collected, then
    written as a standalone file whose body goes to the piece and whose footer goes to the state."""

    def __init__(self, bucket: int, schema: pa.Schema, staging: Path | None, uploads: Uploads | None) -> None:
        self._bucket, self._schema = bucket, schema
        self._staging, self._uploads = staging, uploads
        self._batches: list[pa.RecordBatch] = []
        self.rows = 0

    def add(self, columns: Any) -> None:
        """The typed `columns` struct of a slice of the bucket's rows (in the bucket's order)."""
        self._batches.append(pa.RecordBatch.from_arrays(columns.flatten(), names=[f.name for f in columns.type]))
        self.rows += len(columns)

    def close(self) -> tuple[str, int, bytes]:
        """Write the piece: (where it went, its size, the standalone file's footer)."""
        data = parquet_bytes(self._batches, self._schema)
        self._batches = []
        split = split_file(memoryview(data))
        piece = piece_writer(PARQUET_FORMAT, self._bucket, self._staging, self._uploads)
        try:
            piece.stream.write(memoryview(data)[split.body_start:split.body_end])
        except BaseException:
            piece.abort()
            raise
        where, size = piece.close()
        return where, size, split.footer


def _driver_piece(data: bytes, name: str, piece: int, staging: Path | None, uploads: Uploads | None) -> Path | Sent:
    """A piece the driver writes itself (the magic, the footer): staged, or sent like a task's."""
    writer = PieceWriter(PARQUET_FORMAT, piece, staged=None if staging is None else staging / PARQUET_FORMAT / name,
                         uploads=uploads)
    try:
        writer.stream.write(data)
    except BaseException:
        writer.abort()
        raise
    where, size = writer.close()
    return Path(where) if uploads is None else Sent.parse(piece, size, where)


def parquet_object(sizes: Sequence[int], footers: Sequence[bytes | None], fresh: Mapping[int, Path | Sent],
                   previous_starts: Sequence[int | None], previous_key: str | None, schema: pa.Schema, *,
                   staging: Path | None, uploads: Uploads | None) -> StagedFormat:
    """The snapshot's parquet object from the state's buckets (`sizes`: each one's body bytes,
    `footers`: its standalone file's footer, None when it is empty), the bodies this build wrote
    (`fresh`) and, for the others, the previous object (`previous_key`, the bodies starting at
    `previous_starts`). The driver writes the magic and the merged footer."""
    bodies = bucket_pieces(PARQUET_FORMAT, sizes, fresh, previous_starts, previous_key,
                           lambda i: piece_of(PARQUET_FORMAT, i))
    tail = _tail(sizes, footers, schema)
    head = _driver_piece(MAGIC, "head", 0, staging, uploads)
    end = _driver_piece(tail, "tail", len(sizes) + 1, staging, uploads)
    parts: tuple[Path | Reuse | Sent, ...] = (head, *bodies, end)
    return StagedFormat(PARQUET_FORMAT, parts, len(MAGIC) + sum(sizes) + len(tail))


def _tail(sizes: Sequence[int], footers: Sequence[bytes | None], schema: pa.Schema) -> bytes:
    """The object's end: the buckets' footers merged (each body placed after the ones before it),
    the footer's length and the magic."""
    placed: list[tuple[bytes, int]] = []
    at = len(MAGIC)
    for size, footer in zip(sizes, footers, strict=True):
        if size:
            if footer is None:
                raise RuntimeError("a bucket with parquet rows has no footer in the state")
            placed.append((footer, at))
        at += size
    return trailer(merge_footers(placed) if placed else split_file(memoryview(parquet_bytes([], schema))).footer)


def object_size(sizes: Sequence[int], footers: Sequence[bytes | None], schema: pa.Schema) -> int:
    """The size of the parquet object `parquet_object` makes of these buckets: how a re-base checks
    that a destination holds the previous snapshot's object whole before copying ranges of it."""
    return len(MAGIC) + sum(sizes) + len(_tail(sizes, footers, schema))


__all__ = ["BucketParquet", "object_size", "parquet_object", "piece_of", "piece_writer"]
