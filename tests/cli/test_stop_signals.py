"""SIGTERM/SIGINT set the stop event without ever waiting on the event's own lock."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from snapshot_assets.services import install_stop_signals


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_while_the_main_thread_holds_the_events_lock_still_stops(restored_handlers: None) -> None:
    """The handler runs in the main thread, which may hold the event's lock at that instant (on its
    way into `stop.wait()`): the handler must return, and the event be set once the lock is free."""
    stop = threading.Event()
    install_stop_signals(stop)
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    returned = threading.Event()

    def main_thread_inside_wait() -> None:
        with stop._cond:  # type: ignore[attr-defined]  # what Event.wait holds before it blocks
            handler(signal.SIGTERM, None)
            returned.set()

    holder = threading.Thread(target=main_thread_inside_wait, daemon=True)
    holder.start()
    holder.join(5)
    assert returned.is_set(), "the signal handler blocked on the stop event's lock"
    assert stop.wait(5)


def test_sigint_stops_too(restored_handlers: None) -> None:
    stop = threading.Event()
    install_stop_signals(stop)
    signal.raise_signal(signal.SIGINT)
    assert stop.wait(5)


WAITER = """
import signal, threading, time
from resources import stop_signals
stop = threading.Event()
stop_signals.install(stop)
def deliver_to_this_thread():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(60)
threading.Thread(target=deliver_to_this_thread, daemon=True).start()
started = time.monotonic()
stop_signals.wait_for(stop)
print(round(time.monotonic() - started, 2))
"""


def test_a_signal_delivered_to_another_thread_still_stops_the_waiting_main_thread() -> None:
    """Linux may hand a process-directed SIGTERM to any thread (a gRPC thread, say); the handler then
    waits for the main thread to run Python code, which an untimed `Event.wait()` never lets it do."""
    done = subprocess.run([sys.executable, "-c", WAITER], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 5
