"""The Publish API over a real gRPC server: acknowledgements, each flush trigger, bad input, replay."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from resources.capture.index import ObjectIndex
from resources.capture.pages import decode
from resources.capture.replay import replay
from resources.capture.settings import CaptureSettings
from resources.destinations.local import LocalDestination
from resources.proto.prism.interfaces import pubsub_basic_pb2 as pb
from tests.capture.conftest import Running, counter, settings_for, wait_for, with_page

Serve = Callable[[CaptureSettings], Running]


def _pages(root: Path) -> dict[str, list[tuple[int, bytes]]]:
    """Every stored page (not the object index) as [(sequence, payload)], by key."""
    dest = LocalDestination(str(root / "pages"))
    return {info.key: [(e.sequence, e.payload) for e in decode(dest.get(info.key).data).events]  # type: ignore[union-attr]
            for info in dest.list("pages/")}


def test_publish_acknowledges_in_sequence_and_max_events_cuts_pages(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path, max_events=3))
    acks = [running.publish("w1", f"e{i}".encode()) for i in range(7)]
    assert [a.sequence for a in acks] == list(range(7))
    assert [a.message_id for a in acks] == [f"w1:{i}" for i in range(7)]
    pages = wait_for(lambda: len(_pages(tmp_path)) == 2 and _pages(tmp_path), what="two full pages")
    assert [[s for s, _ in p] for p in pages.values()] == [[0, 1, 2], [3, 4, 5]]  # the 7th waits for more


def test_max_size_bytes_cuts_a_page(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path, max_size_bytes=1000))
    for i in range(7):
        running.publish("w", bytes([i]) * 400)
    pages = wait_for(lambda: len(_pages(tmp_path)) == 2 and _pages(tmp_path), what="pages cut by size")
    assert [[s for s, _ in p] for p in pages.values()] == [[0, 1, 2], [3, 4, 5]]  # 1200 >= 1000 bytes each


def test_a_quiet_writer_is_flushed_by_age_without_a_next_event(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path, max_age_seconds=0.5))
    started = time.monotonic()
    running.publish("quiet", b"only one")
    pages = wait_for(lambda: _pages(tmp_path), what="the age flush")
    assert list(pages.values()) == [[(0, b"only one")]]
    assert time.monotonic() - started < 5


def test_session_end_flushes_before_the_answer(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path))
    requests = [pb.PublishRequest(topic=t, payload=f"{t}{i}".encode()) for i in range(3) for t in ("a", "b")]
    response = running.stub.PublishStream(iter(requests), timeout=30)
    assert [r.sequence for r in response.responses] == [0, 0, 1, 1, 2, 2]
    pages = _pages(tmp_path)  # no waiting: flushed before the stream was answered
    assert sorted(p for page in pages.values() for _, p in page) == sorted(r.payload for r in requests)
    assert counter(running.app, "session_disconnects") == 2


def test_cancelled_session_is_flushed_too(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path))
    sent = threading.Event()
    release = threading.Event()

    def requests() -> Iterator[pb.PublishRequest]:
        yield pb.PublishRequest(topic="s", payload=b"before cancel")
        sent.set()
        release.wait(10)

    future = running.stub.PublishStream.future(requests(), timeout=30)
    wait_for(lambda: running.app.buffer.gauges().get("s") and running.app.buffer.gauges()["s"].event_count == 1,
             what="the event to be buffered")
    future.cancel()
    release.set()
    pages = wait_for(lambda: _pages(tmp_path), what="the flush of the cancelled session")
    assert list(pages.values()) == [[(0, b"before cancel")]]


def test_batch_publish_is_all_or_nothing(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path, max_payload_bytes=100))
    batch = pb.BatchPublishRequest(requests=[pb.PublishRequest(topic="x", payload=b"ok"),
                                             pb.PublishRequest(topic="x", payload=b"z" * 101)])
    with pytest.raises(grpc.RpcError) as err:
        running.stub.BatchPublish(batch, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "101 bytes is over the limit of 100" in err.value.details()
    ok = running.stub.BatchPublish(pb.BatchPublishRequest(requests=[pb.PublishRequest(topic="x", payload=b"ok"),
                                                                    pb.PublishRequest(topic="y", payload=b"ok")]))
    assert [(r.message_id, r.sequence) for r in ok.responses] == [("x:0", 0), ("y:0", 0)]  # nothing of the first


def test_payload_above_grpc_default_is_accepted_up_to_the_configured_limit(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path, max_payload_bytes=6 * 1024 * 1024))
    big = bytes(6 * 1024 * 1024)  # over gRPC's default 4 MiB message size
    assert running.publish("big", big).sequence == 0
    with pytest.raises(grpc.RpcError) as err:
        running.publish("big", big + b"x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_payload_bytes" in err.value.details()


def test_empty_topic_and_subscribe_are_refused(tmp_path: Path, serve: Serve) -> None:
    running = serve(settings_for(tmp_path))
    with pytest.raises(grpc.RpcError) as err:
        running.publish("", b"x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "topic" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        list(running.stub.Subscribe(pb.SubscribeRequest(topic="t"), timeout=30))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(("fmt", "compression"), [("protobuf", "zstd"), ("ndjson", "gzip"), ("ndjson", "none")])
def test_replay_returns_what_was_published_in_order_per_writer(tmp_path: Path, serve: Serve, fmt: str,
                                                               compression: str) -> None:
    settings = with_page(settings_for(tmp_path, max_events=4), format=fmt, compression=compression)
    running = serve(settings)
    published: dict[str, list[bytes]] = {"a": [], "b": []}
    for i in range(10):
        for writer in published:
            payload = f"{writer}-{i}".encode() + bytes(range(256))
            running.publish(writer, payload, n=str(i))
            published[writer].append(payload)
    running.stop()  # flushes the rest, drains the index queue
    for writer, payloads in published.items():
        events = list(replay(settings, writer))
        assert [e.payload for e in events] == payloads
        assert [e.sequence for e in events] == list(range(10))
        assert [e.attributes["n"] for e in events] == [str(i) for i in range(10)]
    index = ObjectIndex(LocalDestination(str(tmp_path / "pages")))
    assert [p["event_count"] for p in index.pages("a", None, None)] == [4, 4, 2]


def test_replay_time_range(tmp_path: Path, serve: Serve) -> None:
    settings = settings_for(tmp_path, max_events=2)
    running = serve(settings)
    times = []
    for i in range(6):
        times.append(running.publish("t", str(i).encode()))
        time.sleep(0.01)
    running.stop()
    events = list(replay(settings, "t"))
    middle = list(replay(settings, "t", events[2].timestamp, events[3].timestamp))
    assert [e.payload for e in middle] == [e.payload for e in events if
                                           events[2].timestamp <= e.timestamp <= events[3].timestamp]
    assert b"2" in [e.payload for e in middle] and b"0" not in [e.payload for e in middle]
