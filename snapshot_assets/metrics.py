"""Prometheus metrics: `GET /metrics` of `snapshotter serve`, and the same numbers as Dagster asset metadata.

Gauges come from the table status (status.py: manifest, buffer index, source, outbox); counters
from the persisted counter files (counters.py), because every Dagster run is its own process and
an in-process counter would restart at zero with each. One function, `samples`, turns a status
into named, labelled values; the exporter and the manifest's materialization metadata both use it,
so the UI and Prometheus cannot disagree.

The collector refreshes the statuses in a background thread (`interval`) and scrapes read the last
collection: a scrape never waits on a slow or dead destination (the collection does, and
`snapshotter_status_collected_timestamp_seconds` shows how fresh it is). The HTTP API (http_api.py)
serves the same collection as `/status` and `/health/ready`, so they cannot disagree either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from snapshot_assets.archive.positions import parse_lsn
from snapshot_assets.counters import ARTIFACTS_WRITTEN, CAS_RETRIES, DESTINATION_ERRORS, EVENT_ERRORS
from snapshot_assets.redaction import redact
from snapshot_assets.status import TableStatus, table_status

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from snapshot_assets.pipeline.table import TablePipeline

log = logging.getLogger(__name__)
PREFIX = "snapshotter_"


@dataclass(frozen=True)
class Sample:
    name: str  # without the prefix; counters end in _total
    labels: tuple[tuple[str, str], ...]
    value: float
    help: str

    @property
    def is_counter(self) -> bool:
        return self.name.endswith("_total")

    def key(self) -> str:
        """`snapshotter_name{k=v}`, the name used in Dagster metadata."""
        labels = ",".join(f"{k}={v}" for k, v in self.labels if k != "table")
        return f"{PREFIX}{self.name}" + (f"{{{labels}}}" if labels else "")


GAUGES: tuple[tuple[str, str, Callable[[TableStatus], float | None]], ...] = (
    ("epoch", "Epoch of the manifest head (one per snapshot).", lambda s: s.epoch),
    ("manifest_head_position", "The manifest's head position as a number (a PostgreSQL LSN: hi<<32|lo).",
     lambda s: parse_lsn(s.head_position or "")),
    ("diffs_since_snapshot", "Diffs committed after the newest snapshot (what a reader replays on top of it).",
     lambda s: s.diffs_since_snapshot),
    ("buffer_depth", "Changes in the buffer after the manifest head (what the next artifact holds).",
     lambda s: s.buffered_changes),
    ("diff_bytes", "Bytes of buffered changes after the head (the snapshot.max_diff_bytes input).",
     lambda s: s.buffered_bytes),
    ("churn_records", "Changes since the last snapshot, committed and pending (the max_churn_records input).",
     lambda s: s.churn_since_snapshot),
    ("snapshot_age_seconds", "Seconds since the last snapshot was created.", lambda s: s.snapshot_age_s),
    ("source_lag", "Bytes of WAL the buffer is behind the source (0 when the source cannot tell).",
     lambda s: s.source_lag),
    ("outbox_depth", "Events waiting in the outbox for delivery.", lambda s: s.outbox_depth),
    ("ready", "1 once the first snapshot is committed and the ingest is alive.", lambda s: float(s.ready)),
    ("ingest_alive", "1 while a process holds the buffer's writer lock (or the table's Dagster ingest run is live).",
     lambda s: float(s.ingest_alive)),
    ("ingest_failures", "The table's failed ingest runs in a row (0 once one runs; the supervisor relaunches it).",
     lambda s: s.ingest_failures),
    ("artifact_failures", "The table's failed artifact runs in a row (0 after a success; the trigger retries).",
     lambda s: s.artifact_failures),
)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    (ARTIFACTS_WRITTEN, "kind", "Artifacts committed, by kind."),
    (DESTINATION_ERRORS, "dest", "Failed destination operations (after the client's own retries), by destination."),
    (EVENT_ERRORS, "sink", "Failed event deliveries (the outbox retries them), by sink."),
    (CAS_RETRIES, "", "Manifest compare-and-swap conflicts that were retried."),
)
ZERO_LABELS = {ARTIFACTS_WRITTEN: ("snapshot", "diff")}  # always present, so rate() works from the start


def samples(status: TableStatus) -> list[Sample]:
    """Every metric of one table."""
    table = (("table", status.table),)
    out = [Sample(name, table, float(value), text) for name, text, get in GAUGES
           if (value := get(status)) is not None]
    out += [Sample("destination_up", (*table, ("dest", d.destination)), float(d.ok),
                   "1 when the manifest can be read on the destination.") for d in status.destinations]
    for name, label, text in COUNTERS:
        values = dict.fromkeys(ZERO_LABELS.get(name, ()) if label else ("",), 0.0)
        values.update(status.counters.get(name, {}))
        out += [Sample(name, (*table, (label, key)) if label else table, value, text)
                for key, value in sorted(values.items())]
    return out


def asset_metadata(status: TableStatus) -> dict[str, float]:
    """The metrics of one table as Dagster metadata entries (`snapshotter_name{label=value}` keys)."""
    return {s.key(): s.value for s in samples(status)}


def table_metadata(pipe: TablePipeline, instance: Any = None) -> dict[str, float | str]:
    """The metrics of a table for the manifest's materialization; never raises: the commit it
    describes has already happened, and a metadata failure must not fail that run."""
    try:
        return dict(asset_metadata(table_status(pipe, instance=instance)))
    except Exception as e:
        log.warning("%s: collecting metrics metadata failed: %s", pipe.name, e)
        return {"snapshotter_metrics_error": redact(f"{type(e).__name__}: {e}")}


class StatusCollector:
    """A prometheus_client collector over statuses refreshed in the background."""

    def __init__(self, collect: Callable[[], Sequence[TableStatus]], interval: float = 15.0) -> None:
        self._collect, self.interval = collect, interval
        self._statuses: Sequence[TableStatus] = ()
        self._collected_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def refresh(self) -> None:
        try:
            statuses = self._collect()
        except Exception:  # keep serving the previous collection; the timestamp shows its age
            log.exception("collecting the table status failed")
            return
        with self._lock:
            self._statuses, self._collected_at = statuses, time.time()

    def start(self) -> threading.Thread:
        """Collect now and every `interval` on a thread (the first collection does not delay the caller:
        a server answers its liveness probe while a slow destination is still being read)."""
        def loop() -> None:
            self.refresh()
            while not self._stop.wait(self.interval):
                self.refresh()

        thread = threading.Thread(target=loop, name="snapshotter-status", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def latest(self) -> tuple[Sequence[TableStatus], float]:
        """The last collection and when it was made (unix time; 0 before the first one)."""
        with self._lock:
            return self._statuses, self._collected_at

    def registry(self) -> CollectorRegistry:
        """A Prometheus registry holding this collector and the process's own metrics."""
        from prometheus_client import CollectorRegistry, ProcessCollector

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]  # a duck-typed Collector
        ProcessCollector(registry=registry)
        return registry

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        statuses, collected_at = self.latest()
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for status in statuses:
            for s in samples(status):
                family = families.get(s.name)
                if family is None:
                    kind = CounterMetricFamily if s.is_counter else GaugeMetricFamily
                    family = kind(PREFIX + s.name, s.help, labels=[k for k, _ in s.labels])
                    families[s.name] = family
                family.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()
        stamp = GaugeMetricFamily(PREFIX + "status_collected_timestamp_seconds",
                                  "When the statuses behind these metrics were collected (unix time).")
        stamp.add_metric([], collected_at)
        yield stamp
