"""The single-writer lease of a table's buffer in object storage: who may write, without local locks.

On a local disk the kernel's `flock` says who writes (released even by SIGKILL). Hosts that share
only object storage cannot see each other's locks, so the writer holds a lease object instead: a
small JSON record (owner, expiry) created and renewed with conditional writes (`put_if`), so two
contenders can never both believe they won.

- Acquire: absent, released, or expired (the reader's clock is past `expires_at`) -> write our
  record conditionally on the revision we read; the loser of a race sees a CAS conflict.
- Renew: a heartbeat thread rewrites the record every third of the lease, conditionally on our own
  last revision. A failed renewal (someone took over) or a lease that ran out unrenewed (an outage
  longer than the lease) marks it lost; the writer checks `assert_held` before every write and
  stops. The buffer index is written conditionally on its last revision too (object_storage.py), so
  even a writer paused past its expiry cannot overwrite what its successor wrote.
- Release: on a clean close the record is rewritten as expired, so a successor starts at once;
  after kill -9 the successor waits at most the lease time.

Clocks: expiry compares the holder's wall clock (written into the record) with the contender's.
Hosts are expected to be NTP-synchronised; a skew of s seconds shortens or lengthens the takeover
by s, and the conditional index write keeps the data safe either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from resources.buffer.errors import WriterLockHeld
from resources.destinations.base import CASConflict, Destination, DestinationError

DEFAULT_LEASE_S = 30.0


@dataclass(frozen=True)
class LeaseRecord:
    owner: str  # host:pid:token, unique per holder
    expires_at: float  # unix seconds, the holder's clock

    def to_bytes(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires_at": self.expires_at}, sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> LeaseRecord | None:
        """The record, or None for an unreadable one (treated as expired: it protects nothing)."""
        try:
            data = json.loads(raw)
            return cls(str(data["owner"]), float(data["expires_at"]))
        except (ValueError, KeyError, TypeError):
            return None


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Lease:
    """One holder's handle on the lease object `name` in `store`."""

    def __init__(self, store: Destination, name: str, *, duration: float = DEFAULT_LEASE_S,
                 clock: Callable[[], float] = time.time) -> None:
        if duration <= 0:
            raise ValueError("a lease duration must be positive")
        self.store, self.name, self.duration = store, name, duration
        self.owner = new_owner()
        self._clock = clock
        self._revision: str | None = None
        self._expires_at = 0.0
        self._lost = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def holder(self) -> LeaseRecord | None:
        """The live holder (anyone's record that has not expired by our clock), or None."""
        current = self.store.get(self.name)
        record = LeaseRecord.parse(current.data) if current is not None else None
        return record if record is not None and record.expires_at > self._clock() else None

    def try_acquire(self) -> LeaseRecord | None:
        """Take the lease if nobody live holds it; returns None on success, else the live holder."""
        current = self.store.get(self.name)
        record = LeaseRecord.parse(current.data) if current is not None else None
        if record is not None and record.expires_at > self._clock() and record.owner != self.owner:
            return record
        try:
            self._write(current.revision if current is not None else None)
        except CASConflict:  # someone else acquired between our read and write
            return self.holder() or LeaseRecord("unknown (a concurrent acquire)", self._clock())
        self._start_heartbeat()
        return None

    def acquire(self) -> None:
        """Take the lease now or raise WriterLockHeld naming the holder and when it expires."""
        holder = self.try_acquire()
        if holder is not None:
            left = max(0.0, holder.expires_at - self._clock())
            raise WriterLockHeld(f"another process is writing the change buffer {self.store.uri(self.name)}: "
                                 f"lease held by {holder.owner}, expires in {left:.0f} s unless renewed")

    def assert_held(self) -> None:
        """Raise WriterLockHeld unless we still hold the lease (checked before every buffer write)."""
        if not self._lost and self._clock() >= self._expires_at:
            self._lost = "the lease ran out before it could be renewed (object storage unreachable?)"
        if self._lost:
            raise WriterLockHeld(f"lost the writer lease {self.store.uri(self.name)}: {self._lost}")

    def release(self) -> None:
        """Stop renewing and mark the record expired so a successor need not wait."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._mutex:
            if self._revision is not None and not self._lost:
                with contextlib.suppress(DestinationError):  # taken over or unreachable: it expires by itself
                    self.store.put_if(self.name, LeaseRecord(self.owner, 0.0).to_bytes(), self._revision)
            self._revision = None

    # -- internals -----------------------------------------------------------------------------------

    def _write(self, expected: str | None) -> None:
        with self._mutex:
            expires = self._clock() + self.duration
            self._revision = self.store.put_if(self.name, LeaseRecord(self.owner, expires).to_bytes(), expected)
            self._expires_at = expires
            self._lost = ""

    def _renew(self) -> None:
        try:
            self._write(self._revision)
        except CASConflict:
            holder = self.holder()
            self._lost = f"taken over by {holder.owner if holder else 'another writer'}"
        except DestinationError:
            pass  # transient: the next beat tries again; assert_held notices if the lease runs out

    def _start_heartbeat(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(self.duration / 3):
                if self._lost:
                    return
                self._renew()

        self._thread = threading.Thread(target=beat, name=f"lease {self.name}", daemon=True)
        self._thread.start()
