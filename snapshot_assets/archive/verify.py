"""Whole-archive verification: the chain, and every object of every format on one destination.

Used by `snapshotter verify` and by the manifest's Dagster asset checks. Objects are found with
one listing of the table's prefix rather than one request per object, so verifying a long chain
on S3 costs a few LIST calls.
"""

from __future__ import annotations

from snapshot_assets.archive.errors import ArchiveError
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.reader import ArchiveReader, artifact_key
from snapshot_assets.archive.versions import snapshot_versions_key


def object_sizes(reader: ArchiveReader) -> dict[str, int]:
    """Size of every object under the table's prefix; a parquet folder counts as one object."""
    sizes: dict[str, int] = {}
    for info in reader.dest.list(reader.key_prefix):
        sizes[info.key] = info.size
        folder, sep, name = info.key.rpartition("/")
        if sep and folder.endswith(".parquet") and not name.startswith(("_", ".")):
            sizes[folder] = sizes.get(folder, 0) + info.size
    return sizes


def verify_archive(reader: ArchiveReader, m: Manifest | None = None, *, deep: bool = False) -> list[str]:
    """Every problem found, as sentences; empty when the archive is sound.

    `deep` also decodes each artifact and compares its row/change count with the manifest, and a
    snapshot's versions object (when it has one) line by line with its rows.
    """
    try:
        m = m or reader.load_manifest()
    except ArchiveError as e:
        return [str(e)]
    problems = m.problems(reader.cmp)
    sizes = object_sizes(reader)
    for art in m.artifacts:
        for fid, ref in art.formats.items():
            fmt = FORMATS.get(fid)
            if fmt is None:
                problems.append(f"{art.describe()}: unknown format {fid!r}")
                continue
            key = artifact_key(reader.key_prefix, art, fmt)
            size = sizes.get(key)
            if size is None:
                problems.append(f"{art.describe()}: {fid} object missing: {reader.dest.uri(key)}")
            elif ref.size_bytes and size != ref.size_bytes:
                problems.append(f"{art.describe()}: {fid} object is {size} bytes, manifest says {ref.size_bytes}")
            elif deep:
                problems.extend(_count_problems(reader, art, fid))
        if deep and art.is_snapshot:
            problems.extend(_versions_problems(reader, art, sizes))
    return problems


def _versions_problems(reader: ArchiveReader, art: Artifact, sizes: dict[str, int]) -> list[str]:
    """A snapshot's versions object has one line per row (archive/versions.py); older ones have none."""
    key = snapshot_versions_key(reader.key_prefix, art.epoch, art.to_position)
    if key not in sizes:
        return []
    lines = 0
    with reader.dest.open_read(key) as stream:
        while chunk := stream.read(1 << 20):
            lines += chunk.count(b"\n")
    if lines != art.row_count:
        return [f"{art.describe()}: versions object holds {lines} lines, the snapshot {art.row_count} rows"]
    return []


def _count_problems(reader: ArchiveReader, art: Artifact, fid: str) -> list[str]:
    one = ArchiveReader(reader.dest, reader.key_prefix, formats=[fid], key_fields=reader.key_fields, cmp=reader.cmp)
    try:
        if art.is_snapshot:
            n, expected, what = sum(1 for _ in one.iter_snapshot(art)), art.row_count, "rows"
        else:
            n, expected, what = sum(1 for _ in one.iter_diff(art)), art.change_count, "changes"
    except ArchiveError as e:
        return [f"{art.describe()}: {fid}: {e}"]
    if n != expected:
        return [f"{art.describe()}: {fid} holds {n} {what}, manifest says {expected}"]
    return []
