"""Fixtures: fan-out servers and laredo clients that are always torn down, on both transports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from resources.subscribers.fanout_server import FanoutServer, Listener, SyncHandler, run_fanout_server, start_listener
from resources.subscribers.laredo import LaredoSubscriber
from tests.fanout.support import Collector, ScriptedSource

ROWS = [{"id": i, "tenant": 1 + i % 2, "name": f"row-{i}"} for i in range(1, 9)]


@pytest.fixture(params=["connect", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def source() -> ScriptedSource:
    return ScriptedSource(ROWS)


@pytest.fixture
def servers(protocol: str) -> Iterator[Callable[..., FanoutServer]]:
    started: list[FanoutServer] = []

    def start(src: ScriptedSource, **kwargs: Any) -> FanoutServer:
        kwargs.setdefault("heartbeat_interval", 0.2)
        server = run_fanout_server(src, "public", "items", protocol=protocol, ready_timeout=10, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def listeners(protocol: str) -> Iterator[Callable[[SyncHandler], Listener]]:
    started: list[Listener] = []

    def start(handler: SyncHandler) -> Listener:
        listener = start_listener(protocol, handler)
        started.append(listener)
        return listener

    yield start
    for listener in started:
        listener.stop()


@pytest.fixture
def clients(protocol: str) -> Iterator[Callable[..., Collector]]:
    started: list[Collector] = []

    def start(url: str, *, start_at: str | None = None, table: str = "items", **kwargs: Any) -> Collector:
        kwargs.setdefault("heartbeat_timeout", 5.0)
        subscriber = LaredoSubscriber(url, "public", table, protocol=protocol, **kwargs)
        collector = Collector(subscriber, start_at)
        started.append(collector)
        return collector

    yield start
    for collector in started:
        collector.stop()
