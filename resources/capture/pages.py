"""Page encoding (RFC-023): protobuf `EventPage` or NDJSON, then none/gzip/zstd.

Both formats carry the same values: NDJSON's first line is `{"metadata": {...}}` with the
PageMetadata fields by name, then one event per line with the payload in base64; protobuf is one
`EventPage` message. Decoding needs nothing but the bytes: the compression is recognised by its
magic number and the format by the first byte (an NDJSON page starts with `{`, which no field of
EventPage encodes to), so a consumer reading a bucket needs neither the configuration nor the index.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zstandard

from resources.proto.prism.snapshotter.page_pb2 import Event, EventPage, PageMetadata

FORMAT_VERSION = "v1"
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_METADATA_INTS = ("page_sequence", "start_time", "end_time", "event_count", "page_size_bytes")


class PageError(ValueError):
    """Bytes that are not a page this module can read."""


@dataclass(frozen=True)
class EncodedPage:
    """A page ready to store: its bytes and the metadata they carry (`page_size_bytes` = uncompressed)."""

    data: bytes
    metadata: PageMetadata


def compress(data: bytes, compression: str) -> bytes:
    if compression == "none":
        return data
    if compression == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)  # mtime 0: the same page, the same bytes
    if compression == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(data)
    raise PageError(f"unknown compression {compression!r}")


def decompress(data: bytes) -> tuple[bytes, str]:
    """The uncompressed bytes and the compression they were in."""
    if data.startswith(_GZIP_MAGIC):
        return gzip.decompress(data), "gzip"
    if data.startswith(_ZSTD_MAGIC):
        return zstandard.ZstdDecompressor().decompressobj().decompress(data), "zstd"
    return data, "none"


def metadata_for(writer_id: str, events: Sequence[Event], compression: str, tags: dict[str, str]) -> PageMetadata:
    """The metadata of a page of `events` (non-empty, in sequence order); its size is filled by `encode`."""
    return PageMetadata(writer_id=writer_id, page_sequence=events[0].sequence, start_time=events[0].timestamp,
                        end_time=events[-1].timestamp, event_count=len(events), format_version=FORMAT_VERSION,
                        compression=compression, tags=tags)


def encode(metadata: PageMetadata, events: Sequence[Event], page_format: str, *,
           include_metadata: bool = True) -> EncodedPage:
    """The stored bytes of a page. `page_size_bytes` is the size of the uncompressed page it is part of
    (found by re-encoding the metadata until the number and the size agree: its own varint may grow
    the page). The events are encoded once: both formats are the metadata's bytes, then the events'."""
    if not include_metadata:
        events = [Event(event_id=e.event_id, timestamp=e.timestamp, payload=e.payload, sequence=e.sequence)
                  for e in events]
    if page_format == "protobuf":
        # Fields serialize in number order, so metadata (1) then events (2) is the EventPage's encoding.
        head, body = _protobuf_metadata, EventPage(events=events).SerializeToString(deterministic=True)
    elif page_format == "ndjson":
        head, body = _ndjson_metadata, "".join(json.dumps(event_json(e), separators=(",", ":")) + "\n"
                                               for e in events).encode()
    else:
        raise PageError(f"unknown page format {page_format!r}")
    meta = PageMetadata()
    meta.CopyFrom(metadata)
    first = head(meta)
    for _ in range(8):
        if meta.page_size_bytes == len(first) + len(body):
            break
        meta.page_size_bytes = len(first) + len(body)
        first = head(meta)
    return EncodedPage(compress(first + body, meta.compression), meta)


def decode(data: bytes) -> EventPage:
    """The page in `data`, whichever format and compression it was written in."""
    raw, _ = decompress(data)
    if raw.startswith(b"{"):
        return _from_ndjson(raw)
    page = EventPage()
    try:
        page.ParseFromString(raw)
    except Exception as e:  # protobuf's DecodeError
        raise PageError(f"not a protobuf EventPage: {e}") from None
    return page


def page_format(data: bytes) -> str:
    """`protobuf` or `ndjson`, from the page's bytes."""
    return "ndjson" if decompress(data)[0].startswith(b"{") else "protobuf"


def _protobuf_metadata(meta: PageMetadata) -> bytes:
    return EventPage(metadata=meta).SerializeToString(deterministic=True)


def _ndjson_metadata(meta: PageMetadata) -> bytes:
    return (json.dumps({"metadata": _metadata_json(meta)}, separators=(",", ":")) + "\n").encode()


def event_json(e: Event) -> dict[str, Any]:
    """An event as an NDJSON page line writes it (payload in base64)."""
    return {"event_id": e.event_id, "timestamp": e.timestamp, "payload": base64.b64encode(e.payload).decode("ascii"),
            "attributes": dict(sorted(e.attributes.items())), "sequence": e.sequence}


def _metadata_json(meta: PageMetadata) -> dict[str, Any]:
    return {"writer_id": meta.writer_id, "page_sequence": meta.page_sequence, "start_time": meta.start_time,
            "end_time": meta.end_time, "event_count": meta.event_count, "page_size_bytes": meta.page_size_bytes,
            "format_version": meta.format_version, "compression": meta.compression,
            "tags": dict(sorted(meta.tags.items()))}


def _from_ndjson(raw: bytes) -> EventPage:
    lines = raw.decode().splitlines()
    try:
        head = json.loads(lines[0])["metadata"]
        meta = PageMetadata(writer_id=head["writer_id"], format_version=head["format_version"],
                            compression=head["compression"], tags=head.get("tags", {}),
                            **{k: int(head[k]) for k in _METADATA_INTS})
        events = [_event_json(json.loads(line)) for line in lines[1:] if line]
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise PageError(f"not an NDJSON page: {e}") from None
    return EventPage(metadata=meta, events=events)


def _event_json(obj: dict[str, Any]) -> Event:
    return Event(event_id=obj["event_id"], timestamp=int(obj["timestamp"]),
                 payload=base64.b64decode(obj["payload"], validate=True), attributes=obj.get("attributes", {}),
                 sequence=int(obj["sequence"]))
