"""The destination seam: where archive bytes land, and the compare-and-swap that commits a manifest.

Two kinds of writes exist. Artifact objects are immutable and keyed deterministically, so a plain
`put` (atomic replace) is safe to repeat. The manifest is the commit point, so it is written only
with `put_if`, a compare-and-swap on the object's revision: two writers can never both think they
advanced the same head. Implementations: local filesystem and S3 (one conformance suite,
tests/destinations/).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from resources.destinations.multipart import MultipartUpload


class DestinationError(Exception):
    """An operation on a destination failed (unreachable, denied, misconfigured)."""


class CASConflict(DestinationError):
    """`put_if` lost: the object's current revision is not the expected one (or it exists/is absent)."""


#: `PutResult.revision` of an object whose writer was told no one will compare its revision
#: (`MultipartUpload.complete(..., revision=False)`), where computing it means reading the object back.
REVISION_NOT_COMPUTED = ""


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a write made: the object's URI, its size and its revision (the token `put_if` compares:
    an S3 ETag, a local object's sha256; REVISION_NOT_COMPUTED when the writer was asked not to)."""

    uri: str
    size: int
    revision: str


@dataclass(frozen=True, slots=True)
class GetResult:
    data: bytes
    revision: str


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


def check_range(start: int, length: int) -> None:
    """The one rule for `Destination.read_range` arguments, so every implementation refuses alike."""
    if start < 0 or length < 0:
        raise DestinationError(f"invalid byte range: start {start}, length {length} (both must be >= 0)")


class ReadableDestination(Protocol):
    """The reading half of a destination: all the archive's readers (reconstruct, get, verify) are
    given, so the type checker proves they have no code path that writes."""

    name: str

    def uri(self, key: str) -> str:
        """The full URI of `key` (`file:///abs/path` or `s3://bucket/prefix/key`)."""
        ...

    def get(self, key: str) -> GetResult | None:
        """The object's bytes and revision, or None when it does not exist."""
        ...

    def open_read(self, key: str) -> BinaryIO:
        """A stream over the object (for artifacts too large to hold); FileNotFoundError when missing."""
        ...

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the object (fewer at its end; none from `start` on past
        it): a reader that knows where a row is (the snapshot key index) fetches only that part.
        FileNotFoundError when the object does not exist."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order."""
        ...


class Destination(ReadableDestination, Protocol):
    """A flat key space of immutable-ish objects under one root (a directory, an S3 bucket + prefix)."""

    def put(self, key: str, stream: BinaryIO | bytes) -> PutResult:
        """Store `stream` at `key`, replacing atomically: readers see the old or the new object, never a part."""
        ...

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        """Compare-and-swap: write only if the current revision is `expected_revision`.

        `expected_revision=None` means the object must not exist. Returns the new revision;
        raises CASConflict when the condition does not hold.
        """
        ...

    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing object is not an error."""
        ...

    def begin_multipart(self, key: str) -> MultipartUpload:
        """Start assembling `key` from parts written anywhere (resources/destinations/multipart.py)."""
        ...

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> tuple[str, ...]:
        """Abort the multipart uploads under `prefix` begun more than `older_than_s` ago (a crashed
        run's leftovers, which S3 keeps and bills until aborted); returns the keys they were for."""
        ...
