"""Counters that outlive the process that counted them.

Every Dagster run is its own process and every sensor tick may be another one, so an in-memory
Prometheus counter would reset with each of them. Instead each table has a small JSON file,
`<buffer.path>/_metrics/<table>.json`, `{metric: {label: value}}`, updated read-modify-write under
an exclusive `flock` and replaced atomically (a reader never sees half a file); the exporter
(`snapshotter serve`) and the manifest's materialization metadata read it.

Destination and sink failures are counted where they happen, by thin wrappers around the
destination and the sink: whoever calls them (the artifact upload, the manifest commit, a
sensor's cheap read, the outbox retry) is counted against the destination or sink that failed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from resources.destinations.base import CASConflict, Destination, DestinationError, GetResult, ObjectInfo, PutResult
from resources.destinations.multipart import MultipartUpload
from resources.durable_files import write_json_atomic
from resources.sinks.base import EventSink, SinkError

ARTIFACTS_WRITTEN = "artifacts_written_total"  # label: kind (snapshot | diff)
CAS_RETRIES = "manifest_cas_retries_total"  # no label
DESTINATION_ERRORS = "destination_errors_total"  # label: the destination (its root URI)
EVENT_ERRORS = "event_errors_total"  # label: the sink's name
Values = dict[str, dict[str, float]]
T = TypeVar("T")


class CounterStore:
    """The persistent counters of one table."""

    def __init__(self, root: str | os.PathLike[str], table: str) -> None:
        folder = Path(root) / "_metrics"
        self.path = folder / f"{table}.json"
        self._lock_path = folder / f".{table}.lock"

    def read(self) -> Values:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {str(m): {str(k): float(v) for k, v in labels.items()} for m, labels in data.items()}

    def add(self, metric: str, label: str = "", amount: float = 1) -> None:
        """Increase `metric{label}` by `amount` (no-op for 0), durably, safe against other processes."""
        if not amount:
            return
        with self._locked():
            values = self.read()
            labels = values.setdefault(metric, {})
            labels[label] = labels.get(label, 0.0) + amount
            self._write(values)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, values: Values) -> None:
        write_json_atomic(self.path, values)


def destination_label(dest: Destination) -> str:
    """A destination's identity in metrics and status: its root URI (unique, unlike its name)."""
    return dest.uri("_")[:-1]


def unwrap(dest: Destination) -> Destination:
    """The destination under a CountingDestination (for code that needs the concrete type)."""
    return dest.inner if isinstance(dest, CountingDestination) else dest


class CountingDestination:
    """A Destination whose failures (not CAS conflicts: those are the protocol working) are counted."""

    def __init__(self, inner: Destination, store: CounterStore) -> None:
        self.inner, self.store = inner, store
        self.name = inner.name
        self.label = destination_label(inner)

    def __repr__(self) -> str:
        return f"Counting({self.inner!r})"

    def _call(self, op: Callable[[], T]) -> T:
        try:
            return op()
        except CASConflict:
            raise
        except DestinationError:
            self.store.add(DESTINATION_ERRORS, self.label)
            raise

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def put(self, key: str, stream: BinaryIO | bytes) -> PutResult:
        return self._call(lambda: self.inner.put(key, stream))

    def get(self, key: str) -> GetResult | None:
        return self._call(lambda: self.inner.get(key))

    def open_read(self, key: str) -> BinaryIO:
        return self._call(lambda: self.inner.open_read(key))

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        return self._call(lambda: self.inner.put_if(key, data, expected_revision))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        items = self._call(lambda: iter(self.inner.list(prefix)))
        while True:
            item = self._call(lambda: next(items, None))
            if item is None:
                return
            yield item

    def delete(self, key: str) -> None:
        self._call(lambda: self.inner.delete(key))

    def begin_multipart(self, key: str) -> MultipartUpload:
        return self._call(lambda: self.inner.begin_multipart(key))


class CountingSink:
    """An EventSink whose delivery failures are counted; its name (the outbox folder) is the inner one's."""

    def __init__(self, inner: EventSink, store: CounterStore) -> None:
        self.inner, self.store = inner, store
        self.name = inner.name

    def publish(self, event: Mapping[str, Any]) -> None:
        try:
            self.inner.publish(event)
        except SinkError:
            self.store.add(EVENT_ERRORS, self.name)
            raise
