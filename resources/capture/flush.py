"""Writing one page: encode, name, put to the destination, retry with backoff, else dead-letter.

A page's key is fixed by its writer and first event (keys.py), so each retry, and a re-flush after
a crash, writes the same object: an overwrite, never a second copy. When the destination keeps
failing for `storage.retry_for` the page is written to the dead-letter directory (same key, plus
its metadata beside it) and counted in `snapshotter_capture_dead_letter_pages_total`, the alert
metric: the events leave the buffer, but only into a durable place an operator is told about.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from resources.capture.keys import page_key
from resources.capture.metrics import CaptureMetrics
from resources.capture.pages import encode, metadata_for
from resources.capture.settings import CaptureSettings
from resources.destinations.base import Destination, DestinationError
from resources.durable_files import write_atomic
from resources.proto.prism.snapshotter.page_pb2 import Event, PageMetadata

log = logging.getLogger(__name__)
_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class StoredPage:
    key: str
    metadata: PageMetadata
    storage_size_bytes: int
    format: str
    dead_lettered: bool

    def index_entry(self) -> dict[str, Any]:
        """The page's index record (RFC-023's index value, plus the last sequence for replay)."""
        m = self.metadata
        return {"page_key": self.key, "writer_id": m.writer_id, "page_sequence": m.page_sequence,
                "last_sequence": m.page_sequence + m.event_count - 1, "start_time": m.start_time,
                "end_time": m.end_time, "event_count": m.event_count, "page_size_bytes": m.page_size_bytes,
                "storage_size_bytes": self.storage_size_bytes, "format": self.format,
                "compression": m.compression}


class PageStore:
    """Turns a writer's events into a stored page (or a dead-lettered one)."""

    def __init__(self, settings: CaptureSettings, destination: Destination, metrics: CaptureMetrics,
                 stop: threading.Event | None = None) -> None:
        self.settings, self.destination, self.metrics = settings, destination, metrics
        self.stop = stop or threading.Event()
        self.dead_letter = Path(settings.storage.dead_letter or Path(settings.buffer.path) / "dead-letter")

    def store(self, writer_id: str, events: Sequence[Event]) -> StoredPage:
        page = self.settings.page
        meta = metadata_for(writer_id, events, page.compression, dict(page.tags))
        encoded = encode(meta, events, page.format, include_metadata=page.include_metadata)
        key = page_key(self.settings.storage.key_template, writer_id, events[0].sequence, events[0].timestamp)
        stored = StoredPage(key, encoded.metadata, len(encoded.data), page.format, dead_lettered=False)
        if self._put_with_retry(key, encoded.data):
            self.metrics.page_written(len(encoded.data))
            return stored
        self._dead_letter(stored, encoded.data)
        return StoredPage(key, encoded.metadata, len(encoded.data), page.format, dead_lettered=True)

    def _put_with_retry(self, key: str, data: bytes) -> bool:
        """True once the destination holds the page; False when `retry_for` ran out first."""
        storage = self.settings.storage
        deadline = time.monotonic() + storage.retry_for
        delay = storage.retry_backoff
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                self.destination.put(key, data)
                self.metrics.storage_ok(time.monotonic() - started)
                return True
            except (DestinationError, OSError) as exc:
                self.metrics.storage_error()
                if time.monotonic() + delay > deadline:
                    log.error("capture: page %s: storage failed %d times over %.0fs, dead-lettering: %s",
                              key, attempt, storage.retry_for, exc)
                    return False
                log.warning("capture: page %s: storage write failed (attempt %d, retry in %.1fs): %s",
                            key, attempt, delay, exc)
            if self.stop.wait(delay):
                raise RuntimeError(f"capture: stopped while retrying page {key} (it stays in the durable log)")
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def _dead_letter(self, page: StoredPage, data: bytes) -> None:
        path = self.dead_letter / page.key
        write_atomic(path, data)
        entry = {**page.index_entry(), "metadata": MessageToDict(page.metadata, preserving_proto_field_name=True)}
        write_atomic(path.with_name(path.name + ".json"), json.dumps(entry, sort_keys=True).encode())
        self.metrics.dead_lettered()
        log.critical("capture: page %s (%d events of %s) written to the dead-letter directory %s",
                     page.key, page.metadata.event_count, page.metadata.writer_id, path)
