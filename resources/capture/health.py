"""The capture service's HTTP side: RFC-023's health answers and the Prometheus metrics.

`/health/buffers`, `/health/storage` and `/health/index` answer JSON in the RFC's shape (200 when
healthy, 503 when not: storage is unhealthy once a page was dead-lettered or the last write
failed; the index once records wait in the queue after a failed publish); `/metrics` is the
text exposition of the service's registry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from resources.capture.buffer import CaptureBuffer
from resources.capture.index import IndexQueue
from resources.capture.metrics import CaptureMetrics


class HealthAnswers:
    def __init__(self, buffer: CaptureBuffer, index: IndexQueue, metrics: CaptureMetrics, storage_name: str,
                 index_backend: str) -> None:
        self.buffer, self.index, self.metrics = buffer, index, metrics
        self.storage_name, self.index_backend = storage_name, index_backend

    def buffers(self) -> tuple[bool, dict[str, Any]]:
        answer = self.buffer.health()
        return answer["writers_exceeding_age_limit"] == 0, dict(answer)

    def storage(self) -> tuple[bool, dict[str, Any]]:
        answer = self.metrics.storage_health()
        healthy = answer["dead_letter_pages"] == 0 and answer["write_success_rate"] > 0
        return healthy, {"backend": self.storage_name, "status": "healthy" if healthy else "unhealthy", **answer}

    def index_(self) -> tuple[bool, dict[str, Any]]:
        answer = self.metrics.index_health()
        queued = self.index.pending()
        healthy = queued == 0 or answer["publish_success_rate"] == 1.0
        return healthy, {"backend": self.index_backend, "status": "healthy" if healthy else "unhealthy",
                         "queued_entries": queued, **answer}


def serve_http(answers: HealthAnswers, port: int, host: str = "0.0.0.0") -> tuple[ThreadingHTTPServer, int]:
    """Start the HTTP server in a thread; it and the port it listens on."""
    routes: dict[str, Callable[[], tuple[bool, dict[str, Any]]]] = {
        "/health/buffers": answers.buffers, "/health/storage": answers.storage, "/health/index": answers.index_}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(answers.metrics.registry), CONTENT_TYPE_LATEST)
                return
            route = routes.get(self.path)
            if route is None:
                self._send(404, b'{"error": "not found"}\n', "application/json")
                return
            healthy, body = route()
            self._send(200 if healthy else 503, (json.dumps(body, sort_keys=True) + "\n").encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # the service logs what matters itself

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="capture-http", daemon=True).start()
    return server, server.server_address[1]
