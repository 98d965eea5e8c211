"""The format seam: how one artifact (a snapshot or a diff) is encoded as bytes.

Every format streams in both directions so that no artifact has to fit in memory: writers take
one row or change at a time and readers yield one at a time. The same interface serves laredo's
formats (jsonl, protobuf) and this project's parquet; a shared conformance suite keeps them
interchangeable (tests/formats/).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, Protocol

from snapshot_assets.archive.changes import Change, Row


class SnapshotWriter(Protocol):
    """Receives the rows of one snapshot, in any order."""

    def write(self, row: Row) -> None: ...

    def close(self) -> None:
        """Flush everything to the output stream (the stream itself stays open)."""


class DiffWriter(Protocol):
    """Receives the changes of one diff, in the order readers must apply them."""

    def write(self, change: Change) -> None: ...

    def close(self) -> None: ...


class Format(Protocol):
    """One artifact encoding. `format_id` is the manifest's key; `extension` ends the object key."""

    format_id: str
    extension: str

    def snapshot_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> SnapshotWriter:
        """A writer of snapshot rows to `out`; `key_fields` only name rows in error messages."""
        ...

    def diff_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> DiffWriter: ...

    def read_snapshot(self, src: BinaryIO) -> Iterator[Row]:
        """Yield the rows of a snapshot; raises CorruptArtifact on undecodable input."""
        ...

    def read_diff(self, src: BinaryIO) -> Iterator[Change]: ...

    def key_value(self, value: Any) -> Any:
        """The value a reader of this format holds for a key value written here (for jsonl and
        protobuf: what laredo's Go reader decodes). A diff's `key` is laredo's `%v` RowKey of these
        (`keys.written_key`), so it equals the key a reader derives from the same format's snapshot
        row and its fold never leaves the old row behind."""
        ...
