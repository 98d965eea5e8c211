"""Replay: a writer's events back, in sequence order, from the pages the index names.

The index (the SQL table when one is configured, else the object index in the bucket) gives the
writer's pages overlapping the time range in sequence order; each page is read, decoded whatever
its format and compression, and its events inside the range are yielded. A page the index names
but storage lacks is an error, never a silent gap.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from resources.aws_credentials import CredentialProfiles
from resources.capture.index import IndexBackend, backends
from resources.capture.pages import decode
from resources.capture.settings import CaptureSettings
from resources.destinations.base import Destination
from resources.destinations.factory import build_destination
from resources.proto.prism.snapshotter.page_pb2 import Event


class MissingPage(LookupError):
    """The index names a page that storage does not hold."""


def replay_events(destination: Destination, index: IndexBackend, writer_id: str, start_ms: int | None = None,
                  end_ms: int | None = None) -> Iterator[Event]:
    """`writer_id`'s events with start_ms <= timestamp <= end_ms (either bound optional), in order."""
    for entry in index.pages(writer_id, start_ms, end_ms):
        got = destination.get(entry["page_key"])
        if got is None:
            raise MissingPage(f"the index names page {destination.uri(entry['page_key'])}, which storage lacks")
        for event in decode(got.data).events:
            if (start_ms is None or event.timestamp >= start_ms) and (end_ms is None or event.timestamp <= end_ms):
                yield event


def replay(settings: CaptureSettings, writer_id: str, start_ms: int | None = None, end_ms: int | None = None,
           destination: Destination | None = None, profiles: CredentialProfiles | None = None) -> Iterator[Event]:
    """`replay_events` over the configured destination (signed as its `credentials` profile, looked up in
    `profiles`) and index."""
    dest = destination or build_destination(settings.storage.destination, profiles=profiles)
    return replay_events(dest, backends(settings.index, dest)[-1], writer_id, start_ms, end_ms)


def parse_time(text: str) -> int:
    """Unix milliseconds from an integer (milliseconds) or an ISO-8601 time (UTC unless it says)."""
    if text.strip().lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot parse time {text!r} (expected unix milliseconds or ISO-8601)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)
