"""Manifest commits across destinations: CAS, idempotence, lagging copies, divergence, retention, orphans."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.keys import manifest_key
from snapshot_assets.archive.located import located
from snapshot_assets.archive.manifest import Artifact, loads
from snapshot_assets.archive.positions import compare_sequence
from snapshot_assets.archive.reader import artifact_key
from snapshot_assets.archive.writer import ArtifactWriter
from snapshot_assets.pipeline.commit import CommitConflict, collect_orphans, commit_artifact, delete_artifacts

PREFIX = "t/"


@pytest.fixture
def dests(tmp_path: Path) -> list[Destination]:
    return [LocalDestination(tmp_path / "a", name="a"), LocalDestination(tmp_path / "b", name="b")]


def writer(dests: list[Destination]) -> ArtifactWriter:
    return ArtifactWriter(dests, PREFIX, snapshot_formats=("jsonl", "parquet"), diff_formats=("jsonl",))


def snap(dests: list[Destination], epoch: int, pos: str) -> Artifact:
    return writer(dests).write_snapshot(epoch, pos, [{"id": 1, "v": pos}])


def diff(dests: list[Destination], epoch: int, a: str, b: str) -> Artifact:
    return writer(dests).write_diff(epoch, a, b, [Change(Action.INSERT, b, None, {"id": int(b), "v": b})])


def commit(dests: list[Destination], art: Artifact, keep: int = 0):  # type: ignore[no-untyped-def]
    return commit_artifact(dests, PREFIX, "public.t", art, cmp=compare_sequence, keep_epochs=keep)


def manifests(dests: list[Destination]) -> list[bytes | None]:
    out = []
    for d in dests:
        got = d.get(manifest_key(PREFIX))
        out.append(got.data if got else None)
    return out


def same_history(a: bytes | None, b: bytes | None) -> bool:
    """The copies hold the same manifest, apart from the URIs (each names its own objects)."""
    def bare(data: bytes | None) -> bytes | None:
        return None if data is None else located(loads(data), PREFIX, lambda key: key).dumps()

    return bare(a) == bare(b)


def own_uris(dests: list[Destination]) -> bool:
    """Every format URI in each copy is that destination's URI of the object, and it exists there."""
    for d, data in zip(dests, manifests(dests), strict=True):
        for art in loads(data or b"").artifacts:
            for fid, ref in art.formats.items():
                key = artifact_key(PREFIX, art, FORMATS[fid])
                if ref.uri != d.uri(key) or not (d.get(key) or list(d.list(key + "/"))):
                    return False
    return True


def test_commit_writes_every_destination_and_is_idempotent(dests: list[Destination]) -> None:
    s = snap(dests, 1, "10")
    r = commit(dests, s)
    assert not r.already_committed and r.manifest.head_position == "10"
    a, b = manifests(dests)
    assert a is not None and same_history(a, b)
    assert own_uris(dests)
    again = commit(dests, s)
    assert again.already_committed and manifests(dests) == [a, b] and again.brought_forward == []
    d = diff(dests, 1, "10", "20")
    assert commit(dests, d).manifest.head_position == "20"
    assert len(loads(manifests(dests)[1] or b"").artifacts) == 2


def test_lagging_destination_is_brought_forward(dests: list[Destination]) -> None:
    s = snap(dests, 1, "10")
    commit(dests, s)
    d = diff(dests, 1, "10", "20")
    commit(dests[:1], d)  # a crash after the first destination's CAS
    assert not same_history(*manifests(dests))
    r = commit(dests, d)  # the rerun of the same run
    assert r.already_committed and r.brought_forward == ["b"]
    a, b = manifests(dests)
    assert same_history(a, b) and loads(b or b"").head_position == "20"
    assert own_uris(dests)


def test_chain_breaks_are_refused(dests: list[Destination]) -> None:
    with pytest.raises(CommitConflict, match="no snapshot to follow"):
        commit(dests, diff(dests, 1, "0", "5"))
    commit(dests, snap(dests, 1, "10"))
    with pytest.raises(CommitConflict, match="does not continue the chain"):
        commit(dests, diff(dests, 1, "15", "20"))
    with pytest.raises(CommitConflict, match="does not open a new epoch"):
        commit(dests, snap(dests, 1, "30"))
    with pytest.raises(CommitConflict, match="move the head back"):
        commit(dests, snap(dests, 2, "5"))


def test_diverged_copies_are_refused(dests: list[Destination]) -> None:
    commit(dests, snap(dests, 1, "10"))
    commit(dests[:1], diff(dests, 1, "10", "20"))
    commit(dests[1:], diff(dests, 1, "10", "30"))  # a second writer on the other destination
    with pytest.raises(CommitConflict, match="manifests diverged"):
        commit(dests, diff(dests, 1, "20", "40"))


def test_concurrent_writer_between_read_and_write_is_detected(dests: list[Destination],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    commit(dests, snap(dests, 1, "10"))
    rival = diff(dests, 1, "10", "20")
    ours = diff(dests, 1, "10", "25")
    import snapshot_assets.pipeline.commit as mod

    real = mod.read_copies
    calls = {"n": 0}

    def racing(destinations, key_prefix):  # type: ignore[no-untyped-def]
        copies = real(destinations, key_prefix)
        calls["n"] += 1
        if calls["n"] == 1:  # the rival commits after we read
            real_commit(dests, rival)
        return copies

    real_commit = commit
    monkeypatch.setattr(mod, "read_copies", racing)
    with pytest.raises(CommitConflict, match="does not continue the chain at '20'"):
        commit(dests, ours)
    assert loads(manifests(dests)[0] or b"").head_position == "20"


def test_retention_prunes_and_gc_deletes_objects(dests: list[Destination]) -> None:
    s1 = snap(dests, 1, "10")
    commit(dests, s1, keep=1)
    d1 = diff(dests, 1, "10", "20")
    commit(dests, d1, keep=1)
    r = commit(dests, snap(dests, 2, "30"), keep=1)
    assert {a.to_position for a in r.pruned} == {"10", "20"}
    delete_artifacts(dests, PREFIX, r.pruned)
    for d in dests:
        names = [o.key for o in d.list(PREFIX)]
        assert not any(n.startswith(PREFIX + "epoch=1/") for n in names), names


def test_orphans_of_older_epochs_are_collected(dests: list[Destination]) -> None:
    commit(dests, snap(dests, 1, "10"))
    orphan = diff(dests, 1, "10", "15")  # written, never committed (the run crashed)
    commit(dests, diff(dests, 1, "10", "20"))
    assert collect_orphans(dests[0], PREFIX, loads(manifests(dests)[0] or b"")) == []  # still the current epoch
    commit(dests, snap(dests, 2, "30"))
    m = loads(manifests(dests)[0] or b"")
    removed = collect_orphans(dests[0], PREFIX, m)
    assert removed == [f"{PREFIX}epoch=1/diff-10-15.jsonl"]
    assert orphan.to_position == "15"
    # referenced objects, parquet folders included, stay
    assert dests[0].get(f"{PREFIX}epoch=1/snapshot-10.jsonl") is not None


def test_copies_that_name_another_destinations_objects_are_corrected(dests: list[Destination]) -> None:
    commit(dests, snap(dests, 1, "10"))
    first = manifests(dests)[0]
    assert first is not None
    dests[1].put(manifest_key(PREFIX), first)  # what every copy held before: the first destination's URIs
    assert not own_uris(dests)
    commit(dests, diff(dests, 1, "10", "20"))
    assert own_uris(dests) and same_history(*manifests(dests))
