"""RFC-023's metrics for the capture service, on a registry of its own (one per service instance).

Counters and histograms are updated where things happen (flush.py, buffer.py, index.py); the
per-writer buffer gauges are read from the buffer at scrape time (`watch_buffers`), so they are
never stale. `snapshot()` gives the same numbers as plain values for health answers and tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PAGE_SIZE_BUCKETS = tuple(float(2**n) for n in range(10, 31, 2))  # 1 KiB .. 1 GiB


@dataclass(frozen=True)
class WriterGauge:
    size_bytes: int
    event_count: int
    age_seconds: float


_GAUGES = (("snapshotter_buffer_size_bytes", "Bytes buffered per writer, not yet in a page.", "size_bytes"),
           ("snapshotter_buffer_event_count", "Events buffered per writer.", "event_count"),
           ("snapshotter_buffer_age_seconds", "Age of the oldest buffered event per writer.", "age_seconds"))


class _BufferCollector(Collector):
    def __init__(self, read: Callable[[], Mapping[str, WriterGauge]]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        writers = self.read()
        for name, doc, attr in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["writer_id"])
            for writer, gauge in sorted(writers.items()):
                family.add_metric([writer], float(getattr(gauge, attr)))
            yield family


class CaptureMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.page_writes = Counter("snapshotter_page_writes", "Pages written to storage.", registry=r)
        self.page_write_duration = Histogram("snapshotter_page_write_duration_seconds",
                                             "Time to write one page to storage.", registry=r)
        self.page_size = Histogram("snapshotter_page_size_bytes", "Stored (compressed) page sizes.",
                                   buckets=PAGE_SIZE_BUCKETS, registry=r)
        self.index_errors = Counter("snapshotter_index_publish_errors", "Index publish failures.", registry=r)
        self.storage_errors = Counter("snapshotter_storage_errors", "Storage backend errors.", registry=r)
        self.disconnects = Counter("snapshotter_session_disconnects", "Disconnect-triggered flushes.", registry=r)
        self.dead_letters = Counter("snapshotter_capture_dead_letter_pages",
                                    "Pages written to the dead-letter directory after storage retries ran out "
                                    "(alert on any).", registry=r)
        self._lock = threading.Lock()
        self.last_write_success: float | None = None
        self.last_index_success: float | None = None
        self._writes_ok = self._writes_failed = 0
        self._write_seconds = 0.0
        self._publishes_ok = self._publishes_failed = 0
        self._dead = 0

    def watch_buffers(self, read: Callable[[], Mapping[str, WriterGauge]]) -> None:
        self.registry.register(_BufferCollector(read))

    def storage_ok(self, seconds: float) -> None:
        self.page_write_duration.observe(seconds)
        with self._lock:
            self._writes_ok += 1
            self._write_seconds += seconds
            self.last_write_success = time.time()

    def page_written(self, size: int) -> None:
        self.page_writes.inc()
        self.page_size.observe(size)

    def storage_error(self) -> None:
        self.storage_errors.inc()
        with self._lock:
            self._writes_failed += 1

    def dead_lettered(self) -> None:
        self.dead_letters.inc()
        with self._lock:
            self._dead += 1

    def disconnect(self) -> None:
        self.disconnects.inc()

    def index_ok(self) -> None:
        with self._lock:
            self._publishes_ok += 1
            self.last_index_success = time.time()

    def index_error(self) -> None:
        self.index_errors.inc()
        with self._lock:
            self._publishes_failed += 1

    def storage_health(self) -> dict[str, Any]:
        with self._lock:
            tries = self._writes_ok + self._writes_failed
            return {"last_write_success": _iso(self.last_write_success),
                    "write_success_rate": self._writes_ok / tries if tries else 1.0,
                    "avg_write_latency_ms": 1000 * self._write_seconds / self._writes_ok if self._writes_ok else 0.0,
                    "dead_letter_pages": self._dead}

    def index_health(self) -> dict[str, Any]:
        with self._lock:
            tries = self._publishes_ok + self._publishes_failed
            return {"last_publish_success": _iso(self.last_index_success),
                    "publish_success_rate": self._publishes_ok / tries if tries else 1.0}


def _iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
