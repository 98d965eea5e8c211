"""Committing an artifact: the manifest compare-and-swap on every destination.

The manifest is the commit point. Every destination's copy is read first; the copy furthest
along is the current manifest, and a destination that is behind (an earlier run crashed between
two destinations) is brought forward in the same write — never overwritten with less. A copy
that is not a prefix of the current one means two writers diverged: that is refused, loudly.

Committing is idempotent: re-running a commit whose artifact is already in the manifest only
brings lagging destinations forward. A CAS conflict means another writer moved the manifest;
the commit reloads and, if the artifact still continues the chain, tries again.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from resources.destinations.base import CASConflict, Destination
from snapshot_assets.archive import keys
from snapshot_assets.archive.errors import ArchiveError, ManifestNotFound
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.key_index import index_key
from snapshot_assets.archive.located import located
from snapshot_assets.archive.manifest import Artifact, Manifest, loads
from snapshot_assets.archive.pins import is_pinned
from snapshot_assets.archive.positions import Comparator
from snapshot_assets.archive.reader import artifact_key
from snapshot_assets.archive.retention import Retention, commit_with_retention, parse_time, retired_of
from snapshot_assets.archive.versions import diff_versions_key, snapshot_versions_key


class CommitConflict(ArchiveError):
    """The artifact cannot be committed: it does not continue the chain, or the copies diverged."""


@dataclass(frozen=True)
class _Copy:
    dest: Destination
    revision: str | None
    manifest: Manifest | None


@dataclass
class CommitResult:
    manifest: Manifest
    artifact: Artifact
    already_committed: bool = False
    pruned: list[Artifact] = field(default_factory=list)  # retired and past retention.grace: delete their objects
    brought_forward: list[str] = field(default_factory=list)
    cas_retries: int = 0


def _same(a: Artifact, b: Artifact) -> bool:
    return (a.kind, a.epoch, a.from_position, a.to_position) == (b.kind, b.epoch, b.from_position, b.to_position)


def _identity(a: Artifact) -> tuple[str, int, str | None, str]:
    return a.identity


def read_copies(destinations: Sequence[Destination], key_prefix: str) -> list[_Copy]:
    key = keys.manifest_key(key_prefix)
    copies = []
    for dest in destinations:
        got = dest.get(key)
        copies.append(_Copy(dest, got.revision if got else None,
                            loads(got.data, source=dest.uri(key)) if got else None))
    return copies


def current_manifest(copies: Sequence[_Copy], table: str) -> Manifest:
    """The furthest copy; every other copy must be a prefix of its history (or empty)."""
    present = [c.manifest for c in copies if c.manifest is not None]
    if not present:
        return Manifest(table=table)
    best = max(present, key=lambda m: (m.epoch, len(m.artifacts)))
    seen = {_identity(a) for a in best.artifacts} | {r.artifact.identity for r in retired_of(best)}
    # The oldest epoch retention left whole: pinned snapshots of older epochs stay alone, without their diffs.
    floor = min((x.epoch for x in best.artifacts if not is_pinned(x)), default=best.epoch)
    for c in copies:
        m = c.manifest
        if m is None or m is best:
            continue
        if m.table and m.table != table:
            raise CommitConflict(f"{c.dest.uri(keys.manifest_key(''))}: manifest belongs to {m.table!r}, not {table!r}")
        # A lagging copy may hold artifacts the furthest one has since pruned (older epochs).
        diverged = [a for a in m.artifacts if _identity(a) not in seen and a.epoch >= floor]
        if diverged:
            raise CommitConflict(
                f"manifests diverged: {c.dest.name} has {diverged[0].describe()}, which the furthest copy lacks; "
                "two writers wrote this table — stop one and reconcile before committing again")
    return best


def _check_continues(current: Manifest, art: Artifact, cmp: Comparator) -> None:
    if art.is_snapshot:
        if art.epoch <= current.epoch:
            raise CommitConflict(f"{art.describe()} does not open a new epoch (manifest is at epoch {current.epoch})")
        if current.head_position and cmp(art.to_position, current.head_position) < 0:
            raise CommitConflict(f"{art.describe()} would move the head back from {current.head_position}")
        return
    if not current.artifacts:
        raise CommitConflict(f"{art.describe()} has no snapshot to follow")
    if art.from_position != current.head_position:
        raise CommitConflict(f"{art.describe()} does not continue the chain at {current.head_position!r}")
    if art.epoch != current.epoch:
        raise CommitConflict(f"{art.describe()} carries epoch {art.epoch}, the manifest is at epoch {current.epoch}")


def commit_artifact(destinations: Sequence[Destination], key_prefix: str, table: str, art: Artifact, *,
                    cmp: Comparator, keep_epochs: int = 0, grace: _dt.timedelta = _dt.timedelta(0),
                    now: str | None = None, columns: Sequence[Mapping[str, Any]] | None = None,
                    max_attempts: int = 5) -> CommitResult:
    """Append `art` to the manifest on every destination (CAS), applying retention.

    Retention (archive/retention.py) spares pinned snapshots and records what leaves the manifest
    as retired; `pruned` are the artifacts whose `grace` is over, whose objects the caller deletes.
    `columns` (laredo's ColumnDefinition objects) describe the table at `art.to_position`, the new
    head, and replace the manifest's `columns` with it; None leaves them as they are.
    """
    if not destinations:
        raise ValueError("commit needs at least one destination")
    moment = parse_time(now) if now else _dt.datetime.now(_dt.UTC)
    retries = 0
    for _attempt in range(max_attempts):
        copies = read_copies(destinations, key_prefix)
        current = current_manifest(copies, table)
        already = any(_same(a, art) for a in current.artifacts)
        if already:
            new, pruned = current, []
        else:
            _check_continues(current, art, cmp)
            retained = commit_with_retention(current, art, Retention(keep_epochs, grace), moment)
            new, pruned = retained.manifest, list(retained.expired)
            if columns is not None:
                new = replace(new, columns=[dict(c) for c in columns])
        if new.table != table:
            new = replace(new, table=table)
        try:
            forward = _write_copies(copies, current, new, key_prefix)
        except CASConflict:
            retries += 1
            continue
        return CommitResult(new, art, already, pruned, forward, retries)
    raise CommitConflict(f"gave up committing {art.describe()} after {max_attempts} compare-and-swap conflicts")


def _write_copies(copies: Sequence[_Copy], current: Manifest, new: Manifest, key_prefix: str) -> list[str]:
    """Compare-and-swap `new` onto every copy that differs from it; the destinations that were behind
    `current` (brought forward by this write). CASConflict when another writer moved a copy."""
    before = current if current.artifacts else None
    forward = [c.dest.name for c in copies
               if _text(c.manifest) != _text(before and located(before, key_prefix, c.dest.uri))]
    for c in copies:
        data = located(new, key_prefix, c.dest.uri).dumps()  # each copy names its own objects
        if _text(c.manifest) == data:
            continue
        c.dest.put_if(keys.manifest_key(key_prefix), data, c.revision)
    return forward


def rewrite_manifest(destinations: Sequence[Destination], key_prefix: str, table: str,
                     change: Callable[[Manifest], Manifest], *, max_attempts: int = 5) -> Manifest:
    """Rewrite the manifest on every destination with `change` (no new artifact: a pin, an unpin),
    compare-and-swapped like a commit; `change` sees the current manifest again after a conflict."""
    if not destinations:
        raise ValueError("a manifest rewrite needs at least one destination")
    for _attempt in range(max_attempts):
        copies = read_copies(destinations, key_prefix)
        current = current_manifest(copies, table)
        if not current.artifacts:
            raise ManifestNotFound(f"{table} has no committed manifest on {', '.join(d.name for d in destinations)}")
        new = change(current)
        try:
            _write_copies(copies, current, new, key_prefix)
        except CASConflict:
            continue
        return new
    raise CommitConflict(f"gave up rewriting the manifest of {table} after {max_attempts} compare-and-swap conflicts")


def _text(manifest: Manifest | None) -> bytes | None:
    return None if manifest is None else manifest.dumps()


def artifact_object_keys(key_prefix: str, art: Artifact) -> list[str]:
    """Every object key of an artifact: one per format it lists, its versions object, and a
    snapshot's key index."""
    if art.is_snapshot:
        beside = [index_key(key_prefix, art.epoch, art.to_position),
                  snapshot_versions_key(key_prefix, art.epoch, art.to_position)]
    else:
        beside = [diff_versions_key(key_prefix, art.epoch, art.from_position or "", art.to_position)]
    return [*(artifact_key(key_prefix, art, FORMATS[fid]) for fid in art.formats if fid in FORMATS), *beside]


def delete_artifacts(destinations: Sequence[Destination], key_prefix: str, arts: Sequence[Artifact]) -> int:
    """Delete the objects of pruned artifacts (single objects and parquet folders) everywhere."""
    deleted = 0
    for art in arts:
        for key in artifact_object_keys(key_prefix, art):
            for dest in destinations:
                dest.delete(key)
                for part in list(dest.list(key + "/")):
                    dest.delete(part.key)
                deleted += 1
    return deleted


def collect_orphans(dest: Destination, key_prefix: str, manifest: Manifest) -> list[str]:
    """Delete objects of epochs older than the current one that the manifest does not reference.

    Such objects are left by runs that crashed before their commit, or by retention (a retired
    artifact only once its grace is over: until then the manifest's `retired` record names it): no writer
    writes into an old epoch any more, so they are safe to delete. (Orphans in the current epoch
    are collected once the next snapshot opens a new epoch; an in-flight run may be writing there.)
    """
    live = [*manifest.artifacts, *(r.artifact for r in retired_of(manifest))]  # retired: still in their grace
    referenced = {k for a in live for k in artifact_object_keys(key_prefix, a)}
    removed = []
    for info in dest.list(key_prefix + "epoch="):
        rel = info.key[len(key_prefix):]
        epoch_text = rel.split("/", 1)[0].removeprefix("epoch=")
        if not epoch_text.isdigit() or int(epoch_text) >= manifest.epoch:
            continue
        top = key_prefix + "/".join(rel.split("/")[:2])  # the object, or the parquet folder it is a part of
        if top in referenced:
            continue
        dest.delete(info.key)
        removed.append(info.key)
    return removed
