"""One capture service: the pieces of resources/capture wired together, started and stopped in order.

Start: the index publisher, then the buffer (recovery schedules the flush of what a crash left
durable but unflushed; sequences continue after it), then gRPC and HTTP. Stop: gRPC first (no new
publishes; in-flight ones finish), then every writer is flushed (once: a write that fails at
shutdown is not retried, its events stay in the durable log for the next start), then the index
queue drains.
"""

from __future__ import annotations

import logging
from http.server import ThreadingHTTPServer
from pathlib import Path

import grpc  # type: ignore[import-untyped]

from resources.aws_credentials import CredentialProfiles
from resources.capture.buffer import CaptureBuffer
from resources.capture.flush import PageStore
from resources.capture.health import HealthAnswers, serve_http
from resources.capture.index import IndexQueue, backends
from resources.capture.metrics import CaptureMetrics
from resources.capture.service import PubSubCapture, grpc_server, max_message_bytes
from resources.capture.settings import CaptureSettings
from resources.destinations.base import Destination
from resources.destinations.factory import build_destination

log = logging.getLogger(__name__)


class CaptureApp:
    def __init__(self, settings: CaptureSettings, destination: Destination | None = None,
                 profiles: CredentialProfiles | None = None) -> None:
        """`profiles`: the configuration's credentials, which an S3 destination's `credentials` names."""
        self.settings = settings
        self.destination = destination or build_destination(settings.storage.destination, profiles=profiles)
        self.metrics = CaptureMetrics()
        root = Path(settings.buffer.path)
        root.mkdir(parents=True, exist_ok=True)
        self.index = IndexQueue(root, backends(settings.index, self.destination), self.metrics,
                                settings.index.retry_backoff)
        self.store = PageStore(settings, self.destination, self.metrics)
        self.buffer = CaptureBuffer(settings, self.store, self.index, self.metrics)
        self.servicer = PubSubCapture(self.buffer)
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None

    def start(self, port: int | None = None, http_port: int | None = None, host: str = "0.0.0.0") -> int:
        """Recover, then serve; the gRPC port (and the HTTP one in `http_port_bound`)."""
        self.index.start()
        self.buffer.open()
        self._grpc, bound = grpc_server(self.servicer, self.settings.port if port is None else port, host,
                                        max_message=max_message_bytes(self.settings.buffer.max_payload_bytes))
        self.http_port_bound = 0
        if http_port is not None:
            answers = HealthAnswers(self.buffer, self.index, self.metrics, self.destination.name,
                                    self.settings.index.backend)
            self._http, self.http_port_bound = serve_http(answers, http_port, host)
        log.info("capture: serving PubSubBasicInterface on %s:%d", host, bound)
        return bound

    def stop(self, grace: float = 10.0) -> None:
        """Stop serving and flush every writer (a second call does nothing)."""
        if self._grpc is None:
            return
        self._grpc.stop(grace).wait()
        self._grpc = None
        self.servicer.close()
        self.store.stop.set()  # a failing write is tried once more, not retried for minutes: the log keeps it
        self.buffer.close(flush=True)
        self.index.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
