"""The laredo client against raw Connect protocol bytes from a hand-written HTTP handler.

Not this project's server: every byte on the wire is written here, so the client is held to the
Connect protocol itself (envelopes, end-of-stream JSON, HTTP status) rather than to whatever the
fan-out server happens to produce.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.errors import (
    PositionRegression,
    ProtocolError,
    SourceConfigError,
    UnknownTable,
)
from resources.subscribers.events import ChangeEvent, ResyncEnd, TxEnd
from resources.subscribers.laredo import LaredoSubscriber
from snapshot_assets.archive.changes import Action
from tests.fanout.support import Collector, Sleeps, msg_entry, msg_handshake, msg_snapshot

ROWS = [{"id": 1, "tenant": 1, "name": "a"}, {"id": 2, "tenant": 2, "name": "b"}]
Script = Callable[["_Handler"], None]


def frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def msg(message: pb.SyncResponse) -> bytes:
    return frame(message.SerializeToString())


def end(json_text: str = "{}") -> bytes:
    return frame(json_text.encode(), 0x02)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _RawServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, dict(self.headers), body))
        scripts = self.server.scripts
        script = scripts[min(len(self.server.requests), len(scripts)) - 1]
        script(self)
        self.close_connection = True

    def begin_stream(self) -> None:
        """Status line and headers; the body runs until the connection closes (no length, no chunks)."""
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+proto\r\nConnection: close\r\n\r\n")
        self.wfile.flush()

    def send(self, data: bytes, *, piece: int = 0, pause: float = 0.0) -> None:
        pieces = [data] if not piece else [data[i:i + piece] for i in range(0, len(data), piece)]
        for part in pieces:
            self.wfile.write(part)
            self.wfile.flush()
            if pause:
                time.sleep(pause)

    def hold(self, seconds: float = 10.0) -> None:
        """Keep the stream open until the client leaves."""
        end_at = time.monotonic() + seconds
        while time.monotonic() < end_at:
            try:
                if self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return
            except BlockingIOError:
                pass
            except OSError:
                return
            time.sleep(0.02)


class _RawServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        super().__init__(("127.0.0.1", 0), _Handler)


@pytest.fixture
def raw() -> Iterator[Callable[..., tuple[_RawServer, Collector, Sleeps]]]:
    made: list[tuple[_RawServer, Collector]] = []

    def start(*scripts: Script, **kwargs: object) -> tuple[_RawServer, Collector, Sleeps]:
        server = _RawServer(list(scripts))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        sleeps = Sleeps()
        subscriber = LaredoSubscriber(f"http://127.0.0.1:{server.server_address[1]}", "public", "items",
                                      heartbeat_timeout=5.0, sleep=sleeps, **kwargs)  # type: ignore[arg-type]
        collector = Collector(subscriber)
        made.append((server, collector))
        return server, collector, sleeps

    yield start
    for server, collector in made:
        collector.stop()
        server.shutdown()
        server.server_close()


def _stream(*parts: bytes, hold: bool = False, piece: int = 0, pause: float = 0.0) -> Script:
    def script(handler: _Handler) -> None:
        handler.begin_stream()
        handler.send(b"".join(parts), piece=piece, pause=pause)
        if hold:
            handler.hold()

    return script


def _http_error(status: int, text: str) -> Script:
    def script(handler: _Handler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(text)))
        handler.end_headers()
        handler.wfile.write(text.encode())

    return script


HELLO = msg(msg_handshake(pb.SYNC_MODE_FULL_SNAPSHOT)) + b"".join(msg(m) for m in msg_snapshot(5, ROWS))
NOT_FOUND = _stream(end('{"error":{"code":"not_found","message":"no fan-out target for public.items"}}'))


def test_request_is_one_enveloped_sync_request(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    server, client, _ = raw(NOT_FOUND)
    client.wait_error()
    path, headers, body = server.requests[0]
    assert path == "/laredo.replication.v1.LaredoReplicationService/Sync"
    assert headers["Content-Type"] == "application/connect+proto"
    flags, length = struct.unpack(">BI", body[:5])
    assert flags == 0 and length == len(body) - 5
    request = pb.SyncRequest.FromString(body[5:])
    assert (request.schema, request.table, request.client_id) == ("public", "items", "snapshotter-public.items")


def test_frames_split_across_tcp_reads(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    body = HELLO + msg(msg_entry(6, "0/100", 6)) + msg(msg_entry(7, "0/200", 7, Action.DELETE)) + end()
    server, client, sleeps = raw(_stream(body, piece=3, pause=0.001), _stream(hold=True))
    events = client.wait(lambda ev: any(isinstance(e, ChangeEvent) and e.position == "0/200" for e in ev))
    assert [e.position for e in events if isinstance(e, (ResyncEnd, TxEnd))] == ["0/000000FF", "0/100"]
    delete = events[-1]
    assert isinstance(delete, ChangeEvent) and delete.action is Action.DELETE and delete.old == {"id": 7}
    client.wait(lambda ev: len(server.requests) == 2)  # the clean end is followed by a reconnect
    assert sleeps.delays == [1.0]
    assert pb.SyncRequest.FromString(server.requests[1][2][5:]).last_known_source_position == "0/100"


def test_end_stream_error_not_found_is_permanent(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, sleeps = raw(NOT_FOUND)
    error = client.wait_error()
    assert isinstance(error, UnknownTable)
    assert str(error) == (f"public.items: laredo server {client.subscriber.url} (connect) returned NOT_FOUND: "
                          "no fan-out target for public.items")
    assert sleeps.delays == []


def test_end_stream_error_invalid_argument_is_permanent(
        raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, _ = raw(_stream(end('{"error":{"code":"invalid_argument","message":"schema and table are required"}}')))
    error = client.wait_error()
    assert isinstance(error, SourceConfigError) and "INVALID_ARGUMENT: schema and table are required" in str(error)


def test_end_stream_errors_unavailable_and_exhausted_are_retried(
        raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, sleeps = raw(
        _stream(end('{"error":{"code":"unavailable","message":"restarting"}}')),
        _stream(end('{"error":{"code":"resource_exhausted","message":"max clients reached"}}')),
        _http_error(503, "overloaded"),
        NOT_FOUND,
    )
    assert isinstance(client.wait_error(), UnknownTable)
    assert sleeps.delays == [1.0, 2.0, 4.0]


def test_malformed_frame_length_is_a_protocol_error(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, sleeps = raw(_stream(HELLO + struct.pack(">BI", 0, 0x7FFF_FFFF) + b"xx", hold=True))
    error = client.wait_error()
    assert isinstance(error, ProtocolError) and not error.transient
    assert "declares 2147483647 bytes" in str(error) and "public.items" in str(error)
    assert not any(isinstance(e, ResyncEnd) for e in client.events)  # nothing half-decoded escaped
    assert sleeps.delays == []


def test_unknown_frame_flags_are_a_protocol_error(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, _ = raw(_stream(frame(b"", 0x80), hold=True))
    error = client.wait_error()
    assert isinstance(error, ProtocolError) and "unknown flags 0x80" in str(error)


def test_truncated_frame_is_a_lost_connection(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]],
                                              caplog: pytest.LogCaptureFixture) -> None:
    _, client, sleeps = raw(_stream(HELLO + struct.pack(">BI", 0, 100) + b"0123456789"), NOT_FOUND)
    assert isinstance(client.wait_error(), UnknownTable)
    assert sleeps.delays == [1.0]  # retried once, then the permanent NOT_FOUND
    assert "lost mid-frame: stream ended inside a frame" in caplog.text


def test_row_that_is_not_an_object(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    begin = msg(pb.SyncResponse(snapshot_begin=pb.SnapshotBegin(sequence=1, row_count=1)))
    not_an_object = frame(b"\x1a\x02\x08\x05")  # snapshot_row { row: varint 5 } instead of a Struct
    _, client, _ = raw(_stream(msg(msg_handshake(pb.SYNC_MODE_FULL_SNAPSHOT)) + begin + not_an_object, hold=True))
    error = client.wait_error()
    assert isinstance(error, ProtocolError) and not error.transient
    assert "snapshot row 1 is not an object" in str(error)


def test_change_without_its_row_is_a_protocol_error(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    entry = pb.SyncResponse(journal_entry=pb.ReplicationJournalEntry(sequence=6, source_position="0/100",
                                                                     action="INSERT"))
    _, client, _ = raw(_stream(HELLO + msg(entry), hold=True))
    error = client.wait_error()
    assert isinstance(error, ProtocolError) and "INSERT entry 6 carries no new_values object" in str(error)


def test_payload_that_is_not_a_sync_response(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, _ = raw(_stream(frame(b"\xff\xff\xff\xff"), hold=True))
    error = client.wait_error()
    assert isinstance(error, ProtocolError) and "not a SyncResponse" in str(error)


def test_position_going_backwards(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    body = HELLO + msg(msg_entry(6, "0/200", 6)) + msg(msg_entry(7, "0/100", 7))
    _, client, _ = raw(_stream(body, hold=True))
    error = client.wait_error()
    assert isinstance(error, PositionRegression) and "0/100 goes back from 0/00000200" in str(error)
    assert not any(isinstance(e, TxEnd) for e in client.events)


def test_first_message_must_be_the_handshake(raw: Callable[..., tuple[_RawServer, Collector, Sleeps]]) -> None:
    _, client, _ = raw(_stream(msg(msg_entry(6, "0/200", 6)), hold=True))
    error = client.wait_error()
    assert isinstance(error, ProtocolError) and "journal_entry, not a handshake" in str(error)


def test_connection_refused_is_retried() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    holder: list[LaredoSubscriber] = []
    sleeps = Sleeps({3: lambda: holder[0].close()})
    holder.append(LaredoSubscriber(f"http://127.0.0.1:{port}", "public", "items", sleep=sleeps))
    client = Collector(holder[0])
    assert client.done.wait(10) and client.error is None
    assert sleeps.delays == [1.0, 2.0, 4.0]
    assert isinstance(holder[0].stats.last_error, str) and "refused" in holder[0].stats.last_error.lower()
