"""The durable event outbox: notifications survive crashes and outages, and never block a commit.

After a manifest commit, one file per (sink, event) is written atomically under the outbox root;
delivery is then attempted, and a file is removed only once its sink accepted the event. A failed
delivery keeps the file with its attempt count and the next retry time (exponential backoff), and
the retry sensor calls `deliver` again. Events carry a stable id (table + kind + to_position), so
a redelivery after a crash between "sent" and "file removed" is a duplicate consumers can drop.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resources.durable_files import write_json_atomic
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
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _dir(self, sink: EventSink) -> Path:
        return self.root / _safe(sink.name)

    def enqueue(self, event: Mapping[str, Any], sinks: Sequence[EventSink]) -> None:
        """Make the event durable for every sink before any delivery is tried."""
        for sink in sinks:
            folder = self._dir(sink)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{_safe(str(event['id']))}.json"
            if path.exists():  # enqueued already (a rerun of the same commit): keep its place and retries
                continue
            record = {"event": dict(event), "enqueued_ns": time.time_ns(), "attempts": 0, "next_attempt": 0.0,
                      "last_error": ""}
            write_json_atomic(path, record)

    def depth(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.exists() else 0

    def deliver(self, sinks: Sequence[EventSink], *, now: float | None = None) -> DeliveryReport:
        """Try every due event of every sink, oldest first; failures are kept for a later retry."""
        clock = time.time() if now is None else now
        delivered = failed = 0
        errors: list[str] = []
        for sink in sinks:
            folder = self._dir(sink)
            if not folder.exists():
                continue
            records = sorted(((json.loads(p.read_text()), p) for p in folder.glob("*.json")),
                             key=lambda rp: int(rp[0]["enqueued_ns"]))
            for record, path in records:
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
                    write_json_atomic(path, record)
                    break  # keep this sink's events in order: retry the oldest first next time
                path.unlink()
                delivered += 1
        return DeliveryReport(delivered, failed, self.depth(), tuple(errors))

