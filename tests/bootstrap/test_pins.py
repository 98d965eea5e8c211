"""Pinned snapshots under retention: with keep_epochs = 1 and many re-bases, the pinned snapshots (the
table's first, the labelled ones, one pinned afterwards) and only they survive, alone before the
current epoch, readable; an unpinned one is pruned by the next commit and its objects deleted once
`retention.grace` is over (a tiny grace here)."""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

import pytest

from snapshot_assets.archive.errors import PositionError
from snapshot_assets.archive.key_index import INDEX_EXTENSION
from snapshot_assets.archive.manifest import Artifact
from snapshot_assets.archive.pins import ORIGIN_INITIAL, ORIGIN_USER, pin_of, pinned, snapshot_labelled
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.retention import parse_time, retired_of
from snapshot_assets.archive.verify import verify_archive
from snapshot_assets.archive.versions import EXTENSION as VERSIONS_EXTENSION
from snapshot_assets.pipeline.commit import artifact_object_keys
from snapshot_assets.pipeline.table import TablePipeline
from snapshot_assets.restore_points import pin, unpin
from tests.bootstrap.support import SourceArchive, table_config

GRACE = _dt.timedelta(seconds=1)


def _wait_out_grace(archive: SourceArchive) -> None:
    """Until the grace of every retired artifact is over (a computed deadline, not a guess)."""
    retired = retired_of(archive.manifest())
    if retired:
        due = max(parse_time(r.retired_at) for r in retired) + GRACE
        time.sleep(max(0.0, (due - _dt.datetime.now(_dt.UTC)).total_seconds()) + 0.05)


def _objects(archive: SourceArchive) -> set[str]:
    dest, prefix = archive.pipe.destinations[0], archive.pipe.cfg.key_prefix
    return {o.key for o in dest.list(prefix + "epoch=")}


def _keys(archive: SourceArchive, arts: list[Artifact]) -> set[str]:
    """The artifacts' objects as this archive's writer made them: its formats (the Python writer
    writes no key index or versions object; a Spark build's would be deleted with its snapshot alike)."""
    return {k for a in arts for k in artifact_object_keys(archive.pipe.cfg.key_prefix, a)
            if not k.endswith((INDEX_EXTENSION, VERSIONS_EXTENSION))}


@pytest.fixture
def archive(tmp_path: Path) -> SourceArchive:
    cfg = table_config(tmp_path, {"type": "local", "path": str(tmp_path / "archive")}, keep_epochs=1, grace="1s")
    return SourceArchive(TablePipeline(cfg))


def test_only_pinned_snapshots_survive_many_rebases_and_stay_readable(archive: SourceArchive) -> None:
    archive.snapshot()  # epoch 1: the table's first snapshot, pinned `initial`
    archive.diff()
    archive.snapshot(label="before-migration")  # epoch 2: a user's snapshot
    archive.diff()
    for _ in range(4):  # epochs 3..6: the policy's re-bases
        archive.diff()
        archive.snapshot()
    archive.diff()
    later = archive.manifest().latest_snapshot()
    assert later is not None and pin_of(later) is None
    pin(archive.pipe, later.to_position, "after-the-fact")  # epoch 6, pinned by hand
    for _ in range(3):  # epochs 7..9
        archive.snapshot()
        archive.diff()
        archive.diff()
    _wait_out_grace(archive)
    archive.diff()  # the next commit deletes what waited out its grace

    m = archive.manifest()
    m.validate(compare_lsn)  # old pinned snapshots alone before the current epoch: still a valid chain
    survivors = [(a.epoch, p.label, p.origin) for a, p in pinned(m)]
    assert survivors == [(1, "initial", ORIGIN_INITIAL), (2, "before-migration", ORIGIN_USER),
                         (6, "after-the-fact", ORIGIN_USER)]
    assert [(a.kind, a.epoch) for a in m.artifacts] == [
        ("snapshot", 1), ("snapshot", 2), ("snapshot", 6), ("snapshot", 9), ("diff", 9), ("diff", 9), ("diff", 9)]
    assert retired_of(m) == []
    assert _objects(archive) == _keys(archive, list(m.artifacts))  # everything else is gone from storage

    reader = ArchiveReader(archive.pipe.destinations[0], archive.pipe.cfg.key_prefix)
    for art, _pin in pinned(m):
        rec = reader.reconstruct_as_of(art.to_position, m)
        assert rec is not None and rec.position == art.to_position
        assert {r["id"]: r for r in rec.rows} == archive.at[art.to_position]
    assert snapshot_labelled(m, "before-migration").epoch == 2
    assert verify_archive(reader, deep=True) == []  # `snapshotter verify` and the asset check agree


def test_unpinning_lets_the_next_commit_prune_after_the_grace(archive: SourceArchive) -> None:
    archive.snapshot()
    archive.snapshot(label="keep-me")
    archive.snapshot()
    archive.diff()
    m = archive.manifest()
    labelled = snapshot_labelled(m, "keep-me")
    own = _keys(archive, [labelled])

    unpinned = unpin(archive.pipe, labelled.to_position)
    assert pin_of(unpinned) is None
    assert labelled.to_position in [a.to_position for a in archive.manifest().artifacts]  # not pruned by the unpin

    archive.diff()  # the next commit prunes it: retired, its objects kept for the grace
    m = archive.manifest()
    assert labelled.identity not in {a.identity for a in m.artifacts}
    assert labelled.identity in {r.artifact.identity for r in retired_of(m)}
    assert own <= _objects(archive)
    with pytest.raises(PositionError, match="no snapshot labelled 'keep-me'"):
        snapshot_labelled(m, "keep-me")

    _wait_out_grace(archive)
    archive.diff()
    m = archive.manifest()
    assert retired_of(m) == [] and not own & _objects(archive)
    assert [(a.epoch, p.label) for a, p in pinned(m)] == [(1, "initial")]  # the first snapshot is still pinned
