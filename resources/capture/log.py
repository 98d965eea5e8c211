"""The durable per-writer append log: an event is acknowledged only once its record is fsync'd here.

Each writer has a directory of segments (`seg-<first sequence>.log`, records framed as
`length, crc32, Event bytes`) and `flushed.json`, the first sequence not yet in a stored page.
Appends write under the writer's lock; durability is a group commit: a publisher waits until the
file is fsync'd through its own record, and whoever runs the fsync covers every record written
before it started, so concurrent publishers share one fsync instead of queueing for their own.

After a crash, `recover` reads every record at or after the flushed mark; a torn or zero-filled
tail (records whose fsync never finished, so never acknowledged) is cut off.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from resources.capture.keys import writer_path
from resources.durable_files import fsync_dir, write_json_atomic
from resources.proto.prism.snapshotter.page_pb2 import Event

_HEADER = struct.Struct(">II")  # record length, crc32 of the record
_FLUSHED = "flushed.json"
# fdatasync makes the appended bytes and the size that reaches them durable, skipping the
# timestamps fsync also writes (several times cheaper per acknowledgement on ext4); the segment's
# directory entry is made durable once, when it is created.
_DATASYNC = getattr(os, "fdatasync", os.fsync)


class LogCorrupt(RuntimeError):
    """A sealed segment (one that was fully fsync'd before the next began) does not read back."""


class Segment:
    """One append-only file and its group commit: `written` bytes are in the file, `synced` are durable."""

    def __init__(self, path: Path, first: int) -> None:
        self.path, self.first = path, first
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.written = os.fstat(self._fd).st_size
        self.synced = 0
        self._sync_lock = threading.Lock()
        self.closed = False

    def write(self, data: bytes) -> int:
        """Append (caller holds the writer's lock); the end offset a publisher waits for. A failed
        write (disk full) is cut back off, so no half record sits before the next one: recovery
        stops at the first bad record and would otherwise drop the acknowledged ones after it."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            os.ftruncate(self._fd, self.written)
            raise
        self.written += len(data)
        return self.written

    def truncate(self, offset: int) -> None:
        """Cut the file back to `offset` (caller holds the writer's lock: nothing was appended after)."""
        with self._sync_lock:
            os.ftruncate(self._fd, offset)
            self.written = offset
            self.synced = min(self.synced, offset)  # a later record must not ride on a sync of cut bytes

    def sync_through(self, offset: int) -> None:
        """Return once the file is durable through `offset`: fsync, or ride on an fsync that covers it."""
        if self.synced >= offset:
            return
        with self._sync_lock:
            if self.synced >= offset:
                return  # the fsync we waited behind covered us
            target = self.written
            _DATASYNC(self._fd)
            self.synced = target

    def close(self) -> None:
        with self._sync_lock:
            if not self.closed:
                os.fsync(self._fd)
                self.synced = self.written
                os.close(self._fd)
                self.closed = True


@dataclass(frozen=True)
class Recovered:
    events: list[Event]  # durable, not yet in a stored page, in sequence order
    next_sequence: int


def encode_record(event: Event) -> bytes:
    body = event.SerializeToString(deterministic=True)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _read_records(path: Path) -> tuple[list[Event], int]:
    """The whole records of `path` and the offset where whole records end."""
    data = path.read_bytes()
    events: list[Event] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        body = data[pos + _HEADER.size: pos + _HEADER.size + length]
        if length == 0 or len(body) < length or zlib.crc32(body) != crc:
            break
        event = Event()
        event.ParseFromString(body)
        events.append(event)
        pos += _HEADER.size + length
    return events, pos


class WriterLog:
    """The segments and flushed mark of one writer (callers serialize appends with their own lock)."""

    def __init__(self, root: Path, writer_id: str) -> None:
        self.writer_id = writer_id
        self.dir = root / writer_path(writer_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.current: Segment | None = None
        self._sealed: list[_SealedFile] = []

    @staticmethod
    def writers(root: Path) -> Iterator[str]:
        """The writer ids that have a log under `root`."""
        if root.is_dir():
            for d in sorted(root.iterdir()):
                if d.is_dir():
                    yield unquote(d.name)

    def _segments(self) -> list[tuple[int, Path]]:
        return sorted((int(p.stem.split("-", 1)[1]), p) for p in self.dir.glob("seg-*.log"))

    def flushed_mark(self) -> int:
        path = self.dir / _FLUSHED
        if not path.exists():
            return 0
        return int(json.loads(path.read_text())["next"])

    def recover(self) -> Recovered:
        """Read what is durable and unflushed; cut a torn tail off the last segment."""
        mark = self.flushed_mark()
        segments = self._segments()
        events: list[Event] = []
        next_sequence = mark
        for i, (first, path) in enumerate(segments):
            records, end = _read_records(path)
            if end < path.stat().st_size:
                if i != len(segments) - 1:
                    raise LogCorrupt(f"capture log {path} is damaged at byte {end} (a sealed segment)")
                with open(path, "r+b") as f:  # records past here were never fsync'd, so never acknowledged
                    f.truncate(end)
                    os.fsync(f.fileno())
            if not records:  # nothing durable in it (a crash right after it was created, or a torn first record)
                path.unlink()
                fsync_dir(self.dir)
                continue
            for event in records:
                next_sequence = max(next_sequence, event.sequence + 1)
                if event.sequence >= mark:
                    events.append(event)
            self._sealed.append(_SealedFile(path, first))
        return Recovered(events=events, next_sequence=next_sequence)

    def append(self, records: bytes, first_sequence: int) -> Segment:
        """Write `records` (caller holds the writer's lock) into the current segment, opening one at
        `first_sequence` if there is none; the segment to `sync_through` for durability."""
        if self.current is None:
            self.current = Segment(self.dir / f"seg-{first_sequence:020d}.log", first_sequence)
            fsync_dir(self.dir)
        self.current.write(records)
        return self.current

    def sync(self) -> None:
        """Make every record written so far durable."""
        if self.current is not None:
            self.current.sync_through(self.current.written)

    def rotate(self) -> None:
        """Seal the current segment (every event in it is being flushed); the next append opens a new one."""
        if self.current is not None:
            self.current.close()
            self._sealed.append(_SealedFile(self.current.path, self.current.first))
            self.current = None

    def mark_flushed(self, next_sequence: int, log_end: int) -> None:
        """Record that every event below `next_sequence` is in a stored page, then drop the sealed
        segments that hold nothing else (the mark is durable first, so a crash in between only
        leaves a segment recovery skips). `log_end` is the writer's next unassigned sequence."""
        write_json_atomic(self.dir / _FLUSHED, {"next": next_sequence})
        keep: list[_SealedFile] = []
        starts = [s.first for s in self._sealed] + [self.current.first if self.current else log_end]
        for i, seg in enumerate(self._sealed):
            if starts[i + 1] <= next_sequence:
                seg.path.unlink(missing_ok=True)
            else:
                keep.append(seg)
        if len(keep) != len(self._sealed):
            fsync_dir(self.dir)
        self._sealed = keep

    def close(self) -> None:
        self.rotate()


@dataclass(frozen=True)
class _SealedFile:
    path: Path
    first: int
