"""Capture tests: a real gRPC server (in process, or a `capture-serve` subprocess) and real clients."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from resources.capture.app import CaptureApp
from resources.capture.settings import BufferSettings, CaptureSettings, PageSettings, StorageSettings
from resources.proto.prism.interfaces import pubsub_basic_pb2 as pb
from resources.proto.prism.interfaces import pubsub_basic_pb2_grpc as pb_grpc


def settings_for(tmp_path: Path, *, destination: dict[str, Any] | None = None, **buffer: Any) -> CaptureSettings:
    """Small, fast settings: a local destination under `tmp_path` unless one is given."""
    return CaptureSettings(
        buffer=BufferSettings(path=str(tmp_path / "buffer"), **{"max_age_seconds": 3600.0, **buffer}),
        page=PageSettings(format="protobuf", compression="gzip"),
        storage=StorageSettings(destination=destination or {"type": "local", "path": str(tmp_path / "pages")},
                                key_template="pages/{date}/{writer_id}/{sequence}.pb.gz",
                                retry_backoff=0.05, retry_for=2.0),
        port=0)


def with_page(settings: CaptureSettings, **page: Any) -> CaptureSettings:
    return replace(settings, page=replace(settings.page, **page))


class Running:
    def __init__(self, app: CaptureApp, port: int) -> None:
        self.app, self.port = app, port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.PubSubBasicInterfaceStub(self.channel)

    def publish(self, topic: str, payload: bytes, **attributes: str) -> pb.PublishResponse:
        response: pb.PublishResponse = self.stub.Publish(
            pb.PublishRequest(topic=topic, payload=payload, attributes=attributes), timeout=30)
        return response

    def stop(self) -> None:
        self.channel.close()
        self.app.stop(grace=1)


@pytest.fixture
def serve() -> Iterator[Callable[[CaptureSettings], Running]]:
    started: list[Running] = []

    def start(settings: CaptureSettings) -> Running:
        app = CaptureApp(settings)
        running = Running(app, app.start(0, host="127.0.0.1"))
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def counter(app: CaptureApp, name: str) -> float:
    """A counter of the app's metrics registry, as Prometheus would scrape it (`name` without `_total`)."""
    return app.metrics.registry.get_sample_value(f"snapshotter_{name}_total") or 0.0


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
