"""Errors of the change buffer. Every message names the table and the cause.

None of them leaves anything half-written: they are raised before the buffer changes state, or
(for BufferCorrupt) when recovery finds damage it must not paper over.
"""

from __future__ import annotations


class ChangeBufferError(Exception):
    """Base class of every change-buffer error."""


class PositionWentBackwards(ChangeBufferError, ValueError):
    """An event's position is not after what the buffer already holds; the event was refused."""


class BadEventOrder(ChangeBufferError, ValueError):
    """An event arrived where it cannot (a change during a re-sync, a row outside one, no schema)."""


class BufferCorrupt(ChangeBufferError):
    """Sealed segments or the index contradict each other (missing segment, seq gap, overlap)."""


class RangeNotAvailable(ChangeBufferError, ValueError):
    """A requested range is not (or no longer, or not yet) fully held by the buffer."""


class ResyncInWindow(RangeNotAvailable):
    """A re-sync ended inside the requested range: only a snapshot can cover it, not a diff."""


class WriterLockHeld(ChangeBufferError):
    """Another process is already writing this table's buffer (one writer per table)."""


class BadChange(ChangeBufferError, ValueError):
    """A change or re-sync row that cannot be stored (no row image naming its key, an unencodable value)."""
