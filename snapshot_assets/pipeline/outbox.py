"""The durable event outbox: notifications survive crashes and outages, and never block a commit.

After a manifest commit, one object per (sink, event) is written atomically under the outbox root;
delivery is then attempted, and a file is removed only once its sink accepted the event. A failed
delivery keeps the file with its attempt count and the next retry time (exponential backoff), and
the retry sensor calls `deliver` again. Events carry a stable id (table + kind + to_position), so
a redelivery after a crash between "sent" and "file removed" is a duplicate consumers can drop.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resources.destinations.base import CASConflict, Destination
from resources.destinations.local import LocalDestination
from resources.sinks.base import EventSink, SinkError
from snapshot_assets.archive.manifest import Artifact

MAX_BACKOFF_S = 300.0


def event_id(table: str, art: Artifact) -> str:
    return f"{table}:{art.kind}:{art.to_position}"


def artifact_event(table: str, art: Artifact, head_position: str, manifest_uri: str) -> dict[str, Any]:
    """The spec's event body (§7) plus its stable `id`."""
    return {
        "id": event_id(table, art),
        "table": table,
        "kind": art.kind,
        "epoch": art.epoch,
        "from_position": art.from_position,
        "to_position": art.to_position,
        "head_position": head_position,
        "manifest_uri": manifest_uri,
        "formats": {fid: ref.uri for fid, ref in art.formats.items()},
        "created_at": art.created_at,
    }


@dataclass(frozen=True)
class DeliveryReport:
    delivered: int
    failed: int
    pending: int
    errors: tuple[str, ...]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class Outbox:
    """The outbox objects, `<sink>/<event id>.json`, in a destination every host of the pipeline reaches.

    The working root's `_outbox` part (local directory or S3 prefix, resources/work_storage.py); a
    plain path means a local directory. Writes are whole-object (atomic on both kinds); enqueueing
    is a conditional create, so a rerun of the same commit keeps the event's place and retries.
    """

    def __init__(self, store: Destination | str | os.PathLike[str]) -> None:
        self.store: Destination = LocalDestination(os.fspath(store)) if isinstance(store, (str, os.PathLike)) else store

    @property
    def identity(self) -> str:
        """Names the outbox (the tables of one working root share it)."""
        return repr(self.store)

    def enqueue(self, event: Mapping[str, Any], sinks: Sequence[EventSink]) -> None:
        """Make the event durable for every sink before any delivery is tried."""
        for sink in sinks:
            record = {"event": dict(event), "enqueued_ns": time.time_ns(), "attempts": 0, "next_attempt": 0.0,
                      "last_error": ""}
            with contextlib.suppress(CASConflict):  # enqueued already: keep its place and retries
                self.store.put_if(_key(sink, str(event["id"])), _encode(record), None)

    def records(self, sink: EventSink | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(key, record) of every queued event (of one sink), oldest first; skips those delivered meanwhile."""
        found: list[tuple[str, dict[str, Any]]] = []
        for info in self.store.list(f"{_safe(sink.name)}/" if sink is not None else ""):
            if not info.key.endswith(".json"):
                continue
            got = self.store.get(info.key)
            if got is None:
                continue  # delivered (removed) while we looked
            with contextlib.suppress(ValueError, KeyError):
                found.append((info.key, json.loads(got.data)))
        return sorted(found, key=lambda kr: int(kr[1].get("enqueued_ns", 0)))

    def depth(self) -> int:
        return sum(1 for info in self.store.list("") if info.key.endswith(".json"))

    def deliver(self, sinks: Sequence[EventSink], *, now: float | None = None) -> DeliveryReport:
        """Try every due event of every sink, oldest first; failures are kept for a later retry."""
        clock = time.time() if now is None else now
        delivered = failed = 0
        errors: list[str] = []
        for sink in sinks:
            for key, record in self.records(sink):
                if record["next_attempt"] > clock:
                    break  # the oldest event is backing off; later ones wait behind it (order per sink)
                try:
                    sink.publish(record["event"])
                except SinkError as e:
                    failed += 1
                    errors.append(str(e))
                    record["attempts"] += 1
                    record["last_error"] = str(e)
                    record["next_attempt"] = clock + min(MAX_BACKOFF_S, 2.0 ** record["attempts"])
                    self.store.put(key, _encode(record))
                    break  # keep this sink's events in order: retry the oldest first next time
                self.store.delete(key)
                delivered += 1
        return DeliveryReport(delivered, failed, self.depth(), tuple(errors))


def _key(sink: EventSink, event_id: str) -> str:
    return f"{_safe(sink.name)}/{_safe(event_id)}.json"


def _encode(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()
