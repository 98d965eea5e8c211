"""Writing artifacts and committing manifests (the Python path, for small tables and tools).

An artifact is written in every configured format in ONE pass over its rows (the rows may come
from a generator), each format spooled to a temporary file so nothing has to fit in memory, then
uploaded to every destination. It becomes part of the archive only when `ManifestStore.commit`
has compare-and-swapped the manifest on every destination: the manifest is the commit point.
The Spark pipeline writes large artifacts itself and shares the manifest commit.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from resources.destinations.base import Destination
from snapshot_assets.archive import keys
from snapshot_assets.archive.changes import Change, Row
from snapshot_assets.archive.errors import CorruptManifest
from snapshot_assets.archive.formats import Format, get_format
from snapshot_assets.archive.located import located
from snapshot_assets.archive.manifest import DIFF, SNAPSHOT, Artifact, FormatRef, Manifest, loads, utc_now

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


@dataclass
class ManifestStore:
    """The manifest on every destination, with the revision each copy was read at (for the CAS)."""

    destinations: Sequence[Destination]
    key_prefix: str
    table: str
    revisions: list[str | None] = field(default_factory=list)

    def load(self) -> Manifest:
        """Read every destination's copy; the one furthest along (most artifacts) is the current manifest."""
        best: Manifest | None = None
        key = keys.manifest_key(self.key_prefix)
        self.revisions = []
        for dest in self.destinations:
            got = dest.get(key)
            self.revisions.append(got.revision if got else None)
            if got is None:
                continue
            m = loads(got.data, source=dest.uri(key))
            if m.table and m.table != self.table:
                raise CorruptManifest(f"{dest.uri(key)} belongs to table {m.table!r}, not {self.table!r}")
            if best is None or len(m.artifacts) > len(best.artifacts):
                best = m
        return best or Manifest(table=self.table)

    def commit(self, manifest: Manifest) -> None:
        """CAS-write `manifest` to every destination against the revisions read by `load`.

        A CASConflict means another writer advanced the manifest: the caller must reload and
        decide again, never retry blindly.
        """
        key = keys.manifest_key(self.key_prefix)
        if len(self.revisions) != len(self.destinations):
            raise RuntimeError("ManifestStore.commit called before load")
        for i, dest in enumerate(self.destinations):
            data = located(manifest, self.key_prefix, dest.uri).dumps()  # each copy names its own objects
            self.revisions[i] = dest.put_if(key, data, self.revisions[i])
