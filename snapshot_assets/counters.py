"""Counters that outlive the process that counted them.

Every Dagster run is its own process and every sensor tick may be another one, so an in-memory
Prometheus counter would reset with each of them. Instead each table has a small JSON file,
`<buffer.path>/_metrics/<table>.json` (the working root: a local directory or an S3 prefix),
`{metric: {label: value}}`, updated read-modify-write with a conditional write (compare-and-swap,
retried on a conflict) so processes on other hosts add up correctly; the exporter
(`snapshotter serve`) and the manifest's materialization metadata read it.

Destination and sink failures are counted where they happen, by thin wrappers around the
destination and the sink: whoever calls them (the artifact upload, the manifest commit, a
sensor's cheap read, the outbox retry) is counted against the destination or sink that failed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, overload

from resources.destinations.base import (
    CASConflict,
    Destination,
    DestinationError,
    GetResult,
    ObjectInfo,
    PutResult,
    ReadableDestination,
)
from resources.destinations.local import LocalDestination
from resources.destinations.multipart import MultipartUpload
from resources.sinks.base import EventSink, SinkError

ARTIFACTS_WRITTEN = "artifacts_written_total"  # label: kind (snapshot | diff)
CAS_RETRIES = "manifest_cas_retries_total"  # no label
DESTINATION_ERRORS = "destination_errors_total"  # label: the destination (its root URI)
EVENT_ERRORS = "event_errors_total"  # label: the sink's name
Values = dict[str, dict[str, float]]
_CAS_ATTEMPTS = 20
T = TypeVar("T")


class CounterStore:
    """The persistent counters of one table: one small JSON object, `<table>.json`, in `store`."""

    def __init__(self, store: Destination | str | os.PathLike[str], table: str) -> None:
        self.store: Destination = (LocalDestination(Path(store) / "_metrics")
                                   if isinstance(store, (str, os.PathLike)) else store)
        self.key = f"{table}.json"

    def read(self) -> Values:
        return self._read()[0]

    def add(self, metric: str, label: str = "", amount: float = 1) -> None:
        """Increase `metric{label}` by `amount` (no-op for 0), durably, safe against other processes and hosts."""
        if not amount:
            return
        for _ in range(_CAS_ATTEMPTS):
            values, revision = self._read()
            labels = values.setdefault(metric, {})
            labels[label] = labels.get(label, 0.0) + amount
            try:
                self.store.put_if(self.key, json.dumps(values, sort_keys=True).encode(), revision)
                return
            except CASConflict:
                continue  # another process counted meanwhile: read again and add on top
        raise CASConflict(f"counter {self.store.uri(self.key)}: {_CAS_ATTEMPTS} concurrent updates in a row")

    def _read(self) -> tuple[Values, str | None]:
        got = self.store.get(self.key)
        if got is None:
            return {}, None
        try:
            data = json.loads(got.data)
            return ({str(m): {str(k): float(v) for k, v in labels.items()} for m, labels in data.items()},
                    got.revision)
        except (ValueError, AttributeError):
            return {}, got.revision  # unreadable: start over rather than stop counting


def destination_label(dest: Destination) -> str:
    """A destination's identity in metrics and status: its root URI (unique, unlike its name)."""
    return dest.uri("_")[:-1]


@overload
def unwrap(dest: Destination) -> Destination: ...
@overload
def unwrap(dest: ReadableDestination) -> ReadableDestination: ...
def unwrap(dest: ReadableDestination) -> ReadableDestination:
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

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self._call(lambda: self.inner.read_range(key, start, length))

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

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> tuple[str, ...]:
        return self._call(lambda: self.inner.abort_stale_uploads(prefix, older_than_s))


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
