"""Stop events set by SIGTERM/SIGINT, without a deadlock.

A Python signal handler runs in the main thread between two bytecodes, and a process that waits
for a stop event usually has its main thread inside `stop.wait()`, which holds the event's
non-reentrant lock for a moment on its way in. A handler that calls `stop.set()` right there waits
for that lock forever: a `capture-serve` once never stopped after a SIGTERM sent just as it
started to wait. So the handler sets the event from a thread of its own, which takes the lock as
soon as the main thread lets go of it.

A process-directed signal may also be delivered to any thread, gRPC's C threads included; the
handler then runs only when the main thread next executes Python code, and a main thread blocked in
an untimed `stop.wait()` never does. `wait_for(stop)` therefore waits in short slices.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], None]


def setting(stop: threading.Event, message: str | None = None) -> Handler:
    """A signal handler that sets `stop` (and logs `message`, with the signal number) safely."""

    def set_stop(signum: int) -> None:
        if message is not None:
            log.info(message, signum)
        stop.set()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=set_stop, args=(signum,), name="stop-signal", daemon=True).start()

    return on_signal


def install(stop: threading.Event, message: str | None = None,
            signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> dict[signal.Signals, Any]:
    """Make `signals` set `stop` (main thread only); the handlers they had, to restore."""
    handler = setting(stop, message)
    return {sig: signal.signal(sig, handler) for sig in signals}


def wait_for(stop: threading.Event, slice_seconds: float = 0.25) -> None:
    """Block until `stop` is set, waking every `slice_seconds` so pending signal handlers run.

    A CI run once saw `capture-serve` ignore a SIGTERM for a minute: the signal had landed on a gRPC
    thread while the main thread slept in an untimed wait."""
    while not stop.wait(slice_seconds):
        pass
