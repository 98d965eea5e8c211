"""Pinning and unpinning a table's snapshots (restore points) by hand: `snapshotter pin|unpin`.

A pin is a manifest rewrite (archive/pins.py decides what the pin looks like; the rewrite is the
commit's compare-and-swap on every destination, pipeline/commit.py `rewrite_manifest`), so every
copy of the manifest agrees and a concurrent commit is never lost. An unpinned snapshot stays in
the manifest until the next commit's retention prunes it, and its objects for `retention.grace`
after that.
"""

from __future__ import annotations

from snapshot_assets.archive.manifest import Artifact, Manifest, utc_now
from snapshot_assets.archive.pins import pin_at, unpin_at
from snapshot_assets.pipeline.commit import rewrite_manifest
from snapshot_assets.pipeline.table import TablePipeline


def pin(pipe: TablePipeline, position: str, label: str = "") -> Artifact:
    """Pin the snapshot of `pipe`'s table at `position` as `label` (default: the position itself)."""
    now = utc_now()
    m = rewrite_manifest(pipe.destinations, pipe.cfg.key_prefix, pipe.name,
                         lambda current: pin_at(current, position, label or position, now=now))
    return _snapshot(m, position)


def unpin(pipe: TablePipeline, position: str) -> Artifact:
    """Remove the pin of the snapshot at `position`; the next commit's retention may prune it."""
    m = rewrite_manifest(pipe.destinations, pipe.cfg.key_prefix, pipe.name,
                         lambda current: unpin_at(current, position))
    return _snapshot(m, position)


def _snapshot(m: Manifest, position: str) -> Artifact:
    return next(a for a in m.snapshots() if a.to_position == position)
