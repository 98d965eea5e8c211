"""Format registry: the format ids a manifest may name, and their implementations."""

from __future__ import annotations

from snapshot_assets.archive.errors import UnknownFormat
from snapshot_assets.archive.formats.base import DiffWriter, Format, SnapshotWriter
from snapshot_assets.archive.formats.jsonl import JsonlFormat
from snapshot_assets.archive.formats.parquet import ParquetFormat
from snapshot_assets.archive.formats.protobuf import ProtobufFormat

FORMATS: dict[str, Format] = {
    f.format_id: f for f in (JsonlFormat(), ProtobufFormat(), ParquetFormat())
}


def get_format(format_id: str) -> Format:
    """The implementation of `format_id`, or UnknownFormat naming the ids that exist."""
    try:
        return FORMATS[format_id]
    except KeyError:
        raise UnknownFormat(
            f"unknown format {format_id!r}; known formats: {', '.join(sorted(FORMATS))}"
        ) from None


__all__ = ["FORMATS", "DiffWriter", "Format", "SnapshotWriter", "get_format"]
