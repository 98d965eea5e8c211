"""A task's piece of an artifact: a staged file on a local runtime, or bytes sent straight into the destinations.

Why two ways: on a local runtime the tasks and the driver share a disk, so a task writes its piece
(a bucket's bytes in one format, a diff part) into the staging folder and the driver uploads the
staged files in order. On a cluster nothing is shared but the destinations: the driver begins one
multipart upload per format and destination (`Uploads.begin`, before the Spark job), each task
spools its piece in its own temp space and sends it into every upload of its format
(`task_objects.send_piece`: head staged beside the upload, body as parts numbered from the piece's
block), and the driver completes each upload from the ordered piece list (`task_objects.
complete_pieces`, which also copies reused ranges of an earlier object inside the destination).
Either way the object's bytes are the pieces concatenated in order, so both give the same object.

A task reports where its piece went as one string: the staged file's path, or (sent) the JSON of
what each destination's upload received; `Sent.parse` reads it back on the driver.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from resources.destinations.base import Destination
from resources.destinations.multipart import MiB, MultipartUpload, begin
from snapshot_assets.archive import keys
from snapshot_assets.spark.task_objects import SentPiece, parts_per_piece, send_piece

_SPOOL_IN_MEMORY = 16 * MiB  # beyond this a piece spills to the task's own temp dir


@dataclass(frozen=True, slots=True)
class Targets:
    """Where an artifact's objects go when its tasks send their pieces there themselves."""

    destinations: tuple[Destination, ...]
    key_prefix: str
    epoch: int

    def key(self, kind: str, from_position: str | None, to_position: str, extension: str) -> str:
        """The object key of an artifact in one format (archive-format.md section 1)."""
        if kind == "snapshot":
            return keys.snapshot_key(self.key_prefix, self.epoch, to_position, extension)
        return keys.diff_key(self.key_prefix, self.epoch, from_position or "", to_position, extension)


@dataclass(frozen=True, slots=True)
class Uploads:
    """The open uploads of one artifact: per format, one per destination (in the destinations'
    order), and how many part numbers each piece of that format may use. Begun by the driver,
    pickled into tasks."""

    by_format: Mapping[str, tuple[MultipartUpload, ...]]
    parts_per_piece: Mapping[str, int]

    @classmethod
    def begin(cls, destinations: Sequence[Destination], object_keys: Mapping[str, str], pieces: int) -> Uploads:
        """One upload per format (`object_keys`: format -> key) and destination, for `pieces` pieces
        each; what was begun is aborted again if one cannot be."""
        per = parts_per_piece(pieces)
        begun: dict[str, tuple[MultipartUpload, ...]] = {}
        try:
            for fid, key in object_keys.items():
                opened: list[MultipartUpload] = []
                begun[fid] = ()
                for dest in destinations:
                    opened.append(begin(dest, key))
                    begun[fid] = tuple(opened)
        except BaseException:
            Uploads(begun, {}).abort()
            raise
        return cls(begun, dict.fromkeys(begun, per))

    def merged(self, other: Uploads | None) -> Uploads:
        """These uploads and `other`'s (other formats) as one set."""
        if other is None:
            return self
        return Uploads({**self.by_format, **other.by_format}, {**self.parts_per_piece, **other.parts_per_piece})

    def abort(self) -> None:
        """Drop every upload and what was sent to it (a failed build leaves nothing behind)."""
        for uploads in self.by_format.values():
            for upload in uploads:
                with contextlib.suppress(Exception):
                    upload.abort()


class PieceWriter:
    """One piece of one format, written by a task: into `staged` (a file, written under a temporary
    name and renamed, so a retried attempt never leaves a torn piece) or spooled and then sent to
    every upload of the format."""

    def __init__(self, format_id: str, piece: int, *, staged: Path | None = None,
                 uploads: Uploads | None = None) -> None:
        if (staged is None) == (uploads is None):
            raise ValueError("a piece goes either to a staged file or to uploads")
        self.format_id, self.piece = format_id, piece
        self._staged, self._uploads = staged, uploads
        self._tmp: Path | None = None
        if staged is not None:
            staged.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = staged.with_name(f".{staged.name}.{uuid.uuid4().hex}.tmp")
            self.stream: BinaryIO = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
        else:
            self.stream = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # type: ignore[assignment]  # noqa: SIM115

    def close(self) -> tuple[str, int]:
        """Finish the piece: (where it went, its size)."""
        try:
            size = self.stream.tell()
            if self._staged is not None and self._tmp is not None:
                self.stream.close()
                os.replace(self._tmp, self._staged)
                return str(self._staged), size
            assert self._uploads is not None
            per = self._uploads.parts_per_piece[self.format_id]
            sent = [send_piece(upload, self.stream, size, self.piece, per).to_json()
                    for upload in self._uploads.by_format[self.format_id]]
            self.stream.close()
            return json.dumps(sent), size
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        self.stream.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class Sent:
    """A piece the tasks sent: its index among the object's pieces, its size, and what each
    destination's upload received (in the destinations' order)."""

    piece: int
    size: int
    sent: tuple[SentPiece, ...]

    @classmethod
    def parse(cls, piece: int, size: int, where: str) -> Sent:
        return cls(piece, size, tuple(SentPiece.from_json(item) for item in json.loads(where)))
