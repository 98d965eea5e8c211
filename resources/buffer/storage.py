"""Where a table's buffer lives: the few filesystem operations the buffer needs, behind one interface.

Two implementations: a local directory (here; the writer lock is a kernel `flock`) and an object
storage prefix for hosts that share no disk (object_storage.py; the writer lock is a lease object).

Crash safety rests on three properties every implementation must give:
- `publish` makes the object's bytes durable *before* its name becomes visible, the name appears
  atomically, and it never replaces an existing object: a reader (or a recovering writer) sees the
  whole sealed segment or nothing, and a sealed segment is never overwritten.
- `write_atomic` replaces an object atomically and durably (the index).
- temporaries are recognisable by name (the `.tmp-` prefix; Spark and Hadoop also skip dot-files),
  so recovery deletes every leftover of a crashed write without guessing.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Protocol

from resources.buffer.errors import WriterLockHeld
from resources.durable_files import fsync_dir

TEMP_PREFIX = ".tmp-"
_LOCK_NAME = ".writer.lock"


class BufferStorage(Protocol):
    """Objects of one table's buffer, addressed by relative names like `segments/x.parquet`."""

    def create_temp(self, name: str) -> BinaryIO:
        """A new, invisible temporary object that may later be published as `name`."""
        ...

    def publish(self, temp: BinaryIO, name: str) -> int:
        """Close `temp`, make it durable, then make it visible as `name` (no-clobber); returns its size."""
        ...

    def discard(self, temp: BinaryIO) -> None:
        """Close and delete an unpublished temporary object."""
        ...

    def write_atomic(self, name: str, data: bytes) -> None:
        """Durably replace `name` with `data`; readers see the old or the new bytes, never a mix."""
        ...

    def read(self, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        ...

    def open_read(self, name: str) -> BinaryIO: ...

    def size(self, name: str) -> int: ...

    def list_names(self, folder: str) -> list[str]:
        """Names of the visible objects in `folder` (temporaries excluded), sorted."""
        ...

    def delete(self, name: str) -> None:
        """Delete `name` if it exists."""
        ...

    def remove_temporaries(self, folder: str) -> list[str]:
        """Delete every leftover temporary object at the top level and in `folder`; returns them."""
        ...

    def uri(self, name: str) -> str:
        """The address Spark reads the object by (a local path; later `s3a://...`)."""
        ...

    def lock_writer(self) -> None:
        """Take the table's single-writer lock for the life of this object, or raise WriterLockHeld."""
        ...

    def unlock_writer(self) -> None: ...

    def writer_alive(self) -> str | None:
        """Who holds the writer lock now (a pid, a lease owner), read without taking it; None if nobody."""
        ...


def _make_durable(temp: BinaryIO) -> int:
    """Flush and fsync an open temp file, close it; returns its size."""
    temp.flush()
    os.fsync(temp.fileno())
    size = os.fstat(temp.fileno()).st_size
    temp.close()
    return size


class LocalStorage:
    """A directory on a local (POSIX) filesystem.

    `publish` = fsync the temp file, `link` it to its final name (atomic, and it fails instead of
    replacing an existing segment), unlink the temp name, fsync the directory (so the new name
    itself survives a power loss). `write_atomic` renames over the old file instead. The writer
    lock is an exclusive `flock`, which the kernel releases when the process dies, even by SIGKILL.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(os.path.abspath(root))  # created by the first write: a reader creates nothing
        self._lock_fd: int | None = None

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def _path(self, name: str) -> Path:
        return self.root / name

    def create_temp(self, name: str) -> BinaryIO:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{TEMP_PREFIX}{secrets.token_hex(4)}-{path.name}")
        return open(temp, "xb")

    def publish(self, temp: BinaryIO, name: str) -> int:
        size = _make_durable(temp)
        path = self._path(name)
        os.link(temp.name, path)
        os.unlink(temp.name)  # a crash before this leaves a temp name: removed at recovery
        fsync_dir(path.parent)
        return size

    def discard(self, temp: BinaryIO) -> None:
        temp.close()
        Path(temp.name).unlink(missing_ok=True)

    def write_atomic(self, name: str, data: bytes) -> None:
        temp = self.create_temp(name)
        try:
            temp.write(data)
            _make_durable(temp)
        except BaseException:
            self.discard(temp)
            raise
        path = self._path(name)
        os.rename(temp.name, path)
        fsync_dir(path.parent)

    def read(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None

    def open_read(self, name: str) -> BinaryIO:
        return open(self._path(name), "rb")

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    def list_names(self, folder: str) -> list[str]:
        directory = self._path(folder)
        if not directory.is_dir():
            return []
        return sorted(f"{folder}/{p.name}" for p in directory.iterdir()
                      if p.is_file() and not p.name.startswith("."))

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def remove_temporaries(self, folder: str) -> list[str]:
        removed: list[str] = []
        for directory in (self.root, self._path(folder)):
            if not directory.is_dir():
                continue
            for p in directory.iterdir():
                if p.name.startswith(TEMP_PREFIX):
                    p.unlink(missing_ok=True)
                    removed.append(str(p.relative_to(self.root)))
        return sorted(removed)

    def uri(self, name: str) -> str:
        return str(self._path(name))

    def lock_writer(self) -> None:
        if self._lock_fd is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path(_LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WriterLockHeld(f"another process is writing the change buffer in {self.root}") from None
        self._lock_fd = fd

    def unlock_writer(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def writer_alive(self) -> str | None:
        pid = flock_holder(self._path(_LOCK_NAME))
        return None if pid is None else f"pid {pid}"


def flock_holder(path: Path) -> int | None:
    """The pid holding an flock on `path`, read from /proc/locks (Linux) without taking it.

    Matched by inode (device numbers in /proc/locks differ from stat's on overlay filesystems).
    None when nobody holds it, or on systems without /proc/locks. A local directory is one host's,
    so the kernel's view is the whole truth.
    """
    try:
        inode = path.stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->" lines are waiters
            continue
        if fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return None


def local_table_storage(root: str | Path, table: str) -> LocalStorage:
    """The default location of `table`'s buffer: the directory `<root>/<table>`."""
    if not table or "/" in table or table.startswith(".") or "\x00" in table:
        raise ValueError(f"table name {table!r} cannot name a buffer directory")
    return LocalStorage(Path(root) / table)
