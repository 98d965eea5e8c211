"""The multipart seam: one object assembled from ordered parts, written by whichever host has the bytes.

Why: a Spark task on another host must be able to write its share of an artifact straight into
the destination, and a re-base must reuse the bytes of an earlier object without moving them
through any host. So an upload is a small, picklable handle (`begin(dest, key)`) that travels into
tasks; `write_part` sends fresh bytes, `copy_part` reuses a byte range of an object already on the
destination (S3 UploadPartCopy; local `copy_file_range`, which reflinks on filesystems that can),
and the driver `complete`s the upload with the ordered part numbers (or `abort`s it).

Both implementations (resources/destinations/local_multipart.py, s3_multipart.py) follow S3's rules,
checked here once (`check_parts`) before completing: part numbers 1..10000, ascending, and every
part but the last at least 5 MiB (at most 5 GiB). A local destination enforces them too, so a
build that works on disk cannot fail on S3 for the first time in production.

`plan_parts` turns an ordered list of pieces (`Fresh` bytes of known size, or a `CopyRange` of an
existing object) into parts that obey those rules: ranges of at least 5 MiB are copied server-side,
small pieces are merged with their neighbours (a small copied range is then fetched and re-uploaded:
the only case where existing bytes pass through a host, never more than 5 MiB per piece). A part
made of several segments is always under 10 MiB. `write_planned` executes one planned part,
`write_plan` a whole plan with a few parts in flight (a server-side copy is one request that
waits on S3 while it copies, so a re-base of many buckets is bound by those waits, not by bytes).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, Protocol

from resources.destinations.base import DestinationError, PutResult

if TYPE_CHECKING:
    from resources.destinations.base import Destination

MiB = 1024 * 1024
GiB = 1024 * MiB
MIN_PART_SIZE = 5 * MiB  # S3's floor for every part but the last
MAX_PART_SIZE = 5 * GiB  # S3's ceiling for one part (UploadPart and UploadPartCopy)
MAX_PARTS = 10_000  # S3's ceiling on part numbers

PartData = BinaryIO | bytes | bytearray
"""What a part is written from: a stream read to its end, or bytes (a merged part's buffer is a bytearray)."""


class MultipartError(DestinationError):
    """A multipart upload cannot be assembled as asked (bad part number, part too small, missing part)."""


@dataclass(frozen=True, slots=True)
class PartReceipt:
    """What one written or copied part became: its number, size and the destination's token for it."""

    number: int
    size: int
    etag: str


class MultipartUpload(Protocol):
    """An object being assembled from parts; picklable, so tasks on other hosts can write parts.

    Parts may be written in any order and by any process; writing a part number again replaces it
    (a retried or speculative task attempt is harmless). Nothing is visible under `key` before
    `complete`.
    """

    @property
    def key(self) -> str:
        """The key the object will have."""
        ...

    @property
    def upload_id(self) -> str:
        """This upload's identity (S3's UploadId; the local staging folder's name)."""
        ...

    def uri(self) -> str:
        """The URI the object will have once completed."""
        ...

    def write_part(self, number: int, data: PartData) -> PartReceipt:
        """Store `data` (a stream read to its end, or bytes) as part `number`."""
        ...

    def copy_part(self, number: int, source_key: str, start: int, length: int) -> PartReceipt:
        """Make part `number` the bytes [start, start + length) of the existing object `source_key`,
        without those bytes leaving the destination."""
        ...

    def read_range(self, source_key: str, start: int, length: int) -> bytes:
        """The bytes [start, start + length) of `source_key` (for small ranges merged into a part)."""
        ...

    def stage(self, name: str, data: bytes) -> CopyRange:
        """Keep `data` as an object beside the upload (see `staged_key`), a source for `copy_part` and
        `read_range`: how a piece too small to be a part reaches the host that merges it. Staged objects
        are removed when the upload completes or aborts."""
        ...

    def complete(self, numbers: Sequence[int], *, revision: bool = True) -> PutResult:
        """Publish the object made of parts `numbers` (ascending) in that order; no parts = an empty object.

        Raises MultipartError, before anything is published, when a part is missing or breaks S3's
        rules; the upload stays open then (fix a part and complete again, or `abort`).

        `revision=False`: the caller never compares this object's revision (an artifact is written
        once under a new key; only small objects such as the manifest are swapped with `put_if`), so
        a destination that would have to read the whole object back to compute it (a local one: its
        sha256) returns REVISION_NOT_COMPUTED instead. S3 returns its ETag either way (it comes with
        the completion).
        """
        ...

    def abort(self) -> None:
        """Drop the upload and every part written so far; aborting twice is not an error."""
        ...


def staged_prefix(key: str, upload_id: str) -> str:
    """Where an upload's staged objects live: beside the object's key, named by the upload (a failed
    run's leftovers are then easy to recognise: `<key>.parts-<upload id>/`)."""
    return f"{key}.parts-{upload_id}/"


def staged_key(key: str, upload_id: str, name: str) -> str:
    if not name or "/" in name:
        raise MultipartError(f"staged object name {name!r} must be non-empty and contain no '/'")
    return staged_prefix(key, upload_id) + name


def begin(dest: Destination, key: str) -> MultipartUpload:
    """Start assembling the object `key` on `dest` (on the driver; hand the result to the tasks)."""
    return dest.begin_multipart(key)


class Assembling:
    """`with Assembling(upload) as job: ... job.complete(numbers)` aborts the upload if the block fails first."""

    def __init__(self, upload: MultipartUpload) -> None:
        self.upload = upload
        self.result: PutResult | None = None

    def __enter__(self) -> Assembling:
        return self

    def complete(self, numbers: Sequence[int], *, revision: bool = True) -> PutResult:
        self.result = self.upload.complete(numbers, revision=revision)
        return self.result

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None and self.result is None:
            self.upload.abort()


# -- S3's rules ---------------------------------------------------------------------------------------


def check_part_number(number: int, where: str) -> None:
    """MultipartError unless `number` is a part number S3 accepts."""
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_PARTS:
        raise MultipartError(f"{where}: part number {number!r} is outside 1..{MAX_PARTS}")


def check_range(start: int, length: int, where: str) -> None:
    if start < 0 or length <= 0:
        raise MultipartError(f"{where}: byte range start={start} length={length} is empty or negative")
    if length > MAX_PART_SIZE:
        raise MultipartError(f"{where}: a part of {length} bytes exceeds the {MAX_PART_SIZE}-byte maximum")


def check_numbers(numbers: Sequence[int], where: str) -> None:
    """MultipartError unless `numbers` ascend within 1..10000 (checked before any part is looked up)."""
    previous = 0
    for number in numbers:
        check_part_number(number, where)
        if number <= previous:
            raise MultipartError(f"{where}: part numbers must ascend, got {number} after {previous}")
        previous = number


def check_parts(parts: Sequence[tuple[int, int]], where: str, *, min_part: int = MIN_PART_SIZE) -> None:
    """Raise MultipartError unless (number, size) pairs form a valid upload, in the order given.

    Numbers ascending within 1..10000; every part but the last of at least `min_part` bytes; none
    over 5 GiB. The message names the offending part, so a caller knows which piece to merge.
    """
    check_numbers([number for number, _ in parts], where)
    for index, (number, size) in enumerate(parts):
        if index < len(parts) - 1 and size < min_part:
            raise MultipartError(
                f"{where}: part {number} has {size} bytes; every part but the last needs at least "
                f"{min_part} bytes (merge it with a neighbour, see plan_parts)")
        if size > MAX_PART_SIZE:
            raise MultipartError(f"{where}: part {number} has {size} bytes, over the {MAX_PART_SIZE}-byte maximum")


# -- planning -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fresh:
    """A piece of new bytes of a known size; the caller supplies them when a part needs them."""

    size: int


@dataclass(frozen=True, slots=True)
class CopyRange:
    """Bytes [start, start + length) of an object already on the destination (a piece or a segment)."""

    key: str
    start: int
    length: int

    @property
    def size(self) -> int:
        return self.length


@dataclass(frozen=True, slots=True)
class FreshSlice:
    """Bytes [offset, offset + length) of fresh piece number `piece` (its index in the piece list)."""

    piece: int
    offset: int
    length: int


Piece = Fresh | CopyRange
Segment = FreshSlice | CopyRange


@dataclass(frozen=True, slots=True)
class PlannedPart:
    """One part of a plan: its number and the segments it is made of, in order."""

    number: int
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.length for s in self.segments)

    @property
    def copy(self) -> CopyRange | None:
        """The range this part copies server-side, when it is exactly one existing range."""
        only = self.segments[0] if len(self.segments) == 1 else None
        return only if isinstance(only, CopyRange) else None


def _coalesce(pieces: Sequence[Piece]) -> list[tuple[int, Piece]]:
    """Non-empty pieces with their indices; adjacent contiguous ranges of one object become one range
    (consecutive unchanged buckets of a previous snapshot are then a single server-side copy)."""
    out: list[tuple[int, Piece]] = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, CopyRange):
            if piece.start < 0 or piece.length < 0:
                raise MultipartError(f"piece {index}: invalid range start={piece.start} length={piece.length}")
        elif piece.size < 0:
            raise MultipartError(f"piece {index}: negative size {piece.size}")
        if piece.size == 0:
            continue
        last = out[-1][1] if out else None
        if (isinstance(piece, CopyRange) and isinstance(last, CopyRange) and last.key == piece.key
                and last.start + last.length == piece.start):
            out[-1] = (out[-1][0], CopyRange(last.key, last.start, last.length + piece.length))
        else:
            out.append((index, piece))
    return out


def _slice(index: int, piece: Piece, offset: int, length: int) -> Segment:
    if isinstance(piece, CopyRange):
        return CopyRange(piece.key, piece.start + offset, length)
    return FreshSlice(index, offset, length)


def split_evenly(length: int, max_part: int) -> list[int]:
    """`length` (>= the minimum) cut into the fewest near-equal sizes of at most `max_part`: each is then
    over max_part / 2, hence at least the minimum when max_part >= 2 * the minimum."""
    count = -(-length // max_part)
    base, extra = divmod(length, count)
    return [base + 1] * extra + [base] * (count - extra)


def plan_parts(pieces: Sequence[Piece], *, min_part: int = MIN_PART_SIZE, max_part: int = MAX_PART_SIZE,
               max_parts: int = MAX_PARTS, first_number: int = 1) -> tuple[PlannedPart, ...]:
    """Valid parts (numbered from `first_number`) whose segments, concatenated, are exactly the pieces.

    A piece big enough to stand alone gets parts of its own (a range: server-side copies; fresh
    bytes: parts its producer can write alone); smaller pieces collect in a pending part until it
    reaches `min_part`, topped up from the head of the next big piece when needed. So a multi-
    segment part is under 2 * `min_part`, and at most `min_part` bytes of any big range are fetched.
    MultipartError when more than `max_parts` parts would be needed.
    """
    if min_part <= 0 or 2 * min_part > max_part:
        raise MultipartError(f"plan_parts needs 0 < min_part and 2 * min_part <= max_part, got {min_part}, {max_part}")
    parts: list[tuple[Segment, ...]] = []
    pending: list[Segment] = []
    pending_size = 0
    for index, piece in _coalesce(pieces):
        top_up = min_part - pending_size if pending else 0
        if piece.size >= min_part + top_up:
            if top_up:
                pending.append(_slice(index, piece, 0, top_up))
                parts.append(tuple(pending))
                pending, pending_size = [], 0
            offset = top_up
            for size in split_evenly(piece.size - top_up, max_part):
                parts.append((_slice(index, piece, offset, size),))
                offset += size
        else:
            pending.append(_slice(index, piece, 0, piece.size))
            pending_size += piece.size
            if pending_size >= min_part:
                parts.append(tuple(pending))
                pending, pending_size = [], 0
    if pending:
        parts.append(tuple(pending))
    if first_number + len(parts) - 1 > max_parts:
        raise MultipartError(f"the pieces need {len(parts)} parts from number {first_number}, beyond the "
                             f"{max_parts} S3 allows; use fewer, larger pieces")
    return tuple(PlannedPart(number, segments) for number, segments in enumerate(parts, start=first_number))


FreshSource = Callable[[FreshSlice], BinaryIO | bytes]


def _read_all(data: BinaryIO | bytes) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    with data:
        return data.read()


MERGES_IN_MEMORY = 2
"""How many threads of one process build merged parts: the parts it holds in memory at once.

Why: a merged part (under 2 * MIN_PART_SIZE) is the only thing a plan holds in memory, and a
snapshot whose buckets are just under MIN_PART_SIZE (parquet at about 10M rows) is nothing but
merged parts. Built by whichever of `write_plan`'s 8 threads wrote the part, the run process grew
by about 190 MiB while it assembled such an object, and bounding how many merged at once did not
shrink it: glibc raises its mmap threshold once a buffer this big is freed, so later buffers come
from the allocating thread's own arena, which keeps the memory. Eight threads, eight arenas of
about 20 MiB. Two dedicated threads keep two (about 40 MiB, whatever the table or the number of
uploads); copies and lone fresh parts, which hold no bytes here, keep every thread."""

_mergers: tuple[int, ThreadPoolExecutor] | None = None
_mergers_lock = threading.Lock()


def _merger() -> ThreadPoolExecutor:
    """This process's merging threads (made again in a forked child, where the parent's are gone)."""
    global _mergers
    with _mergers_lock:
        if _mergers is None or _mergers[0] != os.getpid():
            _mergers = (os.getpid(), ThreadPoolExecutor(MERGES_IN_MEMORY, thread_name_prefix="merge-part"))
        return _mergers[1]


def _merged(upload: MultipartUpload, part: PlannedPart, supply: FreshSource) -> bytearray:
    """The bytes of a part made of several segments, read into one buffer of the part's size."""
    body = bytearray(part.size)
    at = 0
    for s in part.segments:
        chunk = upload.read_range(s.key, s.start, s.length) if isinstance(s, CopyRange) else _read_all(supply(s))
        end = at + len(chunk)
        if end > part.size:
            raise MultipartError(f"{upload.uri()}: part {part.number} should hold {part.size} bytes, its segments "
                                 f"gave more than that")
        body[at:end] = chunk
        at = end
        del chunk  # before the next segment is read: a part in memory is its buffer and one segment
    if at != part.size:
        raise MultipartError(f"{upload.uri()}: part {part.number} should hold {part.size} bytes, its segments "
                             f"gave {at}")
    return body


def write_planned(upload: MultipartUpload, part: PlannedPart, fresh: FreshSource | None = None) -> PartReceipt:
    """Write one planned part: a lone range by server-side copy, a lone fresh slice streamed from
    `fresh`, a mixed part (under 2 * MIN_PART_SIZE) assembled in memory from its segments by one of
    the process's MERGES_IN_MEMORY merging threads."""
    copy = part.copy
    if copy is not None:
        return upload.copy_part(part.number, copy.key, copy.start, copy.length)

    def supply(segment: FreshSlice) -> BinaryIO | bytes:
        if fresh is None:
            raise MultipartError(f"{upload.uri()}: part {part.number} needs fresh piece {segment.piece}, "
                                 "but no source of fresh bytes was given")
        return fresh(segment)

    if len(part.segments) == 1:
        only = part.segments[0]
        assert isinstance(only, FreshSlice)  # a lone CopyRange returned above
        return upload.write_part(part.number, supply(only))
    # Built and written by a merging thread, so the buffer lives and dies in one of their arenas.
    return _merger().submit(lambda: upload.write_part(part.number, _merged(upload, part, supply))).result()


def write_plan(upload: MultipartUpload, plan: Sequence[PlannedPart], fresh: FreshSource | None = None, *,
               threads: int = 8) -> PutResult:
    """Write every planned part (`threads` at a time) and complete the upload in plan order.

    `fresh` must be callable from several threads at once when the plan has fresh parts. On any
    failure the upload is left open for the caller to abort (see `Assembling`).
    """
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="multipart") as pool:
        receipts = list(pool.map(lambda part: write_planned(upload, part, fresh), plan))
    return upload.complete([receipt.number for receipt in receipts])
