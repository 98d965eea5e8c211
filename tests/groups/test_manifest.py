"""The group manifest: its JSON, its compare-and-swap on every destination, and cut lookup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resources.destinations.local import LocalDestination
from snapshot_assets.archive.errors import CorruptManifest, UnsupportedManifestVersion
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.groups.manifest import (
    Cut,
    GroupConflict,
    MemberCut,
    group_manifest_key,
    loads,
    publish_cut,
    read_group_manifest,
)

TABLES = ("public.accounts", "public.transfers")
PREFIX = "groups/ledger/"


def cut(position: str, transfers_at: str | None = None) -> Cut:
    return Cut(position, "2026-11-24T20:00:00Z", {"public.accounts": MemberCut(1, position),
                                                  "public.transfers": MemberCut(1, transfers_at or position)})


def publish(dests: list[LocalDestination], c: Cut) -> None:
    publish_cut(dests, PREFIX, "ledger", TABLES, c, compare_lsn)


def test_cuts_round_trip_and_lookup(tmp_path: Path) -> None:
    dests = [LocalDestination(tmp_path / "a", "a"), LocalDestination(tmp_path / "b", "b")]
    for c in (cut("0/100"), cut("0/200", "0/180"), cut("0/A00")):  # 0/A00 > 0/200 as LSNs, not as strings
        publish(dests, c)
    m = read_group_manifest(dests, PREFIX, "ledger", TABLES, compare_lsn)
    assert [c.position for c in m.cuts] == ["0/100", "0/200", "0/A00"]
    assert m.cut_at("0/1FF", compare_lsn) == m.cuts[0]
    assert m.cut_at("0/200", compare_lsn) == m.cuts[1]
    assert m.cut_at(None, compare_lsn) == m.cuts[2]
    assert m.cut_at("0/FF", compare_lsn) is None
    assert m.cuts[1].tables["public.transfers"] == MemberCut(1, "0/180")
    doc = json.loads((tmp_path / "b" / group_manifest_key(PREFIX)).read_text())
    assert doc["group_manifest_version"] == 1 and doc["tables"] == list(TABLES)
    assert loads((tmp_path / "a" / group_manifest_key(PREFIX)).read_bytes()) == m


def test_publish_is_idempotent_and_brings_a_lagging_copy_forward(tmp_path: Path) -> None:
    a, b = LocalDestination(tmp_path / "a", "a"), LocalDestination(tmp_path / "b", "b")
    publish([a], cut("0/100"))
    publish([a], cut("0/200"))
    publish([a, b], cut("0/200"))  # a crash left b behind: the same cut again brings it forward
    for dest in (a, b):
        assert [c.position for c in read_group_manifest([dest], PREFIX, "ledger", TABLES, compare_lsn).cuts] == [
            "0/100", "0/200"]


def test_refusals(tmp_path: Path) -> None:
    a, b = LocalDestination(tmp_path / "a", "a"), LocalDestination(tmp_path / "b", "b")
    publish([a, b], cut("0/200"))
    with pytest.raises(GroupConflict, match="does not come after the last cut at 0/200"):
        publish([a, b], cut("0/100"))
    with pytest.raises(GroupConflict, match="must name every member"):
        publish([a, b], Cut("0/300", "", {"public.accounts": MemberCut(1, "0/300")}))
    publish([a], cut("0/300"))
    publish([b], cut("0/400"))  # two writers: each copy has a cut the other lacks
    with pytest.raises(GroupConflict, match="diverged"):
        read_group_manifest([a, b], PREFIX, "ledger", TABLES, compare_lsn)


@pytest.mark.parametrize(("text", "error"), [
    (b'{"group_manifest_version": 2, "group": "g", "tables": [], "cuts": []}', UnsupportedManifestVersion),
    (b'{"group_manifest_version": 1, "group": "g", "tables": [], "cuts": [{"position": "0/1"}]}', CorruptManifest),
    (b"not json", CorruptManifest),
])
def test_bad_group_manifests(text: bytes, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"g\.json"):
        loads(text, source="g.json")
