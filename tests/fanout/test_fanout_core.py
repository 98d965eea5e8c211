"""The fan-out server's journal coverage, lag-out, drain and `serve(config)`, driven directly."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.connect_framing import CONTENT_TYPE, FrameDecoder, encode_frame, parse_end_stream
from resources.subscribers.events import ResyncEnd, TxEnd
from resources.subscribers.fanout_core import FanoutCore
from resources.subscribers.fanout_server import FanoutConfig, FanoutServer, serve, start_listener
from resources.subscribers.laredo import LaredoSubscriber
from resources.subscribers.replication_wire import SYNC_PATH, Code, StatusError
from snapshot_assets.archive.positions import compare_lsn
from tests.fanout.support import Collector, ScriptedSource

ROWS = [{"id": i, "tenant": 1, "name": f"r{i}"} for i in range(1, 4)]


@pytest.fixture
def core_factory() -> Iterator[type[FanoutCore]]:
    cores: list[FanoutCore] = []

    class _Core(FanoutCore):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            cores.append(self)
            self.start()
            assert self.wait_ready(5)

    yield _Core
    for core in cores:
        core.stop()


def _wait_head(core: FanoutCore, position: str) -> None:
    for _ in range(200):
        head = core.stats()["head"]
        if isinstance(head, str) and compare_lsn(head, position) >= 0:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"head never reached {position}")


def _handshake(core: FanoutCore, **request: object) -> pb.SyncHandshake:
    stream = core.sync(pb.SyncRequest(schema="public", table="items", **request), lambda: True)  # type: ignore[arg-type]
    first = next(stream)
    stream.close()
    return first.handshake


def test_resume_coverage(core_factory: type[FanoutCore]) -> None:
    source = ScriptedSource(ROWS)
    core = core_factory(source, "public", "items", journal_size=3)
    initial = source.head
    positions = [source.insert(10 + i) for i in range(5)]
    _wait_head(core, positions[-1])
    full, delta = pb.SYNC_MODE_FULL_SNAPSHOT, pb.SYNC_MODE_DELTA
    assert _handshake(core, last_known_source_position=initial).mode == full  # pruned away
    assert _handshake(core, last_known_source_position=positions[1]).mode == delta  # newest pruned: covered
    assert _handshake(core, last_known_source_position=positions[0]).mode == full
    handshake = _handshake(core, last_known_source_position=positions[3])
    assert (handshake.mode, handshake.resume_from_sequence) == (delta, 4)
    assert _handshake(core, last_known_source_position="FF/0").mode == full  # ahead of the server
    assert _handshake(core, last_known_sequence=2).mode == delta
    assert _handshake(core, last_known_sequence=1).mode == full
    assert [c.column_name for c in _handshake(core).columns] == ["id", "tenant", "name"]


def test_errors_before_the_stream(core_factory: type[FanoutCore]) -> None:
    core = core_factory(ScriptedSource(ROWS), "public", "items", max_clients=1)

    def first_error(**request: object) -> StatusError:
        with pytest.raises(StatusError) as info:
            next(core.sync(pb.SyncRequest(**request), lambda: True))  # type: ignore[arg-type]
        return info.value

    assert first_error(schema="public").code is Code.INVALID_ARGUMENT
    assert first_error(schema="public", table="other").message == "no fan-out target for public.other"
    bad = first_error(schema="public", table="items", filters=[pb.FieldPredicate(field="tenant")])
    assert bad.code is Code.INVALID_ARGUMENT and "match condition" in bad.message
    held = core.sync(pb.SyncRequest(schema="public", table="items"), lambda: True)
    next(held)
    assert first_error(schema="public", table="items").code is Code.RESOURCE_EXHAUSTED
    held.close()
    next(core.sync(pb.SyncRequest(schema="public", table="items"), lambda: True))


def test_a_client_that_falls_behind_the_journal_is_cut_off(core_factory: type[FanoutCore]) -> None:
    source = ScriptedSource(ROWS)
    core = core_factory(source, "public", "items", journal_size=2, heartbeat_interval=30)
    stream = core.sync(pb.SyncRequest(schema="public", table="items"), lambda: True)
    kinds = [next(stream).WhichOneof("message") for _ in range(6)]
    assert kinds == ["handshake", "snapshot_begin", "snapshot_row", "snapshot_row", "snapshot_row", "snapshot_end"]
    last = [source.insert(10 + i) for i in range(4)][-1]
    _wait_head(core, last)
    with pytest.raises(StatusError, match="fell behind the journal") as info:
        next(stream)
    assert info.value.code is Code.UNAVAILABLE


def test_go_away_then_the_stream_ends_at_the_deadline(core_factory: type[FanoutCore]) -> None:
    core = core_factory(ScriptedSource(ROWS), "public", "items", heartbeat_interval=30)
    stream = core.sync(pb.SyncRequest(schema="public", table="items"), lambda: True)
    for _ in range(6):
        next(stream)
    core.go_away("admin", deadline_s=0.2)
    go_away = next(stream).go_away
    assert go_away.reason == "admin" and go_away.drain_deadline_unix_ms > 0
    assert list(stream) == []  # ends cleanly once the deadline passes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_fanout_config_from_mapping() -> None:
    cfg = FanoutConfig.from_mapping({"source": {"schema": "app", "table": "users"},
                                     "fanout": {"port": 4100, "grpc_port": 4101, "max_clients": 5}})
    assert (cfg.schema, cfg.table, cfg.max_clients) == ("app", "users", 5)
    assert cfg.endpoints() == [("connect", "0.0.0.0", 4100), ("grpc", "0.0.0.0", 4101)]
    with pytest.raises(ValueError, match="needs the table"):
        FanoutConfig.from_mapping({"fanout": {}})
    with pytest.raises(ValueError, match="serves nothing"):
        FanoutConfig("s", "t", connect=False).endpoints()


def test_serve_until_stopped_then_drain(protocol: str) -> None:
    source = ScriptedSource(ROWS)
    cfg = FanoutConfig("public", "items", host="127.0.0.1", heartbeat_interval=0.2, drain_timeout=1.0,
                       port=_free_port() if protocol == "connect" else 0, connect=protocol == "connect",
                       grpc_port=_free_port() if protocol == "grpc" else 0)
    stop = threading.Event()
    ready: list[FanoutServer] = []
    thread = threading.Thread(target=serve, args=(cfg, source), kwargs={"stop": stop, "on_ready": ready.append},
                              daemon=True)
    thread.start()
    for _ in range(100):
        if ready:
            break
        threading.Event().wait(0.05)
    server = ready[0]
    client = Collector(LaredoSubscriber(server.url, "public", "items", protocol=protocol, heartbeat_timeout=5))
    try:
        client.wait(lambda ev: any(isinstance(e, ResyncEnd) for e in ev))
        position = source.insert(50)
        client.wait(lambda ev: any(isinstance(e, TxEnd) and e.position == position for e in ev))
        stop.set()  # what SIGTERM does
        thread.join(5)
        assert not thread.is_alive()
        assert server.core.client_count() == 0
    finally:
        client.stop()
        stop.set()


def test_connect_listener_speaks_http_properly(core_factory: type[FanoutCore]) -> None:
    """Chunked request bodies (what streaming Connect clients send), and refusals outside the protocol."""
    core = core_factory(ScriptedSource(ROWS), "public", "items")
    listener = start_listener("connect", core.sync)
    try:
        def post(path: str, content_type: str, body: bytes, *, chunked: bool = False) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", listener.port, timeout=5)
            payload: bytes | Iterator[bytes] = iter([body[:3], body[3:]]) if chunked else body
            conn.request("POST", path, body=payload, headers={"Content-Type": content_type},
                         encode_chunked=chunked)
            response = conn.getresponse()
            status = response.status
            data = response.read1(65536) if status == 200 else response.read()
            conn.close()
            return status, data

        request = encode_frame(pb.SyncRequest(schema="public", table="items").SerializeToString())
        status, data = post(SYNC_PATH, CONTENT_TYPE, request, chunked=True)
        first = next(FrameDecoder().feed(data))
        assert status == 200 and pb.SyncResponse.FromString(first.payload).WhichOneof("message") == "handshake"
        assert post("/other.Service/Sync", CONTENT_TYPE, request)[0] == 404
        assert post(SYNC_PATH, "application/json", request)[0] == 415
        status, data = post(SYNC_PATH, CONTENT_TYPE, b"\x00\x00\x00\x00\x05abc")
        end = parse_end_stream(next(FrameDecoder().feed(data)).payload)
        assert status == 200 and end.error is not None and end.error.code is Code.INVALID_ARGUMENT
    finally:
        listener.stop()
