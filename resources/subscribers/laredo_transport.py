"""Client transports for laredo's Sync stream: Connect over HTTP/1.1 and gRPC over HTTP/2.

Both hide behind one small interface, `Transport.open(request) -> SyncStream`, so the subscriber's
state machine never knows which one it talks to. A stream yields decoded `SyncResponse`
messages and ends in one of three ways:

- cleanly (the iterator stops): the server ended the stream with no error;
- `StatusError`: the server ended it with a status (NOT_FOUND, RESOURCE_EXHAUSTED, ...);
- `TlsError`: TLS cannot work as configured (untrusted certificate, wrong name, refused client
  certificate), which no reconnect fixes;
- `FramingError` / `TruncatedStream` / `OSError`: the bytes were malformed or the connection died.

`close()` may be called from another thread at any time and unblocks a pending read: that is
how the subscriber abandons a silent stream or the old stream of a GoAway hand-off.

Connect is implemented on the standard library's `http.client`: a server stream is a single POST
whose response body is read incrementally (chunked or until EOF), so no Connect runtime is needed.
gRPC uses grpcio's generic `unary_stream` with the shared RPC path, so no generated stub (and no
untyped generated module) is involved.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import (
    CONTENT_TYPE,
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION_HEADER,
    FrameDecoder,
    FramingError,
    code_for_http_status,
    encode_frame,
    parse_end_stream,
)
from resources.subscribers.replication_wire import DEFAULT_PORT, SYNC_PATH, Code, StatusError
from resources.subscribers.tls import (
    ClientTls,
    TlsError,
    diagnose,
    explain_ssl_error,
    grpc_tls_failure,
    permanent_ssl_error,
)

_READ_CHUNK = 1 << 16


class SyncStream(Protocol):
    def messages(self) -> Iterator[pb.SyncResponse]: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """Opens Sync streams to one server address."""

    name: str

    def open(self, request: pb.SyncRequest) -> SyncStream: ...

    def close(self) -> None: ...


def decode_response(payload: bytes) -> pb.SyncResponse:
    message = pb.SyncResponse()
    try:
        message.ParseFromString(payload)
    except DecodeError as exc:
        raise FramingError(f"frame payload is not a SyncResponse: {exc}") from None
    return message


# --- Connect ------------------------------------------------------------------------------------


class ConnectStream:
    """One Sync call over HTTP/1.1: the POST is sent by `open`, the body read by `messages`."""

    def __init__(self, conn: http.client.HTTPConnection, max_frame_bytes: int,
                 tls_error: Callable[[BaseException], BaseException]) -> None:
        self._conn = conn
        self._max = max_frame_bytes
        self._tls_error = tls_error
        self._closed = threading.Event()

    def _response(self) -> http.client.HTTPResponse:
        try:
            # Under TLS 1.3 a server that refuses the client certificate says so after the
            # handshake: the alert arrives with the response.
            response = self._conn.getresponse()
        except OSError as exc:
            failure = exc if self._closed.is_set() else self._tls_error(exc)
            if failure is exc:
                raise
            raise failure from None
        if response.status != 200:
            body = response.read(4096).decode("utf-8", "replace").strip()
            raise StatusError(code_for_http_status(response.status),
                              f"HTTP {response.status} {response.reason}: {body}".rstrip(": "))
        content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != CONTENT_TYPE:
            raise StatusError(Code.UNKNOWN, f"response Content-Type is {content_type!r}, not {CONTENT_TYPE}")
        return response

    def messages(self) -> Iterator[pb.SyncResponse]:
        response = self._response()
        decoder = FrameDecoder(self._max)
        while True:
            try:
                data = response.read1(_READ_CHUNK)
            except (http.client.IncompleteRead, ValueError, AttributeError) as exc:
                if self._closed.is_set():
                    return
                raise ConnectionResetError(f"connection lost while reading the stream: {exc!r}") from None
            if not data:
                if self._closed.is_set():
                    return
                decoder.finish()
                raise ConnectionResetError("stream ended without an end-of-stream frame")
            for frame in decoder.feed(data):
                if frame.end_stream:
                    end = parse_end_stream(frame.payload)
                    if end.error is not None:
                        raise end.error
                    return
                yield decode_response(frame.payload)

    def close(self) -> None:
        self._closed.set()
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed by the peer
                sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()


class _TlsConnection(http.client.HTTPConnection):
    """HTTP/1.1 over TLS that verifies `server_name` (and sends it as SNI) instead of the host dialled."""

    default_port = 443

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext, server_name: str) -> None:
        super().__init__(host, port, timeout=timeout)
        self._context = context
        self._server_name = server_name

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)


class ConnectTransport:
    """Connect protocol over HTTP/1.1 (what a stock laredo-server speaks in plaintext), or over TLS
    with `tls` (or an https:// URL, verified against the system CAs)."""

    name = "connect"

    def __init__(self, url: str, *, connect_timeout: float = 10.0,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, tls: ClientTls | None = None) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"Connect URL must be http:// or https://, got {url!r}")
        self._host = parts.hostname or "localhost"
        self._port = parts.port or DEFAULT_PORT
        self._path = parts.path.rstrip("/") + SYNC_PATH
        self._timeout = connect_timeout
        self._max = max_frame_bytes
        self._tls = tls if tls is not None else ClientTls() if parts.scheme == "https" else None
        self._context = self._tls.ssl_context() if self._tls is not None else None

    def _connection(self) -> http.client.HTTPConnection:
        if self._tls is None or self._context is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return _TlsConnection(self._host, self._port, timeout=self._timeout, context=self._context,
                              server_name=self._tls.server_name or self._host)

    def open(self, request: pb.SyncRequest) -> ConnectStream:
        conn = self._connection()
        body = encode_frame(request.SerializeToString())
        try:
            conn.request("POST", self._path, body=body, headers={
                "Content-Type": CONTENT_TYPE,
                PROTOCOL_VERSION_HEADER: "1",
                "Accept-Encoding": "identity",
            })
            if conn.sock is not None:
                # Reads block until the server writes; liveness is judged by the subscriber
                # (heartbeat silence), which closes the stream to unblock the read.
                conn.sock.settimeout(None)
        except BaseException as exc:
            conn.close()
            failure = self._tls_error(exc)
            if failure is exc:
                raise
            raise failure from None
        return ConnectStream(conn, self._max, self._tls_error)

    def _tls_error(self, exc: BaseException) -> BaseException:
        """A permanent TLS failure as a TlsError naming the cause; anything else unchanged.

        A connection the server closed right after the handshake may be a refused client
        certificate whose alert lost the race with our request: a fresh handshake tells.
        """
        if self._tls is None:
            return exc
        if isinstance(exc, ssl.SSLError) and permanent_ssl_error(exc):
            return explain_ssl_error(exc, f"{self._host}:{self._port}", self._tls)
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ssl.SSLError)):
            return diagnose(self._host, self._port, self._tls, alpn=("http/1.1",)) or exc
        return exc

    def close(self) -> None:
        """Nothing pooled: every stream owns its connection."""


# --- gRPC ---------------------------------------------------------------------------------------

_GRPC_CODES: dict[Any, Code] = {code: Code.parse(code.name) for code in grpc.StatusCode}


class GrpcStream:
    def __init__(self, channel: Any, call: Any, tls_error: Callable[[str], TlsError | None]) -> None:
        self._channel = channel
        self._call = call
        self._tls_error = tls_error
        self._cancelled = threading.Event()

    def messages(self) -> Iterator[pb.SyncResponse]:
        try:
            for message in self._call:
                yield cast(pb.SyncResponse, message)
        except grpc.RpcError as exc:
            if self._cancelled.is_set():
                return
            code = _GRPC_CODES.get(exc.code(), Code.UNKNOWN)
            details = str(exc.details() or "")
            tls_error = self._tls_error(details) if code is Code.UNAVAILABLE else None
            if tls_error is not None:
                raise tls_error from None
            raise StatusError(code, details) from None
        finally:
            self._channel.close()

    def close(self) -> None:
        self._cancelled.set()
        self._call.cancel()
        self._channel.close()


class GrpcTransport:
    """gRPC over HTTP/2: over TLS with `tls` (or a grpcs:// / https:// URL, verified against the
    system CAs), which is how laredo-server serves gRPC; an insecure channel otherwise (a plaintext
    h2 proxy, this project's fan-out server without TLS).

    Every stream gets its own channel on a private subchannel pool, i.e. its own TCP connection:
    after a GoAway the new stream must be able to land on another instance, which a connection
    multiplexed with the draining stream never would behind a connection-level balancer.
    """

    name = "grpc"

    def __init__(self, url: str, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 tls: ClientTls | None = None) -> None:
        parts = urlsplit(url if "://" in url else f"grpc://{url}")
        self._host, self._port = parts.hostname or "localhost", parts.port or DEFAULT_PORT
        self._target = f"{self._host}:{self._port}"
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_frame_bytes),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self._tls = tls if tls is not None else ClientTls() if parts.scheme in ("grpcs", "https") else None
        self._credentials = self._tls.grpc_credentials() if self._tls is not None else None
        if self._tls is not None and self._tls.server_name:
            self._options.append(("grpc.ssl_target_name_override", self._tls.server_name))

    def _tls_error(self, details: str) -> TlsError | None:
        return None if self._tls is None else grpc_tls_failure(details, self._host, self._port, self._tls)

    def open(self, request: pb.SyncRequest) -> GrpcStream:
        if self._credentials is None:
            channel = grpc.insecure_channel(self._target, options=self._options)
        else:
            channel = grpc.secure_channel(self._target, self._credentials, options=self._options)
        sync = channel.unary_stream(
            SYNC_PATH,
            request_serializer=pb.SyncRequest.SerializeToString,
            response_deserializer=pb.SyncResponse.FromString,
        )
        return GrpcStream(channel, sync(request), self._tls_error)

    def close(self) -> None:
        """Nothing shared: every stream owns its channel."""


def make_transport(url: str, protocol: str, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                   tls: ClientTls | None = None) -> Transport:
    """The transport for `protocol` (`connect`, the default laredo-server speaks, or `grpc`), over
    TLS when `tls` is given (a TlsError if its files cannot be used)."""
    if protocol == "connect":
        return ConnectTransport(url, max_frame_bytes=max_frame_bytes, tls=tls)
    if protocol == "grpc":
        return GrpcTransport(url, max_frame_bytes=max_frame_bytes, tls=tls)
    raise ValueError(f"unknown laredo protocol {protocol!r}; expected connect or grpc")
