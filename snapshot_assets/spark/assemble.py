"""Staged parts -> the objects the archive layout names, on every destination.

* jsonl and protobuf: the laredo layout needs ONE object per format. Both concatenate cleanly
  (lines; length-delimited messages, no header or footer), so the parts are streamed in order
  through a chained reader into `Destination.put`: never more than one read buffer in memory,
  whatever the artifact's size. An artifact with no parts is an empty (zero-byte) object, which
  is what both formats define as empty.
* parquet: the parts are uploaded as a folder `<key>/part-00000.parquet`, `part-00001...`
  (renumbered densely, empty parts skipped; the project's reader and Spark read a folder).
  An artifact with no rows still gets one valid, empty file so it stays readable. Parts left under
  the folder by an earlier attempt with more parts are deleted, so a re-run converges.

Returns, per format, the manifest's `FormatRef` (URI and size on the first destination).
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from resources.destinations.base import Destination
from snapshot_assets.archive import keys
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.manifest import FormatRef
from snapshot_assets.spark.parts import BuiltArtifact, Reuse, StagedFormat

log = logging.getLogger(__name__)

FOLDER_FORMATS = frozenset({"parquet"})
_CHUNK = 1 << 20


class _Source:
    """An object of the destination read forward once; consecutive ranges are served in order."""

    def __init__(self, stream: BinaryIO, key: str) -> None:
        self.stream, self.key, self.at = stream, key, 0

    def seek_forward(self, start: int) -> None:
        if start < self.at:
            raise RuntimeError(f"ranges of {self.key} must be read in increasing order ({start} < {self.at})")
        while self.at < start:
            skipped = self.stream.read(min(_CHUNK, start - self.at))
            if not skipped:
                raise RuntimeError(f"{self.key} ends at {self.at}, before byte {start}")
            self.at += len(skipped)


class ChainedReader(io.RawIOBase):
    """A read-only stream over an artifact's pieces, one after another: staged files (each opened
    only when reached) and byte ranges of objects already in `dest` (each object read forward once)."""

    def __init__(self, pieces: Iterable[Path | Reuse], dest: Destination | None = None) -> None:
        super().__init__()
        self._pieces = iter(pieces)
        self._dest = dest
        self._current: BinaryIO | None = None
        self._left = -1  # bytes left in the current range (-1: a whole file)
        self._sources: dict[str, _Source] = {}

    def readable(self) -> bool:
        return True

    def _next(self) -> bool:
        piece = next(self._pieces, None)
        if piece is None:
            return False
        if isinstance(piece, Path):
            self._current, self._left = open(piece, "rb"), -1  # noqa: SIM115 - closed when exhausted or on close()
            return True
        if self._dest is None:
            raise RuntimeError(f"a reused range of {piece.source_key} needs the destination it is copied from")
        source = self._sources.get(piece.source_key)
        if source is None:
            source = self._sources[piece.source_key] = _Source(self._dest.open_read(piece.source_key), piece.source_key)
        source.seek_forward(piece.start)
        self._current, self._left = source.stream, piece.length
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._current is None and not self._next():
                return 0
            assert self._current is not None
            view = buffer if self._left < 0 else buffer[: self._left]
            n = self._current.readinto(view) if view.nbytes else 0  # type: ignore[attr-defined]
            if n:
                if self._left >= 0:
                    self._left -= n
                    source = next(s for s in self._sources.values() if s.stream is self._current)
                    source.at += n
                return int(n)
            if self._left > 0:
                raise RuntimeError("a reused object ended before the range copied from it")
            if self._left < 0:
                self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None and self._left < 0:
            self._current.close()
        self._current = None
        for source in self._sources.values():
            source.stream.close()
        self._sources.clear()
        super().close()


def artifact_key(key_prefix: str, built: BuiltArtifact, epoch: int, extension: str) -> str:
    """The object key of `built` in one format (archive-format.md section 1)."""
    if built.kind == "snapshot":
        return keys.snapshot_key(key_prefix, epoch, built.to_position, extension)
    return keys.diff_key(key_prefix, epoch, built.from_position or "", built.to_position, extension)


def _put_concatenated(dest: Destination, key: str, staged: StagedFormat) -> tuple[str, int]:
    with io.BufferedReader(ChainedReader(staged.parts, dest), buffer_size=_CHUNK) as stream:
        result = dest.put(key, stream)
    if result.size != staged.bytes:
        raise RuntimeError(f"{dest.uri(key)}: wrote {result.size} bytes, the parts hold {staged.bytes}")
    return result.uri, result.size


def empty_artifact(kind: str, format_id: str) -> bytes:
    """A valid artifact with nothing in it, from the format's own writer."""
    fmt = get_format(format_id)
    with tempfile.SpooledTemporaryFile() as out:
        writer = fmt.snapshot_writer(out) if kind == "snapshot" else fmt.diff_writer(out)  # type: ignore[arg-type]
        writer.close()
        out.seek(0)
        return out.read()


def _put_folder(dest: Destination, key: str, kind: str, staged: StagedFormat) -> tuple[str, int]:
    ext = get_format(staged.format_id).extension
    parts = [p for p in staged.files() if p.stat().st_size > 0]
    written: set[str] = set()
    size = 0
    if not parts:
        part_key = f"{key}/part-00000{ext}"
        size += dest.put(part_key, empty_artifact(kind, staged.format_id)).size
        written.add(part_key)
    for i, path in enumerate(parts):
        part_key = f"{key}/part-{i:05d}{ext}"
        with open(path, "rb") as src:
            size += dest.put(part_key, src).size
        written.add(part_key)
    for stale in [o.key for o in dest.list(key + "/") if o.key not in written]:
        dest.delete(stale)
    return dest.uri(key), size


def assemble(built: BuiltArtifact, destinations: Sequence[Destination], key_prefix: str,
             epoch: int) -> dict[str, FormatRef]:
    """Upload every format of `built` to every destination; the manifest's format references."""
    if not destinations:
        raise ValueError("assemble needs at least one destination")
    refs: dict[str, FormatRef] = {}
    for fid, staged in built.formats.items():
        key = artifact_key(key_prefix, built, epoch, get_format(fid).extension)
        for i, dest in enumerate(destinations):
            if fid in FOLDER_FORMATS:
                uri, size = _put_folder(dest, key, built.kind, staged)
            else:
                uri, size = _put_concatenated(dest, key, staged)
            if i == 0:
                refs[fid] = FormatRef(uri=uri, size_bytes=size)
        log.info("assembled %s %s: %d part(s), %d bytes, %d destination(s)", built.kind, fid,
                 len(staged.parts), refs[fid].size_bytes, len(destinations))
    return refs


def sizes(refs: Mapping[str, FormatRef]) -> dict[str, int]:
    """Per-format sizes, as the manifest and the run metadata report them."""
    return {fid: ref.size_bytes for fid, ref in refs.items()}
