"""S3Destination specifics against moto_server: lost responses, 412/409, missing bucket, dead endpoint.

Network faults are real: a loopback TCP proxy (FaultProxy) sits between the client and
moto_server and breaks one PUT in a chosen way, so botocore sees exactly what it would see when a
connection drops mid-request in production.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.exceptions import ClientError

from resources.destinations.base import CASConflict, DestinationError
from resources.destinations.s3 import MiB, S3Destination

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

pytestmark = pytest.mark.s3

KEY = "t/manifest.json"
OLD, NEW, OTHER = b'{"head":"0/10"}', b'{"head":"0/20"}', b'{"head":"0/99"}'
CONFLICT_409 = (
    b"HTTP/1.1 409 Conflict\r\nContent-Type: application/xml\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)
CONFLICT_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conflicting operation occurred.</Message></Error>"
)


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request (head + Content-Length body), as sent by botocore for a bytes body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"\r\nexpect: 100-continue" in head.lower():
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # botocore waits for it before the body
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _one_request_per_connection(request: bytes) -> bytes:
    """Ask upstream to close after answering, so the proxy relays until EOF and sees every request.

    `Expect` is dropped: the proxy already holds the whole body (and answered 100 itself).
    """
    head, _, body = request.partition(b"\r\n\r\n")
    lines = [
        line for line in head.split(b"\r\n") if not line.lower().startswith((b"connection:", b"expect:"))
    ]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body


def _exchange(upstream: tuple[str, int], request: bytes) -> bytes:
    """Send `request` to moto_server and return its whole response."""
    with socket.create_connection(upstream) as conn:
        conn.sendall(_one_request_per_connection(request))
        response = b""
        while chunk := conn.recv(65536):
            response += chunk
    return response


@dataclass
class FaultProxy:
    """A loopback proxy in front of moto_server that can break the next PUT requests.

    Faults (consumed in order, one per PUT):
      drop_response  forward the PUT, let moto apply it, then close without relaying the answer
      stall_response forward the PUT, let moto apply it, then never answer (client read timeout)
      drop_request   close the connection without forwarding the PUT
      conflict_409   answer 409 ConditionalRequestConflict without forwarding
    """

    upstream: tuple[str, int]
    faults: list[str] = field(default_factory=list)
    log: list[tuple[str, str]] = field(default_factory=list)  # (fault, moto's status line)
    after_fault: Callable[[], None] | None = None
    listener: socket.socket = field(init=False)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def close(self) -> None:
        self.listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            fault = self.faults.pop(0) if self.faults and request.startswith(b"PUT ") else None
            if fault is None:
                conn.sendall(_exchange(self.upstream, request))
                return
            status = self._inject(fault, conn, request)
            self.log.append((fault, status))
        if self.after_fault is not None:
            self.after_fault()

    def _inject(self, fault: str, conn: socket.socket, request: bytes) -> str:
        if fault in ("drop_response", "stall_response"):
            status = _exchange(self.upstream, request).split(b"\r\n", 1)[0].decode()
            if fault == "stall_response":
                conn.settimeout(10)
                conn.recv(1)  # returns when the client gives up and closes
            return status
        if fault == "conflict_409":
            conn.sendall(CONFLICT_409 % (len(CONFLICT_BODY), CONFLICT_BODY))
            return "HTTP/1.1 409 (injected)"
        assert fault == "drop_request", fault
        return "(not forwarded)"


@pytest.fixture
def proxy(moto_server: str) -> Iterator[FaultProxy]:
    parts = urlsplit(moto_server)
    fault_proxy = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 80))
    yield fault_proxy
    fault_proxy.close()


def _dest(
    bucket: str, endpoint: str, max_attempts: int = 3, connect_timeout: float = 1.0, read_timeout: float = 5.0
) -> S3Destination:
    """A destination with test-sized timeouts; `max_attempts` includes botocore's own retries."""
    return S3Destination(
        bucket,
        endpoint_url=endpoint,
        path_style=True,
        max_attempts=max_attempts,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _client(endpoint: str) -> S3Client:
    return boto3.client("s3", endpoint_url=endpoint)


# -- ambiguous failures ---------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["drop_response", "stall_response"])
@pytest.mark.parametrize("botocore_retries", [1, 3], ids=["no-sdk-retry", "sdk-retries"])
@pytest.mark.parametrize("create", [True, False], ids=["create", "update"])
def test_put_if_recovers_when_the_response_is_lost_after_the_write_landed(
    moto_server: str, s3_bucket: str, proxy: FaultProxy, fault: str, botocore_retries: int, create: bool
) -> None:
    """The PUT lands, then the connection drops / times out before the 200 arrives: still a success.

    With SDK retries botocore re-sends the PUT and gets 412 (from our own write); without them it
    raises ConnectionClosedError / ReadTimeoutError. Either way the object is re-read and recognised.
    """
    expected = None if create else _dest(s3_bucket, moto_server).put(KEY, OLD).revision
    proxy.faults.append(fault)

    dest = _dest(s3_bucket, proxy.url, max_attempts=botocore_retries, read_timeout=0.5)
    revision = dest.put_if(KEY, NEW, expected)

    assert proxy.log == [(fault, "HTTP/1.1 200 OK")]  # the write really landed
    got = _dest(s3_bucket, moto_server).get(KEY)
    assert got is not None and got.data == NEW and got.revision == revision


def test_put_if_retries_when_the_request_never_arrived(
    moto_server: str, s3_bucket: str, proxy: FaultProxy
) -> None:
    """Connection dropped before the PUT was forwarded: the old state is still there, so retry."""
    old = _dest(s3_bucket, moto_server).put(KEY, OLD).revision
    proxy.faults.append("drop_request")

    revision = _dest(s3_bucket, proxy.url, max_attempts=1).put_if(KEY, NEW, old)

    assert proxy.log == [("drop_request", "(not forwarded)")]
    got = _dest(s3_bucket, moto_server).get(KEY)
    assert got is not None and got.data == NEW and got.revision == revision


def test_put_if_is_a_conflict_when_another_writer_won_during_the_ambiguity(
    moto_server: str, s3_bucket: str, proxy: FaultProxy
) -> None:
    """Our response is lost and another writer replaces the object before we can look: CASConflict."""
    direct = _dest(s3_bucket, moto_server)
    proxy.faults.append("drop_response")

    def another_writer_replaces_it() -> None:
        direct.put(KEY, OTHER)

    proxy.after_fault = another_writer_replaces_it

    with pytest.raises(CASConflict):
        _dest(s3_bucket, proxy.url, max_attempts=3).put_if(KEY, NEW, None)

    got = direct.get(KEY)
    assert got is not None and got.data == OTHER


def test_put_if_retries_409_conditional_request_conflict(
    moto_server: str, s3_bucket: str, proxy: FaultProxy
) -> None:
    proxy.faults.extend(["conflict_409", "conflict_409"])
    revision = _dest(s3_bucket, proxy.url, max_attempts=1).put_if(KEY, NEW, None)
    assert [fault for fault, _ in proxy.log] == ["conflict_409", "conflict_409"]
    got = _dest(s3_bucket, moto_server).get(KEY)
    assert got is not None and got.data == NEW and got.revision == revision


def test_put_if_gives_up_on_endless_409_with_a_destination_error(s3_bucket: str, proxy: FaultProxy) -> None:
    proxy.faults.extend(["conflict_409"] * 3)
    dest = S3Destination(s3_bucket, endpoint_url=proxy.url, path_style=True, max_attempts=1, cas_attempts=3)
    with pytest.raises(DestinationError, match="no definite outcome after 3 attempts") as raised:
        dest.put_if(KEY, NEW, None)
    assert not isinstance(raised.value, CASConflict)


# -- conditional writes on moto_server ------------------------------------------------------------


WRONG_ETAG = '"0123456789abcdef0123456789abcdef"'


@pytest.mark.parametrize(
    "existing, expected",
    [(OLD, None), (OLD, WRONG_ETAG), (None, WRONG_ETAG)],
    ids=["if-none-match-on-existing", "if-match-wrong-etag", "if-match-on-missing"],
)
def test_precondition_failures_map_to_cas_conflict(
    moto_server: str, s3_bucket: str, existing: bytes | None, expected: str | None
) -> None:
    dest = _dest(s3_bucket, moto_server)
    if existing is not None:
        dest.put(KEY, existing)
    with pytest.raises(CASConflict) as raised:
        dest.put_if(KEY, NEW, expected)
    cause = raised.value.__cause__
    assert isinstance(cause, ClientError)  # 412, or 404 NoSuchKey for If-Match on a missing object
    assert cause.response["ResponseMetadata"]["HTTPStatusCode"] == (412 if existing else 404)
    got = dest.get(KEY)
    assert (got.data if got else None) == existing


def test_moto_server_enforces_if_match_and_if_none_match(moto_server: str, s3_bucket: str) -> None:
    """Documents the emulator: conditional PutObject is honoured (412), so the CAS tests are real."""
    client = _client(moto_server)
    etag = client.put_object(Bucket=s3_bucket, Key=KEY, Body=OLD)["ETag"]
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=s3_bucket, Key=KEY, Body=NEW, IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=s3_bucket, Key=KEY, Body=NEW, IfMatch=WRONG_ETAG)
    assert client.put_object(Bucket=s3_bucket, Key=KEY, Body=NEW, IfMatch=etag)["ETag"] != etag


# -- multipart ------------------------------------------------------------------------------------


def test_large_put_uses_multipart(moto_server: str, s3_bucket: str) -> None:
    dest = S3Destination(
        s3_bucket, endpoint_url=moto_server, path_style=True, multipart_threshold=5 * MiB, part_size=5 * MiB
    )
    data = bytes(range(256)) * (12 * MiB // 256)
    put = dest.put("big.jsonl", data)
    assert put.revision.endswith('-3"')  # S3's multipart ETag: md5-of-md5s "-" part count
    got = dest.get("big.jsonl")
    assert got is not None and got.data == data and put.size == len(data)
    assert _client(moto_server).list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_part_size_below_the_s3_minimum_is_rejected() -> None:
    with pytest.raises(ValueError, match="minimum part size"):
        S3Destination("b", part_size=MiB, client=boto3.client("s3"))


# -- failures are DestinationErrors that name bucket and key --------------------------------------


OPERATIONS: list[Callable[[S3Destination], object]] = [
    lambda d: d.put(KEY, b"x"),
    lambda d: d.get(KEY),
    lambda d: d.put_if(KEY, b"x", None),
    lambda d: list(d.list("t/")),
    lambda d: d.delete(KEY),
    lambda d: d.open_read(KEY),
]
OPERATION_IDS = ["put", "get", "put_if", "list", "delete", "open_read"]


@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATION_IDS)
def test_missing_bucket_is_a_destination_error_naming_it(
    moto_server: str, operation: Callable[[S3Destination], object]
) -> None:
    dest = _dest("no-such-bucket-here", moto_server)
    with pytest.raises(DestinationError, match="NoSuchBucket") as raised:
        operation(dest)
    assert "no-such-bucket-here" in str(raised.value)
    assert not isinstance(raised.value, CASConflict)


@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATION_IDS)
def test_unreachable_endpoint_fails_fast_with_a_destination_error(
    operation: Callable[[S3Destination], object],
) -> None:
    dest = _dest("bucket-x", f"http://127.0.0.1:{_closed_port()}", max_attempts=1, connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(DestinationError, match="unreachable") as raised:
        operation(dest)
    assert time.monotonic() - started < 3
    assert "bucket-x" in str(raised.value) and KEY.split("/")[0] in str(raised.value)


def test_uri_and_keys_are_relative_to_the_prefix(moto_server: str, s3_bucket: str) -> None:
    dest = S3Destination(s3_bucket, prefix="root/", endpoint_url=moto_server, path_style=True)
    put = dest.put("t/a.json", b"{}")
    assert put.uri == f"s3://{s3_bucket}/root/t/a.json" == dest.uri("t/a.json")
    assert [info.key for info in dest.list("t/")] == ["t/a.json"]
    assert _client(moto_server).head_object(Bucket=s3_bucket, Key="root/t/a.json")["ContentLength"] == 2
