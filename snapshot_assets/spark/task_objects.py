"""Objects assembled from every Spark task's share, each task sending its own bytes into the destination.

Why: an artifact is ONE object per format (laredo's layout), but its bytes are made by many tasks
on many hosts that share no disk with the driver. So each target object is a multipart upload
(resources/destinations/multipart.py) whose handle travels into the tasks; partition p's share
becomes the object's bytes at p's place, in partition order.

A task encodes its partition once, into every output (e.g. one per format), spooled in its own
temp space (SPARK_LOCAL_DIRS / TMPDIR), then, for each target of an output:
* the head of its share (the first 5 MiB; all of it when under 10 MiB) is staged beside the upload;
* the rest, the body, goes straight in as parts `p * PARTS_PER_TASK + 2 ...`, each at least 5 MiB.
The driver then places the heads: a run of staged pieces between two bodies is planned by
`plan_parts` into the numbers of the run's own blocks (a lone head is a server-side copy; shares
under S3's 5 MiB floor are merged, the only bytes that pass through the driver, at most 10 MiB per
merged part), and completes each upload. Partitions of any size work; anything failing aborts
every upload (parts and staged pieces go with it).
"""

from __future__ import annotations

import contextlib
import functools
import io
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa

from resources.destinations.base import Destination, PutResult
from resources.destinations.multipart import (
    MAX_PARTS,
    MIN_PART_SIZE,
    Assembling,
    CopyRange,
    MiB,
    MultipartError,
    MultipartUpload,
    PlannedPart,
    begin,
    plan_parts,
    split_evenly,
    write_planned,
)
from snapshot_assets.spark.remote_io import task_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Encodes a task's record batches into (output name, bytes) chunks, in each output's order.
Encoder = Callable[[Iterator[pa.RecordBatch]], Iterable[tuple[str, bytes]]]
#: One target object: (output name, destination, key).
Target = tuple[str, Destination, str]

PARTS_PER_TASK = 16  # part numbers per partition: 625 partitions fit S3's 10,000
BODY_PART_SIZE = 64 * MiB  # a body's parts (larger when 15 of them would not hold the share)
_SPOOL_IN_MEMORY = 16 * MiB  # beyond this a share spills to the task's own temp dir
PIECE_DDL = "target INT, piece INT, bytes BIGINT, staged STRING, staged_bytes BIGINT, parts ARRAY<INT>"
_PIECE_ARROW = pa.schema([("target", pa.int32()), ("piece", pa.int32()), ("bytes", pa.int64()),
                          ("staged", pa.string()), ("staged_bytes", pa.int64()), ("parts", pa.list_(pa.int32()))])


class _Limited(io.RawIOBase):
    """The next `length` bytes of `source` as a stream of their own (one body part of a spooled share)."""

    def __init__(self, source: BinaryIO, length: int) -> None:
        super().__init__()
        self._source, self._left = source, length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[: self._left]
        count = self._source.readinto(view)  # type: ignore[attr-defined]
        self._left -= count
        return int(count)


def _send(upload: MultipartUpload, spool: BinaryIO, size: int, piece: int,
          parts_per_task: int) -> tuple[str, int, list[int]]:
    """Stage the share's head, write its body as parts; (staged key, head bytes, body part numbers)."""
    spool.seek(0)
    if not size:
        return "", 0, []
    head = size if size < 2 * MIN_PART_SIZE else MIN_PART_SIZE
    staged = upload.stage(f"piece-{piece:05d}", spool.read(head)).key
    numbers: list[int] = []
    body = size - head
    if body:
        target = max(BODY_PART_SIZE, -(-body // (parts_per_task - 1)))
        for number, length in enumerate(split_evenly(body, target), start=piece * parts_per_task + 2):
            upload.write_part(number, _Limited(spool, length))  # type: ignore[arg-type]
            numbers.append(number)
    return staged, head, numbers


def _write_shares(batches: Iterator[pa.RecordBatch], uploads: tuple[tuple[str, MultipartUpload], ...],
                  encode: Encoder, parts_per_task: int) -> Iterator[pa.RecordBatch]:
    """Task: encode the partition once into every output, then send each output's share to its uploads."""
    piece = task_partition()
    if (piece + 1) * parts_per_task > MAX_PARTS:
        raise MultipartError(f"partition {piece} is beyond the {MAX_PARTS // parts_per_task} an object can take "
                             f"at {parts_per_task} parts each; coalesce the DataFrame")
    outputs = {name for name, _ in uploads}
    rows: list[tuple[int, int, int, str, int, list[int]]] = []
    with contextlib.ExitStack() as stack:
        spools = {name: stack.enter_context(tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY))
                  for name in sorted(outputs)}
        for name, chunk in encode(batches):
            if name not in spools:
                raise MultipartError(f"the encoder produced output {name!r}; the targets name {sorted(outputs)}")
            spools[name].write(chunk)
        sizes = {name: spool.tell() for name, spool in spools.items()}
        for index, (name, upload) in enumerate(uploads):
            staged, head, numbers = _send(upload, spools[name], sizes[name], piece, parts_per_task)  # type: ignore[arg-type]
            rows.append((index, piece, sizes[name], staged, head, numbers))
    yield pa.RecordBatch.from_arrays([pa.array(column, field.type) for column, field in
                                      zip(zip(*rows, strict=True), _PIECE_ARROW, strict=True)], schema=_PIECE_ARROW)


@dataclass(frozen=True, slots=True)
class SentPiece:
    """What a task sent of one piece to one upload: the staged head (its key and size; "" when the
    piece is empty) and the body part numbers it wrote."""

    staged: str
    staged_bytes: int
    parts: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"staged": self.staged, "staged_bytes": self.staged_bytes, "parts": list(self.parts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SentPiece:
        return cls(str(data["staged"]), int(data["staged_bytes"]), tuple(int(n) for n in data["parts"]))


def send_piece(upload: MultipartUpload, spool: BinaryIO, size: int, piece: int, parts_per_task: int) -> SentPiece:
    """Send `size` bytes of `spool` as piece number `piece` of `upload` (head staged, body as parts)."""
    staged, head, numbers = _send(upload, spool, size, piece, parts_per_task)
    return SentPiece(staged, head, tuple(numbers))


def plan_pieces(items: Sequence[tuple[int, SentPiece | CopyRange]],
                parts_per_task: int) -> tuple[list[PlannedPart], list[int]]:
    """One upload's parts still to write and the body parts its tasks wrote, from its pieces in
    object order: (piece index, what a task sent or a range of an existing object to copy).

    A run of staged heads and copied ranges takes numbers from its first piece's block on and must
    stay below the body that follows (at most one number per piece of the run, unless a range
    needs several parts of 5 GiB: MultipartError then names the shortage)."""
    planned: list[PlannedPart] = []
    written: list[int] = []
    run: list[CopyRange] = []
    run_first = 0
    for index, item in items:
        if isinstance(item, SentPiece):
            if not item.staged_bytes:
                continue
            segment = CopyRange(item.staged, 0, item.staged_bytes)
        else:
            segment = item
        if not run:
            run_first = index * parts_per_task + 1
        run.append(segment)
        if isinstance(item, SentPiece) and item.parts:
            planned.extend(plan_parts(run, first_number=run_first, max_parts=index * parts_per_task + 1))
            written.extend(item.parts)
            run = []
    if run:
        planned.extend(plan_parts(run, first_number=run_first))
    return planned, written


def complete_pieces(upload: MultipartUpload, items: Sequence[tuple[int, SentPiece | CopyRange]],
                    parts_per_task: int, *, threads: int = 8, revision: bool = True) -> PutResult:
    """Place the staged heads and copied ranges (`plan_pieces`), then complete the upload (driver;
    `revision` as for `MultipartUpload.complete`)."""
    planned, written = plan_pieces(items, parts_per_task)
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="assemble") as pool:
        list(pool.map(lambda part: write_planned(upload, part), planned))
    return upload.complete(sorted([*written, *(part.number for part in planned)]), revision=revision)


def parts_per_piece(pieces: int) -> int:
    """The part numbers each of `pieces` pieces of one object may use (S3 allows 10,000 in all)."""
    per = min(PARTS_PER_TASK, MAX_PARTS // max(1, pieces))
    if per < 2:
        raise MultipartError(f"{pieces} pieces cannot make one object: S3 allows {MAX_PARTS} parts and each piece "
                             "needs two numbers (its head and its body); use fewer, larger pieces")
    return per


def _final_parts(pieces: Sequence[Any], parts_per_task: int) -> tuple[list[PlannedPart], list[int]]:
    """`plan_pieces` over the piece rows (PIECE_DDL) the tasks of `assemble_objects` reported."""
    items = [(int(p["piece"]), SentPiece(str(p["staged"]), int(p["staged_bytes"]), tuple(p["parts"] or ())))
             for p in sorted(pieces, key=lambda p: int(p["piece"])) if p["bytes"]]
    return plan_pieces(items, parts_per_task)


def assemble_objects(df: DataFrame, targets: Sequence[Target], encode: Encoder, *,
                     parts_per_task: int = PARTS_PER_TASK, threads: int = 8) -> list[PutResult]:
    """Every target object, made of each partition's `encode`d bytes of its output, in partition order.

    One Spark job: each row is encoded once per output, whatever the number of destinations. Returns
    the results in `targets` order.
    """
    if parts_per_task < 2:
        raise MultipartError(f"parts_per_task must be at least 2 (a head and a body), got {parts_per_task}")
    if not targets:
        return []
    with contextlib.ExitStack() as stack:
        jobs = [stack.enter_context(Assembling(begin(dest, key))) for _, dest, key in targets]
        uploads = tuple((name, job.upload) for (name, _, _), job in zip(targets, jobs, strict=True))
        task = functools.partial(_write_shares, uploads=uploads, encode=encode, parts_per_task=parts_per_task)
        by_target: dict[int, list[Any]] = defaultdict(list)
        for row in df.mapInArrow(task, PIECE_DDL).collect():
            by_target[int(row["target"])].append(row)
        finals = [_final_parts(by_target[index], parts_per_task) for index in range(len(targets))]
        work = [(job.upload, part) for job, (planned, _) in zip(jobs, finals, strict=True) for part in planned]
        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="assemble") as pool:
            list(pool.map(lambda item: write_planned(*item), work))
        results = [job.complete(sorted([*written, *(part.number for part in planned)]))
                   for job, (planned, written) in zip(jobs, finals, strict=True)]
    return results


def _one_output(batches: Iterator[pa.RecordBatch], encode: Callable[[Iterator[pa.RecordBatch]], Iterable[bytes]],
                ) -> Iterator[tuple[str, bytes]]:
    for chunk in encode(batches):
        yield "", chunk


def assemble_object(df: DataFrame, dest: Destination, key: str,
                    encode: Callable[[Iterator[pa.RecordBatch]], Iterable[bytes]], **options: Any) -> PutResult:
    """The single object `key` on `dest` of every partition's `encode`d bytes (`assemble_objects` options)."""
    return assemble_objects(df, [("", dest, key)], functools.partial(_one_output, encode=encode), **options)[0]
