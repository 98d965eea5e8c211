"""Fuzz the fan-out server's Connect listener with what a client could send: mutated HTTP requests.

A real listener on loopback serves a handler that answers every Sync with one handshake. Each
example sends a valid request (plain or chunked body holding one enveloped SyncRequest) with byte
mutations, half-closes, and reads the answer with a deadline: the server must answer (an HTTP
error, or a stream whose end-of-stream frame carries the status) or close within a deadline, and
a valid request afterwards must still be served.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import CONTENT_TYPE, encode_frame
from resources.subscribers.fanout_core import Alive
from resources.subscribers.fanout_server import Listener, start_listener
from resources.subscribers.replication_wire import SYNC_PATH
from tests.fuzz.support import fuzz_settings, inputs

ANSWER_SECONDS = 10.0


def _handler(request: pb.SyncRequest, alive: Alive) -> Iterator[pb.SyncResponse]:
    yield pb.SyncResponse(handshake=pb.SyncHandshake(mode=pb.SYNC_MODE_FULL_SNAPSHOT))


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    server = start_listener("connect", _handler)
    yield server
    server.stop()


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    body = encode_frame(pb.SyncRequest(schema="public", table=draw(st.text(max_size=5))).SerializeToString())
    head = f"POST {SYNC_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\n"
    if draw(st.booleans()):
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    cut = draw(st.integers(0, len(body)))
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:cut], body[cut:]) if part)
    return f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"


def _exchange(port: int, request: bytes) -> bytes:
    """Send `request`, half-close, and read until the server closes (failing after the deadline)."""
    deadline = time.monotonic() + ANSWER_SECONDS
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_SECONDS) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
            assert time.monotonic() < deadline, "the server kept the connection open past the deadline"
    return bytes(received)


@fuzz_settings(120)
@given(inputs(requests()))
def test_any_request_gets_an_answer_and_the_server_survives(listener: Listener, request: bytes) -> None:
    _exchange(listener.port, request)  # any answer (http.server answers garbage in HTTP/0.9 style) or none
    healthy = _exchange(listener.port, _VALID)
    assert healthy.startswith(b"HTTP/1.1 200") and b"\x02" in healthy, healthy[:200]


_VALID = (f"POST {SYNC_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: 5\r\n\r\n"
          .encode() + encode_frame(b""))


@pytest.mark.parametrize("length", ["-1", "-99999", str(1 << 40)])
def test_a_content_length_outside_the_bound_is_refused(listener: Listener, length: str) -> None:
    request = (f"POST {SYNC_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\n"
               f"Content-Length: {length}\r\n\r\n").encode() + encode_frame(b"")
    answer = _exchange(listener.port, request)
    assert b"outside 0..1048576" in answer, answer[:300]
