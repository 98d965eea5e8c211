"""The page index: every stored page's metadata, for discovery and replay, off the durability path.

A flush queues its page's record as a file (`<buffer>/index-queue/`, written durably before the
page is marked flushed), and a publisher thread moves queued records into the index backends,
retrying a failed publish after `index.retry_backoff` and deleting the file only once every backend
has it: an index outage delays discovery, never a publish. Backends: the object index (always; one
JSON object per writer and day under `_index/` in the page destination, updated with
compare-and-swap, so a consumer needs nothing but the bucket) and an optional SQL table (SQLite or
PostgreSQL). Records are upserted by page key, so a page re-flushed after a crash updates its row.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from resources.capture.keys import INDEX_PREFIX, writer_path
from resources.capture.metrics import CaptureMetrics
from resources.capture.settings import IndexSettings
from resources.destinations.base import CASConflict, Destination
from resources.durable_files import write_json_atomic

if TYPE_CHECKING:
    from resources.capture.flush import StoredPage

log = logging.getLogger(__name__)
Entry = dict[str, Any]
COLUMNS = ("page_key", "writer_id", "page_sequence", "last_sequence", "start_time", "end_time", "event_count",
           "page_size_bytes", "storage_size_bytes", "format", "compression")
_INT_COLUMNS = frozenset(COLUMNS) - {"page_key", "writer_id", "format", "compression"}


class IndexBackend(Protocol):
    def upsert(self, entry: Entry) -> None: ...

    def pages(self, writer_id: str, start_ms: int | None, end_ms: int | None) -> list[Entry]:
        """The writer's pages overlapping [start_ms, end_ms], in sequence order."""
        ...

    def all_keys(self) -> set[str]: ...


def day_of(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d")


def _overlaps(entry: Entry, start_ms: int | None, end_ms: int | None) -> bool:
    return (start_ms is None or entry["end_time"] >= start_ms) and (end_ms is None or entry["start_time"] <= end_ms)


class ObjectIndex:
    """`_index/<writer>/<day>.json`: {"pages": [...]} sorted by sequence, in the page destination."""

    def __init__(self, destination: Destination) -> None:
        self.destination = destination

    def key(self, writer_id: str, day: str) -> str:
        return f"{INDEX_PREFIX}{writer_path(writer_id)}/{day}.json"

    def upsert(self, entry: Entry) -> None:
        key = self.key(entry["writer_id"], day_of(entry["start_time"]))
        for _ in range(20):
            current = self.destination.get(key)
            pages = json.loads(current.data)["pages"] if current else []
            pages = [p for p in pages if p["page_key"] != entry["page_key"]] + [entry]
            pages.sort(key=lambda p: p["page_sequence"])
            body = json.dumps({"pages": pages}, sort_keys=True, indent=1).encode()
            try:
                self.destination.put_if(key, body, current.revision if current else None)
                return
            except CASConflict:
                continue
        raise CASConflict(f"object index {key}: kept losing the compare-and-swap")

    def pages(self, writer_id: str, start_ms: int | None, end_ms: int | None) -> list[Entry]:
        prefix = f"{INDEX_PREFIX}{writer_path(writer_id)}/"
        out: list[Entry] = []
        for info in self.destination.list(prefix):
            day = info.key[len(prefix):].removesuffix(".json")
            if (start_ms is not None and day < day_of(start_ms)) or (end_ms is not None and day > day_of(end_ms)):
                continue
            got = self.destination.get(info.key)
            if got is not None:
                out.extend(p for p in json.loads(got.data)["pages"] if _overlaps(p, start_ms, end_ms))
        return sorted(out, key=lambda p: p["page_sequence"])

    def all_keys(self) -> set[str]:
        keys: set[str] = set()
        for info in self.destination.list(INDEX_PREFIX):
            got = self.destination.get(info.key)
            if got is not None:
                keys.update(p["page_key"] for p in json.loads(got.data)["pages"])
        return keys

    def remove(self, page_key: str, writer_id: str, start_time: int) -> None:
        """Drop one record (tests of reconciliation; operators removing a page)."""
        key = self.key(writer_id, day_of(start_time))
        current = self.destination.get(key)
        if current is not None:
            pages = [p for p in json.loads(current.data)["pages"] if p["page_key"] != page_key]
            self.destination.put_if(key, json.dumps({"pages": pages}, sort_keys=True, indent=1).encode(),
                                    current.revision)


class SqlIndex:
    """The page table in SQLite (`dsn` = a file path) or PostgreSQL (`dsn` = a libpq DSN)."""

    def __init__(self, settings: IndexSettings) -> None:
        if not settings.table.replace("_", "").isalnum():
            raise ValueError(f"capture.index.table {settings.table!r} is not a plain table name")
        self.settings, self.table = settings, settings.table
        self.mark = "?" if settings.backend == "sqlite" else "%s"
        with closing(self._connect()) as conn, conn:
            cur = conn.cursor()
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (page_key TEXT PRIMARY KEY, writer_id TEXT NOT NULL, "
                        "page_sequence BIGINT NOT NULL, last_sequence BIGINT NOT NULL, start_time BIGINT NOT NULL, "
                        "end_time BIGINT NOT NULL, event_count BIGINT NOT NULL, page_size_bytes BIGINT NOT NULL, "
                        "storage_size_bytes BIGINT NOT NULL, format TEXT NOT NULL, compression TEXT NOT NULL)")
            cur.execute(f"CREATE INDEX IF NOT EXISTS {self.table}_writer ON {self.table} (writer_id, page_sequence)")

    def _connect(self) -> Any:
        if self.settings.backend == "sqlite":
            return sqlite3.connect(self.settings.dsn, timeout=30)
        import psycopg2

        return psycopg2.connect(self.settings.dsn)

    def upsert(self, entry: Entry) -> None:
        cols = ", ".join(COLUMNS)
        marks = ", ".join([self.mark] * len(COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
        with closing(self._connect()) as conn, conn:
            conn.cursor().execute(f"INSERT INTO {self.table} ({cols}) VALUES ({marks}) "
                                  f"ON CONFLICT (page_key) DO UPDATE SET {updates}",
                                  tuple(entry[c] for c in COLUMNS))

    def pages(self, writer_id: str, start_ms: int | None, end_ms: int | None) -> list[Entry]:
        where: list[str] = [f"writer_id = {self.mark}"]
        args: list[Any] = [writer_id]
        for column, op, bound in (("end_time", ">=", start_ms), ("start_time", "<=", end_ms)):
            if bound is not None:
                where.append(f"{column} {op} {self.mark}")
                args.append(bound)
        return self._select(" AND ".join(where), tuple(args))

    def _select(self, where: str, args: tuple[Any, ...]) -> list[Entry]:
        with closing(self._connect()) as conn, conn:
            cur = conn.cursor()
            cur.execute(f"SELECT {', '.join(COLUMNS)} FROM {self.table} WHERE {where} ORDER BY page_sequence", args)
            return [dict(zip(COLUMNS, row, strict=True)) for row in cur.fetchall()]

    def all_keys(self) -> set[str]:
        return {e["page_key"] for e in self._select("1 = 1", ())}

    def delete(self, page_key: str) -> None:
        with closing(self._connect()) as conn, conn:
            conn.cursor().execute(f"DELETE FROM {self.table} WHERE page_key = {self.mark}", (page_key,))


def backends(settings: IndexSettings, destination: Destination) -> list[IndexBackend]:
    """The object index, then the SQL table if one is configured (replay asks the last one)."""
    out: list[IndexBackend] = [ObjectIndex(destination)]
    if settings.backend != "none":
        out.append(SqlIndex(settings))
    return out


class IndexQueue:
    """Durable queue of index records plus the thread that publishes them."""

    def __init__(self, root: Path, targets: list[IndexBackend], metrics: CaptureMetrics,
                 retry_backoff: float = 1.0) -> None:
        self.dir = root / "index-queue"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.targets, self.metrics, self.retry_backoff = targets, metrics, retry_backoff
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capture-index", daemon=True)

    def enqueue(self, page: StoredPage) -> None:
        if page.dead_lettered:
            return  # not in storage: nothing to discover there (the dead-letter directory has its record)
        entry = page.index_entry()
        write_json_atomic(self.dir / f"{writer_path(entry['writer_id'])}.{entry['page_sequence']:020d}.json", entry)
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def pending(self) -> int:
        return sum(1 for _ in self.dir.glob("*.json"))

    def drain(self) -> bool:
        """Publish every queued record once; True when the queue is empty afterwards."""
        for path in sorted(self.dir.glob("*.json")):
            entry = json.loads(path.read_text())
            try:
                for target in self.targets:
                    target.upsert(entry)
            except Exception as exc:
                self.metrics.index_error()
                log.warning("capture: index publish of %s failed (will retry): %s", entry["page_key"], exc)
                return False
            self.metrics.index_ok()
            path.unlink(missing_ok=True)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            if self.drain():
                self._wake.wait()
            else:
                self._stop.wait(self.retry_backoff)
        self.drain()
