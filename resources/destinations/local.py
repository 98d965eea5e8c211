"""Local filesystem destination: atomic replace for artifacts, a cross-process CAS for the manifest.

Durability: every write goes to a temp file in the target directory, is fsynced, renamed over the
key (`os.replace`, atomic on POSIX) and the directory is fsynced, so after `put` returns the object
survives a crash and a reader sees either the old or the new bytes, never a torn file.

Revision = sha256 hex of the content, the same token laredo's local destination uses. A content
hash changes exactly when the bytes change and is stable across processes, restarts and copies.
`(mtime_ns, size, inode)` is cheaper but unsafe for a CAS: inode numbers are recycled as soon as a
replaced file is freed and mtime granularity can be coarse, so two different same-size writes can
carry the same token (an ABA that would let a stale writer win). The content hash has ABA only for
identical bytes, where it is harmless: the state the caller expected is the state on disk.
An object assembled from parts for a caller that never compares its revision (an artifact:
`put_assembled(revision=False)`) is not read back to hash it; `get` still reports its sha256.

Compare-and-swap: `put_if` (and `put`, `delete`, so they linearize with it) serialize per key on an
exclusive `fcntl.flock` of a lock file next to the object. The new bytes are staged and fsynced
before the lock is taken, so the lock covers only check-revision + rename. The holder unlinks the
lock file before releasing it; a waiter that then wins the lock on the unlinked inode sees that the
path no longer names its inode and retries, so exactly one process at a time holds the lock on the
live lock file and no lock files pile up (the tree stays clean and empty directories can be pruned).

Internal files use the reserved name prefix `.~` (`.~tmp.*`, `.~lock.*`): keys may not contain a
path component starting with it, and `list` skips such files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from resources.destinations.base import (
    REVISION_NOT_COMPUTED,
    CASConflict,
    DestinationError,
    GetResult,
    ObjectInfo,
    PutResult,
    check_range,
)
from resources.durable_files import fsync_dir

if TYPE_CHECKING:
    from resources.destinations.local_multipart import LocalUpload

FILE_MODE = 0o644
DIR_MODE = 0o755
CHUNK_SIZE = 1024 * 1024

RESERVED_PREFIX = ".~"
_TMP_PREFIX = RESERVED_PREFIX + "tmp."
_LOCK_PREFIX = RESERVED_PREFIX + "lock."
_NAME_MAX = 255
# Bounded retries when a concurrent delete prunes a directory between our mkdir and our create.
_CREATE_ATTEMPTS = 8
# Characters left unescaped in file:// URIs so ordinary archive keys print exactly as laredo's
# `"file://" + abs` does (`epoch=3/diff-0_1-0_2.jsonl`); anything else (space, %, #, ?) is escaped.
_URI_SAFE = "/=:@!$&'()*+,;~-._"


@dataclass(frozen=True, slots=True)
class _Staged:
    """A fully written, fsynced temp file waiting to be renamed over its key."""

    tmp: Path
    size: int
    revision: str


def _revision(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_key(key: str) -> list[str]:
    """The key's path components, or DestinationError if it could escape the root or collide.

    Rejected: empty keys, absolute paths, backslashes, NUL, empty/`.`/`..` components (so a key can
    never name anything outside the root), and components starting with the reserved `.~`.
    """
    if not isinstance(key, str) or not key:
        raise DestinationError(f"invalid key {key!r}: must be a non-empty string")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise DestinationError(f"invalid key {key!r}: absolute paths, backslashes and NUL are not allowed")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise DestinationError(f"invalid key {key!r}: empty, '.' and '..' components are not allowed")
        if part.startswith(RESERVED_PREFIX):
            raise DestinationError(
                f"invalid key {key!r}: the component prefix {RESERVED_PREFIX!r} is reserved"
            )
    return parts


def _lock_path(path: Path) -> Path:
    """The per-key lock file; names too long for the filesystem fall back to a hash of the name."""
    name = _LOCK_PREFIX + path.name
    if len(os.fsencode(name)) > _NAME_MAX:
        name = _LOCK_PREFIX + hashlib.sha256(os.fsencode(path.name)).hexdigest()
    return path.with_name(name)


def _open_locked(lock: Path) -> int:
    """Open `lock` and flock it exclusively, retrying until the locked inode is the live one."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd
        except FileNotFoundError:
            pass  # the previous holder unlinked it after we opened it: take the new one
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


@contextlib.contextmanager
def _key_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive cross-process lock of one key; the lock file is gone once released."""
    lock = _lock_path(path)
    fd = _open_locked(lock)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)  # while still holding it: waiters on this inode will retry
        os.close(fd)


@contextlib.contextmanager
def _os_errors(op: str, uri: str) -> Iterator[None]:
    """Report filesystem failures (permissions, full disk, ...) as DestinationError naming the object."""
    try:
        yield
    except OSError as exc:
        raise DestinationError(f"local {op} {uri} failed: {exc}") from exc


@contextlib.contextmanager
def _removed_on_error(tmp: Path, uri: str) -> Iterator[None]:
    """A temp file being written: removed when writing it fails; filesystem failures reported as
    DestinationError naming the object."""
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise DestinationError(f"local put {uri} failed: {exc}") from exc
        raise


def _as_stream(stream: BinaryIO | bytes) -> BinaryIO:
    return io.BytesIO(stream) if isinstance(stream, bytes | bytearray | memoryview) else stream


class LocalDestination:
    """Objects as files under `root`; a key `a/b.json` is the file `<root>/a/b.json`.

    Created directories get mode 0755 and files 0644 whatever the process umask, so archives are
    readable by other local users/processes (the archive is meant to be consumed by readers).
    """

    def __init__(self, root: str | Path, name: str = "local") -> None:
        self.root = Path(os.path.abspath(root))
        self.name = name

    def __repr__(self) -> str:
        return f"LocalDestination(root={str(self.root)!r}, name={self.name!r})"

    # -- public API ---------------------------------------------------------------------------

    def uri(self, key: str) -> str:
        """`file://` + the absolute path (RFC 8089 form; reserved characters percent-escaped)."""
        return "file://" + urllib.parse.quote(str(self._path(key)), safe=_URI_SAFE)

    def put(self, key: str, stream: BinaryIO | bytes) -> PutResult:
        """Stream into a temp file, fsync, then rename over the key under the key lock."""
        path, uri = self._path(key), self.uri(key)
        staged = self._stage(path, _as_stream(stream), uri)
        with self._cleanup_on_error(staged), _os_errors("put", uri), _key_lock(path):
            self._commit(staged, path)
        return PutResult(uri=uri, size=staged.size, revision=staged.revision)

    def get(self, key: str) -> GetResult | None:
        """The bytes and their sha256; None when missing (a directory is not an object)."""
        path = self._path(key)
        with _os_errors("get", self.uri(key)):
            data = self._read_or_none(path)
        return None if data is None else GetResult(data=data, revision=_revision(data))

    def open_read(self, key: str) -> BinaryIO:
        """The open file: a rename replaces the directory entry, so the reader keeps its version."""
        path = self._path(key)
        try:
            return open(path, "rb")  # the caller owns and closes the stream
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise FileNotFoundError(errno.ENOENT, "no such object", str(path)) from exc
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise DestinationError(f"local open_read {self.uri(key)} failed: {exc}") from exc

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` with one positioned read (`os.pread`)."""
        check_range(start, length)
        with self.open_read(key) as stream, _os_errors("read_range", self.uri(key)):
            return os.pread(stream.fileno(), length, start) if length else b""

    def put_if(self, key: str, data: bytes, expected_revision: str | None) -> str:
        """Compare-and-swap under the key's flock: check the current revision, then rename."""
        path, uri = self._path(key), self.uri(key)
        staged = self._stage(path, io.BytesIO(data), uri)
        with self._cleanup_on_error(staged), _os_errors("put_if", uri), _key_lock(path):
            current = self._current_revision(path)
            if current != expected_revision:
                raise CASConflict(
                    f"local put_if {uri}: expected revision {expected_revision!r}, found {current!r}"
                )
            self._commit(staged, path)
        return staged.revision

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (a plain string prefix), in key order."""
        start = self._walk_start(prefix)
        with _os_errors("list", f"file://{self.root} prefix {prefix!r}"):
            found = [info for info in self._walk(start) if info.key.startswith(prefix)]
        return iter(sorted(found, key=lambda info: info.key))

    def delete(self, key: str) -> None:
        """Unlink the file (missing is fine), then remove directories left empty, up to the root."""
        path, uri = self._path(key), self.uri(key)
        with _os_errors("delete", uri):
            if not path.parent.is_dir():
                return
            with contextlib.suppress(FileNotFoundError, IsADirectoryError), _key_lock(path):
                os.unlink(path)
            self._prune(path.parent)

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> tuple[str, ...]:
        """Drop upload staging folders untouched for `older_than_s` (their key is not recorded, so
        `prefix` cannot narrow them down: every upload of this root is judged by age alone)."""
        from resources.destinations.local_multipart import STAGING_DIR

        staging, cutoff, dropped = self.root / STAGING_DIR, time.time() - older_than_s, []
        with _os_errors("abort stale uploads", f"file://{staging}"):
            for folder in sorted(staging.iterdir()) if staging.is_dir() else []:
                if folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder, ignore_errors=True)
                    dropped.append(f"{STAGING_DIR}/{folder.name}")
        return tuple(dropped)

    def begin_multipart(self, key: str) -> LocalUpload:
        """An upload whose parts are staged under the root (the destination's own filesystem)."""
        from resources.destinations.local_multipart import LocalUpload

        return LocalUpload.begin(self, key)

    def path(self, key: str) -> Path:
        """The file that holds `key` (DestinationError for a key that could escape the root)."""
        return self._path(key)

    def put_assembled(self, key: str, fill: Callable[[int], None], *, revision: bool = True) -> PutResult:
        """`put`, but `fill(fd)` writes the temp file itself (e.g. with `copy_file_range` from files
        already on this filesystem, so their bytes never pass through Python); then fsync, hash, rename.
        `revision=False` skips the hash (REVISION_NOT_COMPUTED): reading a multi-GB object back for
        its sha256 took longer than copying and fsyncing it (docs/benchmarks.md), and an artifact's
        revision is never compared."""
        path, uri = self._path(key), self.uri(key)
        with _os_errors("put", uri):
            fd, tmp = self._open_temp(path.parent)
        with _removed_on_error(tmp, uri), open(fd, "r+b", closefd=True) as out:
            fill(out.fileno())
            os.fchmod(out.fileno(), FILE_MODE)
            os.fsync(out.fileno())
            out.seek(0)
            digest = hashlib.file_digest(out, "sha256").hexdigest() if revision else REVISION_NOT_COMPUTED
            size = os.fstat(out.fileno()).st_size
        staged = _Staged(tmp=tmp, size=size, revision=digest)
        with self._cleanup_on_error(staged), _os_errors("put", uri), _key_lock(path):
            self._commit(staged, path)
        return PutResult(uri=uri, size=size, revision=staged.revision)

    # -- internals ----------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_check_key(key))

    def _ensure_dir(self, directory: Path) -> None:
        """Create `directory` and missing parents with mode 0755 (umask-proof), fsyncing each parent."""
        missing: list[Path] = []
        probe = directory
        while not probe.is_dir():
            missing.append(probe)
            probe = probe.parent
        for new_dir in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(new_dir, DIR_MODE)
                os.chmod(new_dir, DIR_MODE)
                fsync_dir(new_dir.parent)

    def _open_temp(self, directory: Path) -> tuple[int, Path]:
        """mkstemp in `directory`, re-creating the directory if a concurrent delete pruned it."""
        for _ in range(_CREATE_ATTEMPTS):
            self._ensure_dir(directory)
            try:
                fd, name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=directory)
            except FileNotFoundError:
                continue
            return fd, Path(name)
        raise DestinationError(f"local: directory {directory} keeps disappearing while writing")

    def _stage(self, path: Path, stream: BinaryIO, uri: str) -> _Staged:
        """Copy `stream` into an fsynced 0644 temp file next to `path`, hashing as it goes."""
        with _os_errors("put", uri):
            fd, tmp = self._open_temp(path.parent)
        digest, size = hashlib.sha256(), 0
        with _removed_on_error(tmp, uri), open(fd, "wb", closefd=True) as out:
            while chunk := stream.read(CHUNK_SIZE):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), FILE_MODE)
            os.fsync(out.fileno())
        return _Staged(tmp=tmp, size=size, revision=digest.hexdigest())

    @staticmethod
    @contextlib.contextmanager
    def _cleanup_on_error(staged: _Staged) -> Iterator[None]:
        """Remove the staged temp file if it was not renamed into place (conflict or failure)."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staged.tmp)
            raise

    @staticmethod
    def _commit(staged: _Staged, path: Path) -> None:
        os.replace(staged.tmp, path)
        fsync_dir(path.parent)

    @staticmethod
    def _read_or_none(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _current_revision(self, path: Path) -> str | None:
        data = self._read_or_none(path)
        return None if data is None else _revision(data)

    def _walk_start(self, prefix: str) -> Path:
        """The deepest directory that every key with `prefix` must live under."""
        head = prefix.rpartition("/")[0]
        return self.root.joinpath(*_check_key(head)) if head else self.root

    def _walk(self, start: Path) -> Iterator[ObjectInfo]:
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(RESERVED_PREFIX)]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            base = "" if rel == "." else rel + "/"
            for filename in filenames:
                if filename.startswith(RESERVED_PREFIX):
                    continue
                with contextlib.suppress(FileNotFoundError):  # deleted while we walked
                    size = os.stat(os.path.join(dirpath, filename)).st_size
                    yield ObjectInfo(key=base + filename, size=size)

    def _prune(self, directory: Path) -> None:
        """rmdir empty directories from `directory` up to (not including) the root."""
        while directory != self.root and self.root in directory.parents:
            try:
                os.rmdir(directory)
            except OSError:  # not empty (or already gone / raced with a writer): stop here
                return
            directory = directory.parent
