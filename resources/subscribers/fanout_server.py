"""The fan-out server: laredo's Sync protocol over Connect (HTTP/1.1) and gRPC (HTTP/2).

For users without laredo-server, and for the tests of the laredo client. The logic (replica,
journal, sessions) is `fanout_core.FanoutCore`; this module only carries its messages:

- Connect: a threaded `http.server` answering `POST /laredo.replication.v1.LaredoReplicationService/Sync`
  with `Content-Type: application/connect+proto`; the request is one enveloped SyncRequest (plain
  or chunked body), the response a chunked stream of frames, each flushed as it is produced, and
  the end-of-stream frame carries the status. A client that disconnects is noticed while the
  stream is idle (the socket turns readable at EOF), so its slot is freed without waiting for
  a write to fail.
- gRPC: a grpcio server with a generic handler for the same method path.
- TLS (`ServerTls`) on either: the server's certificate and key, and optionally the CA its clients'
  certificates must be signed by (mutual TLS); laredo-server serves gRPC only over TLS, so this is
  also how the client's TLS is tested.

Listeners take any `SyncHandler` (`(request, alive) -> Iterator[SyncResponse]`, raising
`StatusError`), which is how the tests put scripted protocol scenarios on both transports.

Entry points: `run_fanout_server(subscriber, schema, table, host, port, protocol)` returns a
running `FanoutServer` (`.url`, `.go_away()`, `.stop()`); `serve(config, subscriber)` runs one
until SIGINT/SIGTERM and drains with a GoAway, for `snapshotter fanout-serve --config X`.
"""

from __future__ import annotations

import contextlib
import logging
import select
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError

from resources import stop_signals
from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import (
    CONTENT_TYPE,
    FrameDecoder,
    FramingError,
    encode_frame,
    end_stream_frame,
)
from resources.subscribers.events import Subscriber
from resources.subscribers.fanout_core import Alive, FanoutCore
from resources.subscribers.replication_wire import DEFAULT_PORT, SERVICE, SYNC_METHOD, SYNC_PATH, Code, StatusError
from resources.subscribers.tls import ServerTls, TlsError

log = logging.getLogger(__name__)

_MAX_REQUEST_BYTES = 1 << 20


class SyncHandler(Protocol):
    def __call__(self, request: pb.SyncRequest, alive: Alive) -> Iterator[pb.SyncResponse]: ...


class Listener(Protocol):
    protocol: str
    host: str
    port: int
    secure: bool

    def stop(self, grace: float = 0.0) -> None: ...


# --- Connect over HTTP/1.1 ----------------------------------------------------------------------


class _ConnectHTTPServer(ThreadingHTTPServer):
    """With `context`, every accepted connection is TLS; its handshake runs in the connection's own
    thread (not in the accept loop, where one slow or hostile client would stall every other)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: SyncHandler, context: ssl.SSLContext | None) -> None:
        self.sync_handler = handler
        self.context = context
        super().__init__(address, _ConnectRequestHandler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.context is None:
            return sock, address
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                log.info("connect client %s: TLS handshake failed: %s", client_address[0], exc)
                return
        super().finish_request(request, client_address)


class _ConnectRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ConnectHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("connect %s: " + format, self.client_address[0], *args)

    def _plain(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline(64).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024).strip():
                        pass  # trailers
                    return b"".join(parts)
                total += size
                if size < 0 or total > _MAX_REQUEST_BYTES:
                    raise FramingError(f"request body chunk of {size} bytes: the body must be 0..{_MAX_REQUEST_BYTES} "
                                       "bytes")
                parts.append(self.rfile.read(size))
                self.rfile.readline(8)
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= _MAX_REQUEST_BYTES:
            raise FramingError(f"request body of {length} bytes is outside 0..{_MAX_REQUEST_BYTES}")
        return self.rfile.read(length)

    def _request(self) -> pb.SyncRequest:
        decoder = FrameDecoder(_MAX_REQUEST_BYTES)
        frames = list(decoder.feed(self._read_body()))
        decoder.finish()
        if len(frames) != 1 or frames[0].flags:
            raise FramingError(f"expected one plain request frame, got {len(frames)}")
        request = pb.SyncRequest()
        try:
            request.ParseFromString(frames[0].payload)
        except DecodeError as exc:
            raise FramingError(f"request is not a SyncRequest: {exc}") from None
        return request

    def _alive(self) -> bool:
        # Peek at the raw socket, under TLS too (an SSLSocket refuses recv flags): EOF is EOF.
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or socket.socket.recv(self.connection, 1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        if self.path.split("?")[0] != SYNC_PATH:
            self._plain(404, f"unknown procedure {self.path}")
            return
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != CONTENT_TYPE:
            self._plain(415, f"Content-Type must be {CONTENT_TYPE}")
            return
        error: StatusError | None = None
        try:
            request: pb.SyncRequest | None = self._request()
        except (FramingError, ValueError) as exc:
            request, error = None, StatusError(Code.INVALID_ARGUMENT, str(exc))
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            if request is not None:
                error = self._stream(request)
            self._chunk(end_stream_frame(error))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            log.debug("connect client %s went away", self.client_address[0])

    def _stream(self, request: pb.SyncRequest) -> StatusError | None:
        messages = self.server.sync_handler(request, self._alive)
        try:
            for message in messages:
                self._chunk(encode_frame(message.SerializeToString()))
        except StatusError as exc:
            return exc
        except OSError:
            raise
        except Exception as exc:
            log.exception("Sync handler failed")
            return StatusError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            if hasattr(messages, "close"):
                messages.close()
        return None


class ConnectListener:
    protocol = "connect"

    def __init__(self, handler: SyncHandler, host: str, port: int, tls: ServerTls | None = None) -> None:
        self._server = _ConnectHTTPServer((host, port), handler, tls.ssl_context() if tls is not None else None)
        self.secure = tls is not None
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"fanout-connect-{self.port}", daemon=True)
        self._thread.start()

    def stop(self, grace: float = 0.0) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- gRPC over HTTP/2 ---------------------------------------------------------------------------

_GRPC_STATUS: dict[Code, Any] = {Code.parse(code.name): code for code in grpc.StatusCode}


class GrpcListener:
    protocol = "grpc"

    def __init__(self, handler: SyncHandler, host: str, port: int, *, max_streams: int = 100,
                 tls: ServerTls | None = None) -> None:
        self._handler = handler
        credentials = tls.grpc_credentials() if tls is not None else None
        self._server = grpc.server(ThreadPoolExecutor(max_workers=max_streams + 8,
                                                      thread_name_prefix="fanout-grpc"))
        method = grpc.unary_stream_rpc_method_handler(
            self._sync,
            request_deserializer=pb.SyncRequest.FromString,
            response_serializer=pb.SyncResponse.SerializeToString,
        )
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {SYNC_METHOD: method}),))
        self.host = host
        self.secure = tls is not None
        if credentials is None:
            self.port = int(self._server.add_insecure_port(f"{host}:{port}"))
        else:
            self.port = int(self._server.add_secure_port(f"{host}:{port}", credentials))
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self._server.start()

    def _sync(self, request: pb.SyncRequest, context: Any) -> Iterator[pb.SyncResponse]:
        try:
            yield from self._handler(request, context.is_active)
        except StatusError as exc:
            context.set_code(_GRPC_STATUS.get(exc.code, grpc.StatusCode.UNKNOWN))
            context.set_details(exc.message)

    def stop(self, grace: float = 0.0) -> None:
        self._server.stop(grace).wait()


def start_listener(protocol: str, handler: SyncHandler, host: str = "127.0.0.1", port: int = 0,
                   *, max_streams: int = 100, tls: ServerTls | None = None) -> Listener:
    """Serve `handler` on one transport (over TLS with `tls`); port 0 picks a free port (see `.port`)."""
    if protocol == "connect":
        return ConnectListener(handler, host, port, tls)
    if protocol == "grpc":
        return GrpcListener(handler, host, port, max_streams=max_streams, tls=tls)
    raise ValueError(f"unknown protocol {protocol!r}; expected connect or grpc")


_SCHEMES = {("connect", False): "http", ("connect", True): "https", ("grpc", False): "grpc", ("grpc", True): "grpcs"}


def listener_url(listener: Listener) -> str:
    host = "127.0.0.1" if listener.host in ("", "0.0.0.0") else listener.host
    return f"{_SCHEMES[listener.protocol, listener.secure]}://{host}:{listener.port}"


# --- the server ---------------------------------------------------------------------------------


class FanoutServer:
    """A running fan-out server: one core, one listener per transport."""

    def __init__(self, core: FanoutCore, listeners: Sequence[Listener]) -> None:
        self.core = core
        self.listeners = tuple(listeners)
        self._stopped = False

    @property
    def url(self) -> str:
        """The first listener's URL (`http://host:port` for Connect, `grpc://host:port` for gRPC)."""
        return listener_url(self.listeners[0])

    @property
    def port(self) -> int:
        return self.listeners[0].port

    def go_away(self, reason: str = "admin", deadline_s: float | None = 30.0) -> None:
        self.core.go_away(reason, deadline_s)

    def stats(self) -> dict[str, object]:
        return self.core.stats()

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop serving; with `drain_s` > 0 send GoAway("draining") first and wait up to that long."""
        if self._stopped:
            return
        self._stopped = True
        if drain_s > 0:
            self.core.go_away("draining", drain_s)
            self.core.wait_clients_gone(drain_s + 1.0)
        self.core.stop()
        for listener in self.listeners:
            listener.stop()

    def __enter__(self) -> FanoutServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_fanout_server(core: FanoutCore, endpoints: Sequence[tuple[str, str, int]],
                        *, ready_timeout: float | None = 60.0, tls: ServerTls | None = None) -> FanoutServer:
    """Start `core` and serve it on every (protocol, host, port), over TLS with `tls`; waits for
    the initial load."""
    core.start()
    if ready_timeout is not None and not core.wait_ready(ready_timeout):
        core.stop()
        raise RuntimeError(f"fan-out {core.name}: initial load not ready within {ready_timeout}s"
                           + (f": {core.failure}" if core.failure else ""))
    listeners: list[Listener] = []
    try:
        for protocol, host, port in endpoints:
            listeners.append(start_listener(protocol, core.sync, host, port, max_streams=core.max_clients, tls=tls))
    except BaseException:
        for listener in listeners:
            listener.stop()
        core.stop()
        raise
    return FanoutServer(core, listeners)


def run_fanout_server(subscriber: Subscriber, schema: str, table: str, host: str = "127.0.0.1",
                      port: int = 0, protocol: str = "connect", *, journal_size: int = 10_000,
                      heartbeat_interval: float = 5.0, max_clients: int = 100,
                      ready_timeout: float | None = 60.0, tls: ServerTls | None = None) -> FanoutServer:
    """Serve `schema.table` from `subscriber` on one transport; returns once the table is loaded."""
    core = FanoutCore(subscriber, schema, table, journal_size=journal_size,
                      heartbeat_interval=heartbeat_interval, max_clients=max_clients)
    return start_fanout_server(core, [(protocol, host, port)], ready_timeout=ready_timeout, tls=tls)


# --- serve(config) ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FanoutConfig:
    """The `fanout { ... }` section (and the table to serve, from `source`).

    `port` serves Connect over HTTP/1.1 (laredo's default 4002); `grpc_port` > 0 also serves gRPC
    over HTTP/2; `connect = false` turns Connect off. `tls` (`fanout.tls { cert_file, key_file,
    client_ca_file }`) serves both over TLS; with `client_ca_file`, clients must present a
    certificate signed by it (mutual TLS).
    """

    schema: str
    table: str
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    connect: bool = True
    grpc_port: int = 0
    journal_size: int = 10_000
    heartbeat_interval: float = 5.0
    max_clients: int = 100
    drain_timeout: float = 30.0
    tls: ServerTls | None = None

    @staticmethod
    def from_mapping(config: Mapping[str, Any]) -> FanoutConfig:
        fanout = config.get("fanout") or {}
        source = config.get("source") or {}
        schema = str(fanout.get("schema") or source.get("schema") or "public")
        table = str(fanout.get("table") or source.get("table") or "")
        if not table:
            raise ValueError("fan-out config needs the table to serve (source.table or fanout.table)")
        return FanoutConfig(
            schema=schema, table=table,
            host=str(fanout.get("host", "0.0.0.0")),
            port=int(fanout.get("port", DEFAULT_PORT)),
            connect=bool(fanout.get("connect", True)),
            grpc_port=int(fanout.get("grpc_port", 0)),
            journal_size=int(fanout.get("journal_size", 10_000)),
            heartbeat_interval=float(fanout.get("heartbeat_interval", 5.0)),
            max_clients=int(fanout.get("max_clients", 100)),
            drain_timeout=float(fanout.get("drain_timeout", 30.0)),
            tls=_server_tls(fanout.get("tls")),
        )

    def endpoints(self) -> list[tuple[str, str, int]]:
        endpoints = [("connect", self.host, self.port)] if self.connect else []
        if self.grpc_port > 0:
            endpoints.append(("grpc", self.host, self.grpc_port))
        if not endpoints:
            raise ValueError("fan-out config serves nothing: enable connect or set grpc_port")
        return endpoints


def _server_tls(spec: Mapping[str, Any] | None) -> ServerTls | None:
    if not spec:
        return None
    unknown = sorted(set(spec) - set(ServerTls.KEYS))
    if unknown:
        raise ValueError(f"fanout.tls: unknown key {unknown[0]!r}; known: {', '.join(ServerTls.KEYS)}")
    try:
        return ServerTls(**{key: str(spec.get(key) or "") for key in ServerTls.KEYS})
    except TlsError as exc:
        raise ValueError(f"fanout.tls: {exc}") from None


def serve(config: FanoutConfig | Mapping[str, Any], subscriber: Subscriber | None = None,
          *, stop: threading.Event | None = None,
          on_ready: Callable[[FanoutServer], None] | None = None) -> None:
    """Run a fan-out server until SIGINT/SIGTERM (or `stop`), then drain with a GoAway.

    `subscriber` is the table's source; the CLI builds it from `config.source` (the subscriber
    factory lives with the sources, not here).
    """
    cfg = config if isinstance(config, FanoutConfig) else FanoutConfig.from_mapping(config)
    if subscriber is None:
        raise ValueError("serve() needs the source subscriber (build it from config.source)")
    core = FanoutCore(subscriber, cfg.schema, cfg.table, journal_size=cfg.journal_size,
                      heartbeat_interval=cfg.heartbeat_interval, max_clients=cfg.max_clients)
    server = start_fanout_server(core, cfg.endpoints(), ready_timeout=None, tls=cfg.tls)
    done = stop or threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous.update(stop_signals.install(done))
    try:
        for listener in server.listeners:
            log.info("fan-out %s.%s serving %s on %s", cfg.schema, cfg.table, listener.protocol,
                     listener_url(listener))
        if on_ready is not None:
            on_ready(server)
        stop_signals.wait_for(done)
    finally:
        log.info("fan-out %s.%s draining (up to %.0fs)", cfg.schema, cfg.table, cfg.drain_timeout)
        server.stop(drain_s=cfg.drain_timeout)
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
