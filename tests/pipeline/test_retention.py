"""Retention at the commit: pinned snapshots spared, pruned artifacts retired (recorded in the manifest)
and their objects deleted only once the grace is over; orphan collection and the comparison of
manifest copies respect both."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from snapshot_assets.archive.key_index import INDEX_EXTENSION
from snapshot_assets.archive.keys import manifest_key
from snapshot_assets.archive.manifest import Artifact, loads
from snapshot_assets.archive.pins import Pin, pin_at, with_pin
from snapshot_assets.archive.positions import compare_sequence
from snapshot_assets.archive.retention import RETIRED_FIELD, retired_of
from snapshot_assets.archive.versions import EXTENSION as VERSIONS_EXTENSION
from snapshot_assets.config import parse_config
from snapshot_assets.pipeline.commit import (
    artifact_object_keys,
    collect_orphans,
    commit_artifact,
    current_manifest,
    delete_artifacts,
    read_copies,
)
from tests.pipeline.test_commit import PREFIX, diff, snap

T0 = _dt.datetime(2026, 1, 1, tzinfo=_dt.UTC)


def _commit(dests: list[Destination], art: Artifact, at: _dt.timedelta, grace: _dt.timedelta):  # type: ignore[no-untyped-def]
    now = (T0 + at).isoformat().replace("+00:00", "Z")
    result = commit_artifact(dests, PREFIX, "public.t", art, cmp=compare_sequence, keep_epochs=1, grace=grace, now=now)
    delete_artifacts(dests, PREFIX, result.pruned)
    return result


def _present(dest: Destination, art: Artifact) -> bool:
    """Every format object of `art` is stored (the Python writer these tests use writes no key index
    or versions object)."""
    keys = [k for k in artifact_object_keys(PREFIX, art) if not k.endswith((INDEX_EXTENSION, VERSIONS_EXTENSION))]
    return all(next(iter(dest.list(k)), None) is not None for k in keys)


def test_retired_objects_wait_out_the_grace_and_pins_are_spared(tmp_path: Path) -> None:
    dests: list[Destination] = [LocalDestination(tmp_path / "a", name="a")]
    hour = _dt.timedelta(hours=1)
    first = with_pin(snap(dests, 1, "10"), Pin("initial", "t", "initial"))
    _commit(dests, first, _dt.timedelta(0), hour)
    d1 = diff(dests, 1, "10", "20")
    _commit(dests, d1, _dt.timedelta(minutes=1), hour)
    s2 = snap(dests, 2, "30")
    r = _commit(dests, s2, _dt.timedelta(minutes=2), hour)
    assert r.pruned == [] and [a.to_position for a in r.manifest.artifacts] == ["10", "30"]  # pinned first stays
    assert [(x.artifact.to_position, x.retired_at) for x in retired_of(r.manifest)] == [("20", "2026-01-01T00:02:00Z")]
    assert RETIRED_FIELD in loads(dests[0].get(manifest_key(PREFIX)).data).to_json()  # type: ignore[union-attr]
    assert collect_orphans(dests[0], PREFIX, r.manifest) == [] and _present(dests[0], d1)  # retired = referenced

    s3 = snap(dests, 3, "40")
    r = _commit(dests, s3, _dt.timedelta(minutes=61), hour)  # the diff's grace is not over yet (retired at 0:02)
    assert r.pruned == [] and _present(dests[0], d1) and _present(dests[0], s2)
    r = _commit(dests, diff(dests, 3, "40", "50"), _dt.timedelta(minutes=62), hour)
    assert [a.to_position for a in r.pruned] == ["20"] and not _present(dests[0], d1)
    assert [x.artifact.to_position for x in retired_of(r.manifest)] == ["30"] and _present(dests[0], s2)
    r.manifest.validate(compare_sequence)


def test_a_lagging_copy_is_brought_forward_past_a_pinned_snapshot(tmp_path: Path) -> None:
    """A copy that missed a re-base still holds diffs the furthest copy pruned; beside an old pinned
    snapshot (which keeps an old epoch in the manifest) that is lag, not two writers."""
    a, b = LocalDestination(tmp_path / "a", name="a"), LocalDestination(tmp_path / "b", name="b")
    now = _dt.timedelta(0)
    _commit([a, b], with_pin(snap([a, b], 1, "10"), Pin("initial", "t", "initial")), now, now)
    _commit([a, b], diff([a, b], 1, "10", "20"), now, now)
    _commit([a], snap([a], 2, "30"), now, now)  # b misses the re-base (no grace: nothing retired is recorded)
    r = _commit([a, b], snap([a, b], 3, "40"), now, now)
    assert [x.to_position for x in r.manifest.artifacts] == ["10", "40"] and r.brought_forward == ["b"]
    assert current_manifest(read_copies([a, b], PREFIX), "public.t").artifacts == r.manifest.artifacts
    relabelled = pin_at(r.manifest, "10", "golden", now="t")
    assert relabelled.artifacts[0].extra["pin"] == {"label": "golden", "pinned_at": "t", "origin": "user"}


def test_retention_grace_is_configured_with_keep_epochs(tmp_path: Path) -> None:
    def table(retention: str):  # type: ignore[no-untyped-def]
        return parse_config(f"""snapshotter {{ source {{ type = generator, table = users }}
          destinations = [ {{ type = local, path = "{tmp_path}" }} ]
          {retention}
          buffer.path = "{tmp_path / 'buffer'}" }}""", env={}).tables[0]

    assert (table("").keep_epochs, table("").retention_grace) == (0, _dt.timedelta(hours=1))
    t = table("retention { keep_epochs = 2, grace = 10m }")
    assert (t.keep_epochs, t.retention_grace) == (2, _dt.timedelta(minutes=10))
    assert table("retention.keep_epochs = 3").keep_epochs == 3  # the existing key, unchanged
