"""A table's change buffer in object storage (S3, or any destination): for hosts that share no disk.

The same three properties as the local directory (storage.py), from object-storage operations:
- `publish`: the segment is written into a local temp file first (never visible to anyone), then
  uploaded as one conditional create (`put_if` with no expected revision, S3's If-None-Match): the
  object appears whole or not at all, and never replaces an existing segment.
- `write_atomic`: a single PUT is atomic. While this process holds the writer lease, every
  replacement is conditional on the revision it last read or wrote (compare-and-swap), so a writer
  that lost its lease cannot overwrite its successor's index.
- temporaries never reach the store, so recovery has none to delete.

The single-writer rule is the lease (lease.py) instead of a kernel lock.
"""

from __future__ import annotations

import io
from typing import BinaryIO

from resources.buffer.errors import BufferCorrupt, WriterLockHeld
from resources.buffer.lease import DEFAULT_LEASE_S, Lease
from resources.buffer.storage import TEMP_PREFIX, BufferStorage, local_table_storage
from resources.destinations.base import CASConflict, Destination
from resources.work_storage import WorkRoot, scratch_file

LEASE_NAME = ".writer.lease"


class ObjectStorage:
    """The objects of one table's buffer under a destination (its keys are the buffer's names)."""

    def __init__(self, store: Destination, *, lease_seconds: float = DEFAULT_LEASE_S) -> None:
        self.store = store
        self.lease = Lease(store, LEASE_NAME, duration=lease_seconds)
        self._holding = False
        self._revisions: dict[str, str | None] = {}

    def __repr__(self) -> str:
        return f"ObjectStorage({self.store!r})"

    def create_temp(self, name: str) -> BinaryIO:
        return scratch_file(f"{TEMP_PREFIX}{name.rsplit('/', 1)[-1]}-")

    def publish(self, temp: BinaryIO, name: str) -> int:
        self._fence()
        temp.flush()
        temp.seek(0)
        data = temp.read()
        temp.close()
        try:
            self.store.put_if(name, data, None)
        except CASConflict:
            raise BufferCorrupt(f"segment {self.store.uri(name)} already exists; a sealed segment is never "
                                "replaced (another writer?)") from None
        return len(data)

    def discard(self, temp: BinaryIO) -> None:
        temp.close()

    def write_atomic(self, name: str, data: bytes) -> None:
        if not self._holding:
            self.store.put(name, data)  # a reader's request (the release file): last writer wins
            return
        self._fence()
        if name in self._revisions:
            expected = self._revisions[name]
        else:
            current = self.store.get(name)
            expected = current.revision if current is not None else None
        try:
            self._revisions[name] = self.store.put_if(name, data, expected)
        except CASConflict:
            self._holding = False
            raise self._lost(f"{self.store.uri(name)} changed under this writer") from None

    def read(self, name: str) -> bytes | None:
        got = self.store.get(name)
        self._revisions[name] = got.revision if got is not None else None
        return got.data if got is not None else None

    def open_read(self, name: str) -> BinaryIO:
        got = self.store.get(name)
        if got is None:
            raise FileNotFoundError(self.store.uri(name))
        return io.BytesIO(got.data)  # seekable: footers are read from the end

    def size(self, name: str) -> int:
        for info in self.store.list(name):
            if info.key == name:
                return info.size
        raise FileNotFoundError(self.store.uri(name))

    def list_names(self, folder: str) -> list[str]:
        prefix = folder.rstrip("/") + "/"
        return sorted(info.key for info in self.store.list(prefix)
                      if "/" not in info.key[len(prefix):] and not info.key[len(prefix):].startswith("."))

    def delete(self, name: str) -> None:
        if self._holding:
            self._fence()
        self.store.delete(name)
        self._revisions.pop(name, None)

    def remove_temporaries(self, folder: str) -> list[str]:
        return []  # temporaries are local files, gone with the process that wrote them

    def uri(self, name: str) -> str:
        return self.store.uri(name)

    def lock_writer(self) -> None:
        if self._holding:
            return
        self.lease.acquire()
        self._holding = True
        self._revisions.clear()  # what we saw before holding the lease proves nothing

    def unlock_writer(self) -> None:
        if self._holding:
            self._holding = False
            self.lease.release()

    def writer_alive(self) -> str | None:
        """Who holds the writer lease now (its owner), or None; read without taking it."""
        holder = self.lease.holder()
        return holder.owner if holder is not None else None

    # -- internals ------------------------------------------------------------------------------------

    def _fence(self) -> None:
        try:
            self.lease.assert_held()
        except Exception:
            self._holding = False
            raise

    def _lost(self, why: str) -> WriterLockHeld:
        return WriterLockHeld(f"lost the writer role of {self.store.uri('')}: {why}")


def table_storage(work: WorkRoot, table: str, *, lease_seconds: float = DEFAULT_LEASE_S) -> BufferStorage:
    """Where `table`'s buffer lives under the working root: `<root>/<table>/`, local or in object storage."""
    if work.is_s3:
        return ObjectStorage(work.part(table), lease_seconds=lease_seconds)
    return local_table_storage(work.path, table)
