"""The Connect protocol's streaming envelope, shared by the laredo client and the fan-out server.

A Connect server stream (`Content-Type: application/connect+proto`) is a sequence of frames
`[flags:1][length:4, big-endian][payload]`. Flag 0x01 marks a compressed payload, 0x02 the
end-of-stream frame, whose payload is JSON: `{"error": {"code", "message", "details"?}?,
"metadata": {...}?}`. The request of a server-streaming call is one such frame.

The decoder is fed whatever the socket returns, so a frame split across TCP reads (or several
frames in one read) is the normal case, not an edge case. It never trusts a length prefix beyond
`max_frame_bytes` and refuses flags it does not know: a malformed stream is an error, never a
garbled message.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from resources.subscribers.replication_wire import Code, StatusError
from snapshot_assets.archive.gojson import too_deep

CONTENT_TYPE = "application/connect+proto"
PROTOCOL_VERSION_HEADER = "Connect-Protocol-Version"
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
_KNOWN_FLAGS = FLAG_COMPRESSED | FLAG_END_STREAM
_HEADER = struct.Struct(">BI")
HEADER_BYTES = _HEADER.size
#: Largest message accepted by default: far above any sane row, far below a corrupt length's 4 GiB.
DEFAULT_MAX_FRAME_BYTES = 64 << 20


class FramingError(ValueError):
    """The bytes are not a valid Connect stream (bad flags, absurd length, bad end-stream JSON)."""


class TruncatedStream(FramingError):
    """The connection ended inside a frame: a network failure, not a malformed message."""


@dataclass(frozen=True, slots=True)
class Frame:
    flags: int
    payload: bytes

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM)


def encode_frame(payload: bytes, flags: int = 0) -> bytes:
    return _HEADER.pack(flags, len(payload)) + payload


class FrameDecoder:
    """Incremental frame decoder: `feed` bytes as they arrive, get whole frames back."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self.offset = 0  # bytes of the stream consumed, for error messages

    def feed(self, data: bytes) -> Iterator[Frame]:
        self._buf += data
        while len(self._buf) >= HEADER_BYTES:
            flags, length = _HEADER.unpack_from(self._buf)
            if flags & ~_KNOWN_FLAGS:
                raise FramingError(f"frame at byte {self.offset} has unknown flags 0x{flags:02x}")
            if flags & FLAG_COMPRESSED:
                raise FramingError(f"frame at byte {self.offset} is compressed, but no compression "
                                   "was negotiated")
            if length > self._max:
                raise FramingError(f"frame at byte {self.offset} declares {length} bytes, more than "
                                   f"the {self._max}-byte limit (a corrupt length prefix?)")
            end = HEADER_BYTES + length
            if len(self._buf) < end:
                return
            payload = bytes(self._buf[HEADER_BYTES:end])
            del self._buf[:end]
            self.offset += end
            yield Frame(flags, payload)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)

    def finish(self) -> None:
        """The stream ended: raise TruncatedStream if it ended inside a frame."""
        if self._buf:
            raise TruncatedStream(f"stream ended inside a frame at byte {self.offset} "
                                  f"({len(self._buf)} bytes of it received)")


# --- end of stream ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EndStream:
    error: StatusError | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def parse_end_stream(payload: bytes) -> EndStream:
    """Decode an end-of-stream frame's JSON; an error object without a code is `unknown`."""
    if not payload.strip():
        return EndStream()
    try:
        doc = json.loads(payload)
    except ValueError as exc:  # also bad UTF-8, and integers beyond Python's digit limit
        raise FramingError(f"end-of-stream frame is not JSON: {exc}") from None
    except RecursionError:
        raise FramingError(f"end-of-stream frame is not JSON: {too_deep()}") from None
    if not isinstance(doc, dict):
        raise FramingError(f"end-of-stream frame is JSON {type(doc).__name__}, not an object")
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise FramingError("end-of-stream metadata is not an object")
    error = doc.get("error")
    if error is None:
        return EndStream(metadata=metadata)
    if not isinstance(error, dict):
        raise FramingError("end-of-stream error is not an object")
    code = Code.parse(str(error.get("code", "unknown")))
    message = error.get("message", "")
    return EndStream(StatusError(code, message if isinstance(message, str) else str(message)), metadata)


def end_stream_payload(error: StatusError | None = None, metadata: Mapping[str, list[str]] | None = None) -> bytes:
    doc: dict[str, Any] = {}
    if error is not None:
        doc["error"] = {"code": error.code.value, "message": error.message}
    if metadata:
        doc["metadata"] = dict(metadata)
    return json.dumps(doc, separators=(",", ":")).encode()


def end_stream_frame(error: StatusError | None = None) -> bytes:
    return encode_frame(end_stream_payload(error), FLAG_END_STREAM)


# --- HTTP status (errors outside the stream) ----------------------------------------------------

_HTTP_CODES = {
    400: Code.INTERNAL,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.UNIMPLEMENTED,
    408: Code.DEADLINE_EXCEEDED,
    415: Code.INTERNAL,
    429: Code.UNAVAILABLE,
    502: Code.UNAVAILABLE,
    503: Code.UNAVAILABLE,
    504: Code.UNAVAILABLE,
}


def code_for_http_status(status: int) -> Code:
    """The Connect protocol's mapping of a non-200 response status to a code."""
    return _HTTP_CODES.get(status, Code.UNKNOWN)
