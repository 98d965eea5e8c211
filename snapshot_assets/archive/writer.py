"""Writing artifacts in Python (small tables, tools, test archives; Spark writes the pipeline's).

An artifact is written in every configured format in ONE pass over its rows (the rows may come
from a generator), each format spooled to a temporary file so nothing has to fit in memory, then
uploaded to every destination. It becomes part of the archive only when the one manifest commit
(`snapshot_assets.pipeline.commit.commit_artifact`) has compare-and-swapped the manifest on every
destination: the manifest is the commit point, for these artifacts and the Spark pipeline's alike.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from resources.destinations.base import Destination
from snapshot_assets.archive import keys
from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.formats import Format, get_format
from snapshot_assets.archive.manifest import DIFF, SNAPSHOT, Artifact, FormatRef, utc_now

_SPOOL_BYTES = 32 * 1024 * 1024


@dataclass
class ArtifactWriter:
    """Writes one table's artifacts to every destination, in every format."""

    destinations: Sequence[Destination]
    key_prefix: str
    snapshot_formats: Sequence[str] = ("jsonl",)
    diff_formats: Sequence[str] = ("jsonl",)
    key_fields: Sequence[str] = ("id",)

    def __post_init__(self) -> None:
        if not self.destinations:
            raise ValueError("an ArtifactWriter needs at least one destination")
        for fid in (*self.snapshot_formats, *self.diff_formats):
            get_format(fid)

    def write_snapshot(self, epoch: int, to_position: str, rows: Iterable[Row], *,
                       created_at: str | None = None) -> Artifact:
        if not to_position:
            raise ValueError("a snapshot needs a non-empty position")
        fmts = [get_format(f) for f in self.snapshot_formats]
        writers, files = self._open(fmts, lambda f, out: f.snapshot_writer(out, self.key_fields))
        count = 0
        for row in rows:
            for w in writers:
                w.write(row)
            count += 1
        key_of = {f.format_id: keys.snapshot_key(self.key_prefix, epoch, to_position, f.extension) for f in fmts}
        refs = self._upload(fmts, writers, files, key_of)
        return Artifact(kind=SNAPSHOT, epoch=epoch, from_position=None, to_position=to_position,
                        created_at=created_at or utc_now(), formats=refs, row_count=count)

    def write_diff(self, epoch: int, from_position: str, to_position: str, changes: Iterable[Change], *,
                   created_at: str | None = None) -> Artifact:
        if not from_position or not to_position:
            raise ValueError("a diff needs non-empty from and to positions")
        if from_position == to_position:
            raise ValueError(f"a diff cannot start and end at the same position ({to_position})")
        fmts = [get_format(f) for f in self.diff_formats]
        writers, files = self._open(fmts, lambda f, out: f.diff_writer(out, self.key_fields))
        count = 0
        for change in changes:
            for w in writers:
                w.write(change)
            count += 1
        key_of = {f.format_id: keys.diff_key(self.key_prefix, epoch, from_position, to_position, f.extension)
                  for f in fmts}
        refs = self._upload(fmts, writers, files, key_of)
        return Artifact(kind=DIFF, epoch=epoch, from_position=from_position, to_position=to_position,
                        created_at=created_at or utc_now(), formats=refs, change_count=count)

    @staticmethod
    def _open(fmts: Sequence[Format], make: Any) -> tuple[list[Any], list[IO[bytes]]]:
        # Closed by _upload's finally (they must outlive this call, so no `with`).
        files: list[IO[bytes]] = [tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) for _ in fmts]  # noqa: SIM115
        writers = [make(f, out) for f, out in zip(fmts, files, strict=True)]
        return writers, files

    def _upload(self, fmts: Sequence[Format], writers: Sequence[Any], files: Sequence[IO[bytes]],
                key_of: dict[str, str]) -> dict[str, FormatRef]:
        refs: dict[str, FormatRef] = {}
        try:
            for fmt, writer, out in zip(fmts, writers, files, strict=True):
                writer.close()
                for i, dest in enumerate(self.destinations):
                    out.seek(0)
                    result = dest.put(key_of[fmt.format_id], out)  # type: ignore[arg-type]
                    if i == 0:
                        refs[fmt.format_id] = FormatRef(uri=result.uri, size_bytes=result.size)
        finally:
            for out in files:
                out.close()
        return refs
