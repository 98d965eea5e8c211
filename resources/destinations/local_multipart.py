"""Multipart uploads on a local destination: parts staged on the destination's own filesystem.

Why there: on a cluster a local destination is a mount every host sees (the archive lives there),
so staging its parts under the same root lets a task on any host write them, and lets `complete`
assemble the object with `copy_file_range`, which stays in the kernel (and shares extents, i.e.
reflinks, on filesystems that support it: btrfs, XFS). `copy_part` reuses a byte range of an
existing object the same way. Where the kernel refuses (an old kernel, another filesystem) a
buffered copy takes over.

Layout: `<root>/.~multipart/<upload id>/part-<number:05d>`; the reserved `.~` prefix keeps it out of
listings and out of reach of keys. A part is written to a temp name and renamed, so a retried task
attempt replaces a part atomically. `complete` checks S3's rules (multipart.check_parts), builds the
object in a temp file beside its key and renames it into place like `put`, then drops the staging.

A copied range (`copy_part`) is not copied when it is asked for: the part is a hard link to the
source object, `part-<number:05d>@<start>+<length>`, and `complete` copies the range straight from it
into the object. So a re-base's reused bytes are written once, not into a part file (and fsynced)
and then again into the object. The link holds the bytes as they were when the part was asked for,
as S3's UploadPartCopy does: replacing or deleting the source object afterwards does not change
them. Where the filesystem refuses the link, the range is copied into a part file as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from resources.destinations.base import PutResult
from resources.destinations.local import CHUNK_SIZE, DIR_MODE, FILE_MODE, RESERVED_PREFIX, LocalDestination
from resources.destinations.multipart import (
    CopyRange,
    MultipartError,
    PartData,
    PartReceipt,
    check_numbers,
    check_part_number,
    check_parts,
    check_range,
    staged_key,
    staged_prefix,
)

STAGING_DIR = RESERVED_PREFIX + "multipart"
_CREATE_ATTEMPTS = 8
# copy_file_range failures that mean "not here, copy it yourself" rather than a broken file.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM})
# os.link failures that mean "no hard links here": the range is copied into a part file instead.
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES})


def copy_range(src: int, dst: int, start: int, length: int, dst_start: int, where: str) -> None:
    """Copy `length` bytes from offset `start` of `src` to offset `dst_start` of `dst` (file descriptors):
    in the kernel with copy_file_range, else through a buffer. MultipartError if `src` ends early."""
    done = 0
    try:
        while done < length:
            copied = os.copy_file_range(src, dst, length - done, start + done, dst_start + done)
            if copied == 0:
                raise MultipartError(f"{where}: the source ended {length - done} bytes before the range did")
            done += copied
        return
    except OSError as exc:
        if exc.errno not in _NO_KERNEL_COPY:
            raise
    while done < length:
        chunk = os.pread(src, min(CHUNK_SIZE, length - done), start + done)
        if not chunk:
            raise MultipartError(f"{where}: the source ended {length - done} bytes before the range did")
        os.pwrite(dst, chunk, dst_start + done)
        done += len(chunk)


def _as_stream(data: PartData) -> Iterator[bytes | bytearray]:
    if isinstance(data, bytes | bytearray):
        yield data  # as it is: a merged part's buffer is not copied again
        return
    while chunk := data.read(CHUNK_SIZE):
        yield chunk


@dataclass(frozen=True, slots=True)
class LocalUpload:
    """One upload to a LocalDestination (picklable: the root path, the key and the upload id)."""

    dest: LocalDestination
    key: str
    upload_id: str

    @classmethod
    def begin(cls, dest: LocalDestination, key: str) -> LocalUpload:
        dest.path(key)  # reject a bad key now, not at complete
        upload = cls(dest, key, os.urandom(12).hex())
        for _ in range(_CREATE_ATTEMPTS):  # an abort may remove the shared folder between our two mkdirs
            with contextlib.suppress(FileNotFoundError):
                upload.staging.mkdir(mode=DIR_MODE, parents=True)
                return upload
        raise MultipartError(f"{upload._where()}: its staging folder {upload.staging} keeps disappearing")

    @property
    def staging(self) -> Path:
        return self.dest.root / STAGING_DIR / self.upload_id

    def uri(self) -> str:
        return self.dest.uri(self.key)

    def _where(self, number: int | None = None) -> str:
        return f"local multipart {self.uri()} (upload {self.upload_id})" + (f" part {number}" if number else "")

    def _part(self, number: int) -> Path:
        return self.staging / f"part-{number:05d}"

    def _links(self, number: int) -> list[Path]:
        """The reference parts of `number` (`part-N@start+length`, hard links to a source object)."""
        return sorted(self.staging.glob(f"part-{number:05d}@*"))

    def _drop_other_parts(self, number: int, keep: Path | None) -> None:
        """Before a new part `number` is renamed into place, remove what an earlier attempt left under
        the other name (a part file, or reference parts): one part per number, the latest."""
        for old in [self._part(number), *self._links(number)]:
            if old != keep:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()

    def _kept(self, number: int, names: Sequence[str] | None = None) -> tuple[Path, int, int] | None:
        """Where part `number`'s bytes are: (file, start, length); None when it was never written.
        `names`: the files staged for this part (its part file before its links), when the caller
        listed the folder once for many parts (`_staged`); else they are looked up here."""
        part = self._part(number)
        for name in names if names is not None else [part.name, *(link.name for link in self._links(number))]:
            if name == part.name:
                with contextlib.suppress(FileNotFoundError):
                    return part, 0, part.stat().st_size
                continue
            start, _, length = name.split("@", 1)[1].partition("+")
            return self.staging / name, int(start), int(length)
        return None

    def _staged(self) -> dict[str, list[str]]:
        """The staging folder's files by the part they hold (`part-N`: the part file, then its links
        `part-N@start+length`), from one listing: a lookup per part would grow with the parts squared."""
        staged: dict[str, list[str]] = {}
        for name in sorted(os.listdir(self.staging)):
            staged.setdefault(name.split("@", 1)[0], []).append(name)
        return staged

    @contextlib.contextmanager
    def _new_part(self, number: int) -> Iterator[int]:
        """A temp file in the staging dir for part `number`, renamed over the part when the block succeeds."""
        check_part_number(number, self._where())
        if not self.staging.is_dir():
            raise MultipartError(f"{self._where(number)}: the upload is not open (completed or aborted)")
        fd, name = tempfile.mkstemp(prefix=RESERVED_PREFIX + "tmp.", dir=self.staging)
        try:
            yield fd
            os.fchmod(fd, FILE_MODE)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            self._drop_other_parts(number, None)
            os.replace(name, self._part(number))
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
            if isinstance(exc, OSError):
                raise MultipartError(f"{self._where(number)} failed: {exc}") from exc
            raise

    def _receipt(self, number: int) -> PartReceipt:
        kept = self._kept(number)
        if kept is None:
            raise MultipartError(f"{self._where(number)}: the part disappeared as it was written")
        path, start, length = kept
        stat = path.stat()
        return PartReceipt(number, length, f"{stat.st_ino}-{stat.st_mtime_ns}-{start}")

    def write_part(self, number: int, data: PartData) -> PartReceipt:
        with self._new_part(number) as fd, open(fd, "wb", closefd=False) as out:
            for chunk in _as_stream(data):
                out.write(chunk)
        return self._receipt(number)

    def copy_part(self, number: int, source_key: str, start: int, length: int) -> PartReceipt:
        where = f"{self._where(number)} from {self.dest.uri(source_key)}"
        check_range(start, length, where)
        if self._link_part(number, source_key, start, length, where):
            return self._receipt(number)
        with self._open_source(source_key, start, length, where) as src, self._new_part(number) as fd:
            copy_range(src, fd, start, length, 0, where)
        return self._receipt(number)

    def _link_part(self, number: int, source_key: str, start: int, length: int, where: str) -> bool:
        """Make part `number` a hard link to the source object's range; False where the filesystem
        refuses links (the caller copies the range instead)."""
        check_part_number(number, self._where())
        if not self.staging.is_dir():
            raise MultipartError(f"{self._where(number)}: the upload is not open (completed or aborted)")
        source = self.dest.path(source_key)
        temp = self.staging / f"{RESERVED_PREFIX}tmp.link.{os.urandom(6).hex()}"
        try:
            os.link(source, temp, follow_symlinks=False)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise MultipartError(f"{where}: no such object") from exc
        except OSError as exc:
            if exc.errno in _NO_LINK:
                return False
            raise MultipartError(f"{where} failed: {exc}") from exc
        try:
            size = temp.stat().st_size  # the object as linked (it may have been replaced since the call)
            if start + length > size:
                raise MultipartError(f"{where}: bytes {start}..{start + length} are beyond its {size} bytes")
            final = self.staging / f"part-{number:05d}@{start}+{length}"
            self._drop_other_parts(number, final)
            os.replace(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        return True

    def read_range(self, source_key: str, start: int, length: int) -> bytes:
        where = f"local read {self.dest.uri(source_key)}"
        check_range(start, length, where)
        with self._open_source(source_key, start, length, where) as src:
            return os.pread(src, length, start)

    def stage(self, name: str, data: bytes) -> CopyRange:
        if not self.staging.is_dir():
            raise MultipartError(f"{self._where()}: the upload is not open (completed or aborted)")
        key = staged_key(self.key, self.upload_id, name)
        self.dest.put(key, data)
        return CopyRange(key, 0, len(data))

    @contextlib.contextmanager
    def _open_source(self, source_key: str, start: int, length: int, where: str) -> Iterator[int]:
        try:
            fd = os.open(self.dest.path(source_key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise MultipartError(f"{where}: no such object") from exc
        try:
            size = os.fstat(fd).st_size
            if start + length > size:
                raise MultipartError(f"{where}: bytes {start}..{start + length} are beyond its {size} bytes")
            yield fd
        finally:
            os.close(fd)

    def complete(self, numbers: Sequence[int], *, revision: bool = True) -> PutResult:
        where = self._where()
        if not self.staging.is_dir():
            raise MultipartError(f"{where}: the upload is not open (completed or aborted)")
        check_numbers(numbers, where)
        staged = self._staged()
        kept = {n: self._kept(n, staged.get(self._part(n).name, [])) for n in numbers}
        missing = [n for n, part in kept.items() if part is None]
        if missing:
            raise MultipartError(f"{where}: parts {missing[:10]} were never written")
        parts = [(number, part) for number, part in kept.items() if part is not None]
        check_parts([(number, length) for number, (_, _, length) in parts], where)

        def fill(out: int) -> None:
            offset = 0
            for number, (path, start, length) in parts:
                with self._open_source_part(path) as src:
                    copy_range(src, out, start, length, offset, f"{where} part {number}")
                offset += length

        result = self.dest.put_assembled(self.key, fill, revision=revision)
        self.abort()
        return result

    @contextlib.contextmanager
    def _open_source_part(self, path: Path) -> Iterator[int]:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def abort(self) -> None:
        for info in list(self.dest.list(staged_prefix(self.key, self.upload_id))):
            self.dest.delete(info.key)
        shutil.rmtree(self.staging, ignore_errors=True)
        with contextlib.suppress(OSError):  # the shared staging folder, once no upload uses it
            os.rmdir(self.staging.parent)
