"""The reader: laredo's plan / plan-as-of / reconstruct-as-of tables, plus this project's fixes."""

from __future__ import annotations

import pytest

from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.errors import (
    CorruptManifest,
    ManifestNotFound,
    MissingArtifact,
    PositionError,
    UnknownFormat,
    UnsupportedManifestVersion,
)
from snapshot_assets.archive.keys import laredo_row_key
from snapshot_assets.archive.manifest import Artifact, FormatRef, Manifest
from snapshot_assets.archive.positions import compare_sequence
from snapshot_assets.archive.reader import ArchiveReader, plan, plan_as_of
from tests.archive.conftest import PREFIX, BuildArchive

ALICE = {"id": 1, "name": "alice"}
BOB = {"id": 2, "name": "bob"}
BOB2 = {"id": 2, "name": "bob2"}
CAROL = {"id": 3, "name": "carol"}


def ins(row: dict[str, object]) -> Change:
    return Change(Action.INSERT, laredo_row_key(row, ["id"]), None, row)


def upd(old: dict[str, object], new: dict[str, object]) -> Change:
    return Change(Action.UPDATE, laredo_row_key(new, ["id"]), old, new)


def dele(old: dict[str, object]) -> Change:
    return Change(Action.DELETE, laredo_row_key(old, ["id"]), old, None)


def asof_steps() -> list[tuple[str, int, str | None, str, list]]:  # type: ignore[type-arg]
    """laredo's asofArchive: snapshot@100 [alice, bob]; 100→200 updates bob, inserts carol; 200→300 deletes alice."""
    return [
        ("snapshot", 1, None, "100", [ALICE, BOB]),
        ("diff", 1, "100", "200", [upd(BOB, BOB2), ins(CAROL)]),
        ("diff", 1, "200", "300", [dele(ALICE)]),
    ]


@pytest.fixture
def asof(build_archive: BuildArchive) -> tuple[ArchiveReader, Manifest]:
    dest, _ = build_archive(asof_steps())
    reader = ArchiveReader(dest, PREFIX, cmp=compare_sequence)
    return reader, reader.load_manifest()


def names(reader: ArchiveReader, at: str) -> tuple[str, dict[int, str]]:
    rec = reader.reconstruct_as_of(at)
    assert rec is not None
    return rec.position, {r["id"]: r["name"] for r in rec.rows}


# ---- laredo TestReader_Plan -------------------------------------------------------------------


def test_plan_snapshot_base_when_position_predates_chain(asof: tuple[ArchiveReader, Manifest]) -> None:
    _, m = asof
    p = plan(m, "50", compare_sequence)
    assert p is not None and p.snapshot is not None and p.snapshot.to_position == "100"
    assert len(p.diffs) == 2 and p.head_position == "300"


def test_plan_diff_only_when_aligned(asof: tuple[ArchiveReader, Manifest]) -> None:
    _, m = asof
    p = plan(m, "100", compare_sequence)
    assert p is not None and p.snapshot is None and len(p.diffs) == 2 and p.head_position == "300"
    p = plan(m, "200", compare_sequence)
    assert p is not None and p.snapshot is None and [d.to_position for d in p.diffs] == ["300"]


def test_plan_at_head_is_empty_diff_only(asof: tuple[ArchiveReader, Manifest]) -> None:
    # laredo would hand a consumer that is already at the head a full snapshot; nothing is needed.
    _, m = asof
    p = plan(m, "300", compare_sequence)
    assert p is not None and p.snapshot is None and p.diffs == () and p.head_position == "300"


def test_plan_empty_or_snapshotless_manifest() -> None:
    assert plan(Manifest(table="t"), "0", compare_sequence) is None
    ref = {"jsonl": FormatRef("", 0)}
    m = Manifest(table="t", head_position="300",
                 artifacts=(Artifact("diff", 1, "200", "300", "", ref),))
    assert plan(m, "50", compare_sequence) is None


# ---- laredo TestReader_PlanAsOf ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "head", "n_diffs"),
    [("100", "100", 0), ("150", "100", 0), ("200", "200", 1), ("300", "300", 2), ("999", "300", 2)],
    ids=["at snapshot boundary", "between boundaries excludes straddling diff", "at first diff boundary",
         "at head", "beyond head clamps to head"],
)
def test_plan_as_of(asof: tuple[ArchiveReader, Manifest], position: str, head: str, n_diffs: int) -> None:
    _, m = asof
    p = plan_as_of(m, position, compare_sequence)
    assert p is not None and p.snapshot is not None and p.snapshot.to_position == "100"
    assert (p.head_position, len(p.diffs)) == (head, n_diffs)


def test_plan_as_of_predates_archive(asof: tuple[ArchiveReader, Manifest]) -> None:
    assert plan_as_of(asof[1], "50", compare_sequence) is None


# ---- laredo TestReader_ReconstructAsOf --------------------------------------------------------


def test_reconstruct_as_of(asof: tuple[ArchiveReader, Manifest]) -> None:
    reader, _ = asof
    assert names(reader, "100") == ("100", {1: "alice", 2: "bob"})
    assert names(reader, "200") == ("200", {1: "alice", 2: "bob2", 3: "carol"})
    assert names(reader, "300") == ("300", {2: "bob2", 3: "carol"})
    assert names(reader, "150") == ("100", {1: "alice", 2: "bob"})
    assert reader.reconstruct_as_of("50") is None
    rec = reader.reconstruct_as_of()
    assert rec is not None and rec.position == "300"


# ---- this project's fixes ---------------------------------------------------------------------


def test_truncate_inside_a_diff_applies_first(build_archive: BuildArchive) -> None:
    # laredo wrote diff lines in map order: a TRUNCATE may follow inserts made after it.
    dest, _ = build_archive([
        ("snapshot", 1, None, "100", [ALICE, BOB]),
        ("diff", 1, "100", "200", [ins(CAROL), Change(Action.TRUNCATE), upd(CAROL, {"id": 3, "name": "c2"})]),
    ])
    reader = ArchiveReader(dest, PREFIX, cmp=compare_sequence)
    assert names(reader, "200") == ("200", {3: "c2"})


def test_from_equals_to_diff_is_applied_once(build_archive: BuildArchive, tmp_path: object) -> None:
    # A laredo archive can hold a diff with from == to; laredo's reader loops on it forever.
    _dest, m = build_archive([
        ("snapshot", 1, None, "100", [ALICE]),
        ("diff", 1, "100", "200", [ins(BOB)]),
    ])
    looped = Artifact("diff", 1, "200", "200", "", m.artifacts[1].formats, change_count=1)
    bad = Manifest(table=m.table, epoch=1, head_position="200", artifacts=(*m.artifacts, looped))
    p = plan_as_of(bad, "200", compare_sequence)
    assert p is not None and len(p.diffs) == 2  # each listed diff at most once
    with pytest.raises(CorruptManifest, match="from_position == to_position"):
        bad.validate(compare_sequence)


def test_big_integer_keys_stay_exact(build_archive: BuildArchive) -> None:
    big = 2**53 + 1
    a, b = {"id": big, "v": "a"}, {"id": big + 1, "v": "b"}
    for formats in (("jsonl",), ("protobuf",), ("parquet",)):
        dest, _ = build_archive([
            ("snapshot", 1, None, "1", [a, b]),
            ("diff", 1, "1", "2", [dele(a), upd(b, {**b, "v": "b2"})]),
        ], formats=formats)
        rec = ArchiveReader(dest, PREFIX, cmp=compare_sequence).reconstruct_as_of()
        assert rec is not None
        assert [(str(r["id"]), r["v"]) for r in rec.rows] == [(str(big + 1), "b2")], formats


def test_laredo_mixed_key_strings(build_archive: BuildArchive) -> None:
    # laredo keyed diffs from integers ("1000000") but snapshots from doubles ("1e+06");
    # folding by typed key reads such archives correctly.
    row = {"id": 1000000, "name": "m"}
    dest, _ = build_archive([
        ("snapshot", 1, None, "1", [row]),
        ("diff", 1, "1", "2", [Change(Action.UPDATE, "1000000", row, {**row, "name": "m2"})]),
    ])
    rec = ArchiveReader(dest, PREFIX, cmp=compare_sequence).reconstruct_as_of()
    assert rec is not None and rec.rows == [{"id": 1000000, "name": "m2"}]


def test_composite_keys(build_archive: BuildArchive) -> None:
    r1, r2 = {"tenant": "acme", "id": 1, "v": 1}, {"tenant": "beta", "id": 1, "v": 2}
    key = ["tenant", "id"]
    dest, _ = build_archive([
        ("snapshot", 1, None, "1", [r1, r2]),
        ("diff", 1, "1", "2", [Change(Action.DELETE, "[acme 1]", r1, None)]),
    ], key_fields=key)
    rec = ArchiveReader(dest, PREFIX, key_fields=key, cmp=compare_sequence).reconstruct_as_of()
    assert rec is not None and rec.rows == [r2]


def test_rebase_across_epochs(build_archive: BuildArchive) -> None:
    dest, _ = build_archive([
        *asof_steps(),
        ("snapshot", 2, None, "400", [BOB2, CAROL, {"id": 4, "name": "dave"}]),
        ("diff", 2, "400", "500", [dele(CAROL)]),
    ])
    reader = ArchiveReader(dest, PREFIX, cmp=compare_sequence)
    assert names(reader, "350") == ("300", {2: "bob2", 3: "carol"})
    assert names(reader, "400") == ("400", {2: "bob2", 3: "carol", 4: "dave"})
    assert names(reader, "500") == ("500", {2: "bob2", 4: "dave"})
    p = plan(reader.load_manifest(), "300", compare_sequence)
    assert p is not None and p.snapshot is not None and p.snapshot.epoch == 2


# ---- errors -----------------------------------------------------------------------------------


def test_missing_manifest(build_archive: BuildArchive) -> None:
    dest, _ = build_archive([("snapshot", 1, None, "1", [ALICE])])
    with pytest.raises(ManifestNotFound):
        ArchiveReader(dest, "other/").load_manifest()


def test_newer_manifest_is_refused(build_archive: BuildArchive) -> None:
    dest, m = build_archive([("snapshot", 1, None, "1", [ALICE])])
    dest.put(PREFIX + "manifest.json", m.dumps().replace(b'"manifest_version": 1', b'"manifest_version": 2'))
    with pytest.raises(UnsupportedManifestVersion, match="manifest_version 2"):
        ArchiveReader(dest, PREFIX).load_manifest()


def test_corrupt_manifest(build_archive: BuildArchive) -> None:
    dest, _ = build_archive([("snapshot", 1, None, "1", [ALICE])])
    dest.put(PREFIX + "manifest.json", b'{"manifest_version": 1, "artifacts": [{"kind": "blob"}]')
    with pytest.raises(CorruptManifest, match="not valid JSON"):
        ArchiveReader(dest, PREFIX).load_manifest()


def test_missing_object_and_unknown_format(build_archive: BuildArchive) -> None:
    dest, m = build_archive([("snapshot", 1, None, "1", [ALICE])])
    dest.delete(PREFIX + "epoch=1/snapshot-1.jsonl")
    reader = ArchiveReader(dest, PREFIX, cmp=compare_sequence)
    with pytest.raises(MissingArtifact, match="object missing"):
        reader.reconstruct_as_of()
    with pytest.raises(UnknownFormat, match="protobuf"):
        ArchiveReader(dest, PREFIX, formats=["protobuf"]).format_for(m.artifacts[0])


def test_wrong_lsn_position(build_archive: BuildArchive) -> None:
    dest, _ = build_archive([("snapshot", 1, None, "0/10", [ALICE])])
    with pytest.raises(PositionError, match="not a PostgreSQL LSN"):
        ArchiveReader(dest, PREFIX).reconstruct_as_of("yesterday")
