"""Staged parts -> the objects the archive layout names, on every destination.

* jsonl and protobuf: the laredo layout needs ONE object per format. Both concatenate cleanly
  (lines; length-delimited messages, no header or footer), so the parts are streamed in order
  through a chained reader into `Destination.put`: never more than one read buffer in memory,
  whatever the artifact's size. An artifact with no parts is an empty (zero-byte) object, which
  is what both formats define as empty. A snapshot built from the bucketed state also names byte
  ranges of the previous snapshot object (`Reuse`: its untouched buckets): it is assembled as a
  multipart upload (`_put_pieces`) whose reused ranges are copied on the destination itself.
* parquet: a snapshot's object is its pieces too (parquet_pieces.py: the magic, each bucket's
  row groups, the merged footer), assembled like the byte formats; a diff is ONE staged file
  (`parquet_artifact.write_diff`), uploaded as the object. (Archives written before kept parquet
  as a folder of part files; the readers read both.)
* pieces the tasks already sent (`Sent`, a build given its targets: a cluster): each format's
  upload on each destination is completed here from the ordered pieces and reused ranges
  (`task_objects.complete_pieces`); the bytes never pass through this host, only the small heads
  merged into parts of S3's minimum size. A failure aborts every upload of the artifact.
* a snapshot built from the bucketed state also gets its key index object (archive/key_index.py),
  made from the entries the state keeps per bucket.
* sidecars (`BuiltArtifact.sidecars`: the versions object, archive/versions.py) are assembled like
  a byte format, beside the artifact; the manifest does not list them.

Returns, per format, the manifest's `FormatRef` (URI and size on the first destination).
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from resources.destinations.base import Destination
from resources.destinations.multipart import (
    Assembling,
    CopyRange,
    Fresh,
    FreshSlice,
    MultipartUpload,
    begin,
    plan_parts,
    write_planned,
)
from snapshot_assets.archive import versions
from snapshot_assets.archive.formats import get_format
from snapshot_assets.archive.key_index import index_key
from snapshot_assets.archive.manifest import FormatRef
from snapshot_assets.spark.parts import BuiltArtifact, Reuse, StagedFormat
from snapshot_assets.spark.pieces import Sent, Targets
from snapshot_assets.spark.task_objects import SentPiece, complete_pieces

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
#: How many of an artifact's objects (formats and sidecars) are completed at once.
ASSEMBLY_THREADS = 4
_SIDECAR_EXTENSIONS = {versions.VERSIONS: versions.EXTENSION}
#: Whether completing an artifact's object computes its revision. It does not: an artifact is written
#: once under a key of its own and its revision is never compared (only the manifest and the other
#: small objects are swapped with `put_if`), and on a local destination that revision is the sha256
#: of the whole object read back: 2.2 s of a 10,000,000-row re-base's object assembly per 1.9 GB
#: object (docs/benchmarks.md). S3 returns its ETag with the completion either way.
_ARTIFACT_REVISION = False


class ChainedReader(io.RawIOBase):
    """A read-only stream over several files, one after another (each opened only when reached)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        super().__init__()
        self._paths = iter(paths)
        self._current: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._current is None:
                path = next(self._paths, None)
                if path is None:
                    return 0
                self._current = open(path, "rb")  # noqa: SIM115 - closed when exhausted or on close()
            n = self._current.readinto(buffer)
            if n:
                return int(n)
            self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
        super().close()


def artifact_key(key_prefix: str, built: BuiltArtifact, epoch: int, extension: str) -> str:
    """The object key of `built` in one format (archive-format.md section 1)."""
    return Targets((), key_prefix, epoch).key(built.kind, built.from_position, built.to_position, extension)


class _FileSlice(io.RawIOBase):
    """Bytes [offset, offset + length) of a staged file, as a stream that closes its file."""

    def __init__(self, path: Path, offset: int, length: int) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._file.seek(offset)
        self._left = length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")[: self._left]
        n = self._file.readinto(view) if view.nbytes else 0
        self._left -= n
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def _piece(part: Path | Reuse | Sent, where: str) -> Fresh | CopyRange:
    if isinstance(part, Path):
        return Fresh(part.stat().st_size)
    if isinstance(part, Reuse):
        return CopyRange(part.source_key, part.start, part.length)
    raise RuntimeError(f"{where}: piece {part.piece} was sent by a task, but the build has no upload for it")


def _put_pieces(dest: Destination, key: str, staged: StagedFormat) -> tuple[str, int]:
    """An object made of staged files and ranges of objects already on `dest`: a multipart upload
    whose reused ranges are copied on the destination (S3 UploadPartCopy, local copy_file_range),
    so the bytes of a re-base's untouched buckets never pass through this host."""
    pieces = [_piece(p, dest.uri(key)) for p in staged.parts]
    files = {i: p for i, p in enumerate(staged.parts) if isinstance(p, Path)}

    def fresh(segment: FreshSlice) -> BinaryIO:
        return io.BufferedReader(_FileSlice(files[segment.piece], segment.offset, segment.length))

    upload = begin(dest, key)
    with Assembling(upload) as assembling:
        plan = plan_parts(pieces)
        for part in plan:
            write_planned(upload, part, fresh)
        result = assembling.complete([part.number for part in plan], revision=_ARTIFACT_REVISION)
    if result.size != staged.bytes:
        raise RuntimeError(f"{dest.uri(key)}: wrote {result.size} bytes, the pieces hold {staged.bytes}")
    return result.uri, result.size


def _complete_sent(upload: MultipartUpload, index: int, staged: StagedFormat, parts_per_piece: int) -> tuple[str, int]:
    """Complete the upload destination `index` received the tasks' pieces on, in the pieces' order."""
    items: list[tuple[int, SentPiece | CopyRange]] = []
    for part in staged.parts:
        if isinstance(part, Sent):
            items.append((part.piece, part.sent[index]))
        elif isinstance(part, Reuse):
            items.append((part.piece, CopyRange(part.source_key, part.start, part.length)))
        else:
            raise RuntimeError(f"{upload.uri()}: staged file {part} among pieces the tasks sent")
    result = complete_pieces(upload, items, parts_per_piece, revision=_ARTIFACT_REVISION)
    if result.size != staged.bytes:
        raise RuntimeError(f"{upload.uri()}: wrote {result.size} bytes, the pieces hold {staged.bytes}")
    return result.uri, result.size


def _put_concatenated(dest: Destination, key: str, staged: StagedFormat) -> tuple[str, int]:
    if any(isinstance(p, Reuse) for p in staged.parts):
        return _put_pieces(dest, key, staged)
    with io.BufferedReader(ChainedReader(staged.files()), buffer_size=_CHUNK) as stream:
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


def assemble(built: BuiltArtifact, destinations: Sequence[Destination], key_prefix: str,
             epoch: int) -> dict[str, FormatRef]:
    """Upload every format of `built` to every destination; the manifest's format references."""
    if not destinations:
        raise ValueError("assemble needs at least one destination")
    try:
        return _assemble(built, destinations, key_prefix, epoch)
    except BaseException:
        if built.uploads is not None:
            built.uploads.abort()
        raise


def _assemble(built: BuiltArtifact, destinations: Sequence[Destination], key_prefix: str,
              epoch: int) -> dict[str, FormatRef]:
    """Every object at once, one thread each: completing an object is kernel copies, an fsync and
    a hash on a local destination, and server-side copies on S3, which release the GIL, so the
    objects' completions overlap (measured in docs/benchmarks.md)."""
    objects = {fid: (staged, artifact_key(key_prefix, built, epoch, get_format(fid).extension))
               for fid, staged in built.formats.items()}
    for sid, staged in built.sidecars.items():  # beside the artifact, not in the manifest
        objects[sid] = (staged, artifact_key(key_prefix, built, epoch, _SIDECAR_EXTENSIONS[sid]))
    with ThreadPoolExecutor(max_workers=max(1, min(len(objects), ASSEMBLY_THREADS)),
                            thread_name_prefix="assemble-object") as pool:
        done = {fid: pool.submit(_put_object, built, fid, staged, key, destinations)
                for fid, (staged, key) in objects.items()}
        placed = {fid: future.result() for fid, future in done.items()}
    refs = {fid: placed[fid] for fid in built.formats}
    _put_key_index(built, destinations, key_prefix, epoch, refs)
    return refs


def _put_object(built: BuiltArtifact, fid: str, staged: StagedFormat, key: str,
                destinations: Sequence[Destination]) -> FormatRef:
    """One object of `built` (a format, or a sidecar) on every destination; its URI and size on the first."""
    sent = built.uploads.by_format.get(fid) if built.uploads is not None else None
    if sent is not None and (len(sent) != len(destinations) or
                             any(u.uri() != d.uri(key) for u, d in zip(sent, destinations, strict=False))):
        raise ValueError(f"the {fid} pieces were sent to {[u.uri() for u in sent]}, not to "
                         f"{[d.uri(key) for d in destinations]}: build and assemble need the same targets")
    ref: FormatRef | None = None
    for i, dest in enumerate(destinations):
        if sent is not None:
            assert built.uploads is not None
            uri, size = _complete_sent(sent[i], i, staged, built.uploads.parts_per_piece[fid])
        else:
            uri, size = _put_concatenated(dest, key, staged)
        ref = ref or FormatRef(uri=uri, size_bytes=size)
    assert ref is not None
    log.info("assembled %s %s: %d part(s), %d bytes, %d destination(s)", built.kind, fid,
             len(staged.parts), ref.size_bytes, len(destinations))
    return ref


def _put_key_index(built: BuiltArtifact, destinations: Sequence[Destination], key_prefix: str, epoch: int,
                   refs: Mapping[str, FormatRef]) -> None:
    """The snapshot's key index (archive/key_index.py) beside it on every destination, before the
    commit, so a committed snapshot built from the state always has one."""
    state = built.details.get("state")
    index = state.key_index() if built.kind == "snapshot" and state is not None else None
    if index is None:
        return
    for fid, size in index.sizes.items():
        if fid in refs and refs[fid].size_bytes != size:
            raise RuntimeError(f"the key index spans {size} bytes of {fid}, the object holds {refs[fid].size_bytes}")
    key = index_key(key_prefix, epoch, built.to_position)
    data = index.dumps()
    for dest in destinations:
        dest.put(key, data)
    log.info("key index of snapshot %s: %d entries, %d bytes", built.to_position, len(index.sks), len(data))


def sizes(refs: Mapping[str, FormatRef]) -> dict[str, int]:
    """Per-format sizes, as the manifest and the run metadata report them."""
    return {fid: ref.size_bytes for fid, ref in refs.items()}
