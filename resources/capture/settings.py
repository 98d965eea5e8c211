"""The `capture { }` configuration block as typed values (parsed and checked by snapshot_assets/config.py).

Defaults are RFC-023's (1000 events, 10 MiB, 5 minutes, flush on disconnect, protobuf + gzip). The
settings live here, not in the config module, so the capture service and its tests build them
without a whole snapshotter configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PAGE_FORMATS = ("protobuf", "ndjson")
COMPRESSIONS = ("none", "gzip", "zstd")
INDEX_BACKENDS = ("none", "sqlite", "postgres")


@dataclass(frozen=True)
class BufferSettings:
    """`capture.buffer`: where the durable log lives and when a writer's events become a page."""

    path: str = ".snapshotter/capture"
    max_events: int = 1000
    max_size_bytes: int = 10 * 1024 * 1024
    max_age_seconds: float = 300.0
    flush_on_disconnect: bool = True
    max_payload_bytes: int = 4 * 1024 * 1024  # a larger payload is refused (INVALID_ARGUMENT), never truncated


@dataclass(frozen=True)
class PageSettings:
    """`capture.page`: how a page is encoded. `target_size_mb` caps the uncompressed page like
    `buffer.max_size_bytes` does (the smaller of the two wins); `include_metadata` keeps the events'
    attributes in the page (false drops them, keeping payloads only)."""

    format: str = "protobuf"
    compression: str = "gzip"
    target_size_mb: float = 10.0
    include_metadata: bool = True
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StorageSettings:
    """`capture.storage`: the destination pages are written to, their key, and how long a failing
    write is retried (doubling from `retry_backoff`) before the page goes to the dead-letter
    directory (`dead_letter`, default `<buffer.path>/dead-letter`)."""

    destination: Mapping[str, Any] = field(default_factory=dict)
    key_template: str = "snapshots/{year}/{month}/{day}/{writer_id}/{timestamp}_{sequence}.pb.gz"
    retry_backoff: float = 1.0
    retry_for: float = 300.0
    dead_letter: str = ""


@dataclass(frozen=True)
class IndexSettings:
    """`capture.index`: the page index table (`none`, `sqlite` with `dsn` a file path, `postgres` with a
    libpq DSN) beside the object index the destination always gets; `retry_backoff` paces retries
    of a failed publish."""

    backend: str = "none"
    dsn: str = ""
    table: str = "capture_pages"
    retry_backoff: float = 1.0


@dataclass(frozen=True)
class CaptureSettings:
    buffer: BufferSettings = field(default_factory=BufferSettings)
    page: PageSettings = field(default_factory=PageSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    index: IndexSettings = field(default_factory=IndexSettings)
    port: int = 50051

    @property
    def page_limit_bytes(self) -> int:
        """The uncompressed bytes at which a writer's page is cut."""
        return min(self.buffer.max_size_bytes, int(self.page.target_size_mb * 1024 * 1024))
