"""Row versions: the source position and commit time of each row's last change, kept beside the archive.

Why: laredo's artifacts hold rows (snapshots) and one net change per key per window (diffs), not when
each key last changed. get(key) (seed 002) answers with the version of the key (the position of its
last change at or before the position asked) and that change's commit time, so the build keeps both
with every row of its state and writes them beside the artifacts, in objects laredo's readers never
see (they do not list an epoch folder) and retention deletes with their artifact.

A version is one line of text, `<position>\\t<commit time>\\t<origin>`:
  position     the change's own source position, as the buffer keeps it (a PostgreSQL commit LSN)
  commit time  RFC 3339, as the buffer keeps it; empty when the source gave none
  origin       `change` (a change the archive captured) or `copy` (the row came from the initial
               load or a re-sync at that position: its last change happened at or before it, and the
               archive cannot know when)
An empty line: unknown (a row of a snapshot built before versions were kept).

Objects:
  snapshot-<pos>.versions    one version line per snapshot row, in the snapshot's row order (its
                             jsonl lines, its protobuf messages). The snapshot's key index (key_index.py)
                             holds the byte offset in it of each of its entries, so a lookup reads the
                             one block that belongs to the row it found.
  diff-<from>-<to>.versions  one line per key the diff changed, `<key JSON>\\t<version>`, in key order;
                             a line with an empty key is the version of the diff's TRUNCATE.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from snapshot_assets.archive import keys
from snapshot_assets.archive.errors import CorruptArtifact

#: The piece and sidecar id of the versions objects (beside the format ids: jsonl, protobuf, parquet).
VERSIONS = "versions"
EXTENSION = ".versions"
SEP = "\t"
CHANGE, COPY = "change", "copy"
#: The key of the line that gives a diff's TRUNCATE version.
TRUNCATE_KEY = ""


@dataclass(frozen=True, slots=True)
class Version:
    """When a key last changed: at `position`, committed at `commit_time` (None: not given), and
    whether that was a captured change or the copy the archive started from (`copied`)."""

    position: str
    commit_time: str | None
    copied: bool


def version_text(position: str, commit_time: str | None, copied: bool = False) -> str:
    """The text of one version (the tests and single-process writers; Spark uses `VERSION_SQL`)."""
    return SEP.join((position, commit_time or "", COPY if copied else CHANGE))


def parse_version(text: str, where: str) -> Version | None:
    """A version from its text; None for an empty (unknown) one. CorruptArtifact when malformed."""
    if not text:
        return None
    parts = text.split(SEP)
    if len(parts) != 3 or not parts[0] or parts[2] not in (CHANGE, COPY):
        raise CorruptArtifact(f"{where}: not a version line: {text[:120]!r}")
    return Version(parts[0], parts[1] or None, parts[2] == COPY)


def snapshot_versions_key(key_prefix: str, epoch: int, to_position: str) -> str:
    return keys.snapshot_key(key_prefix, epoch, to_position, EXTENSION)


def diff_versions_key(key_prefix: str, epoch: int, from_position: str, to_position: str) -> str:
    return keys.diff_key(key_prefix, epoch, from_position, to_position, EXTENSION)


def line_at(data: bytes, ordinal: int, where: str) -> Version | None:
    """The version on line `ordinal` (0-based) of a block of a snapshot's versions object."""
    lines = data.split(b"\n")
    if ordinal >= len(lines) - 1:
        raise CorruptArtifact(f"{where}: {len(lines) - 1} version line(s), the rows need line {ordinal + 1}")
    return parse_version(lines[ordinal].decode("utf-8"), where)


def diff_lines(data: bytes, where: str) -> Mapping[str, Version | None]:
    """A diff's versions object as key JSON -> version (TRUNCATE_KEY: the TRUNCATE's)."""
    out: dict[str, Version | None] = {}
    # split at newlines only: a string key may hold U+0085 or U+2028, which JSON leaves as they are
    *lines, tail = data.split(b"\n")
    if tail:
        raise CorruptArtifact(f"{where}: the last line is cut off: {tail[:120]!r}")
    for raw in lines:
        line = raw.decode("utf-8")
        key, sep, rest = line.partition(SEP)
        if not sep:
            raise CorruptArtifact(f"{where}: not a key and version: {line[:120]!r}")
        out[key] = parse_version(rest, where)
    return out


def diff_text(entries: Iterable[tuple[str, str]]) -> bytes:
    """A diff's versions object from (key JSON, version text) pairs (single-process writers, tests)."""
    return "".join(f"{key}{SEP}{text}\n" for key, text in sorted(entries)).encode("utf-8")
