"""The event-sink seam. Events are advisory and at-least-once: consumers poll the manifest and
drop duplicates by the event's stable `id`, so a sink only has to deliver or raise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class SinkError(Exception):
    """Delivery failed; the outbox keeps the event and retries later."""


class EventSink(Protocol):
    name: str

    def publish(self, event: Mapping[str, Any]) -> None:
        """Deliver one event or raise SinkError."""
        ...
