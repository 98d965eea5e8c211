"""get(key) on archives built by the Spark jobs: the row equals the reconstructed table's at every
position (after updates, deletes and an incremental re-base), reading a small part of the snapshot."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from resources.destinations.local import LocalDestination
from resources.subscribers.events import Column
from snapshot_assets.archive import lookup
from snapshot_assets.archive.key_index import KeyIndex, index_key
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.cli import main
from snapshot_assets.pipeline.commit import delete_artifacts
from snapshot_assets.spark.state import StateBase
from tests.spark.lookup_support import (
    BIG,
    FORMATS_,
    INT_COLUMNS,
    PREFIX,
    Built,
    build_archive,
    composite_row,
    int_row,
)

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def int_archive(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_archive(spark, tmp_path_factory.mktemp("lookup-int"), "public.events", INT_COLUMNS, int_row,
                         3000, 32 * 1024)


@pytest.fixture(scope="module")
def composite_archive(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    columns = (Column("tenant", "text", False, True, 1, 1, type_oid=25), Column("id", "int8", False, True, 2, 2,
                                                                                 type_oid=20),
               Column("name", "text", ordinal=3, type_oid=25), Column("version", "int4", ordinal=4, type_oid=23))
    return build_archive(spark, tmp_path_factory.mktemp("lookup-composite"), "public.accounts", columns,
                         composite_row, 1200, 8 * 1024)


def _assert_matches(built: Built, sample: int, seed: int) -> list[lookup.LookupResult]:
    """get() of random keys (present, deleted, never there) equals the reconstruction at every position,
    with the version and commit time of the key's last change that the source gave."""
    rng = random.Random(seed)
    reader = built.reader()
    m = reader.load_manifest()
    results = []
    for at in built.positions:
        rec = reader.reconstruct_as_of(at, m)
        assert rec is not None
        table = {typed_key(r, built.key_fields): r for r in rec.rows}
        wanted = [*rng.sample(built.keys, sample), built.keys[-1]]
        for key in wanted:
            got = lookup.Lookup(reader).get(key, at, m)
            assert got.position == rec.position
            assert got.row == table.get(key), (at, key)
            position, committed, copied = built.expected_version(key, rec.position)
            if got.row is None and copied:  # not there yet: no version
                assert got.version is None, (at, key, got)
            else:
                assert (got.version, got.commit_time, got.copied, got.exact) == (position, committed, copied, True), \
                    (at, key, got)
            results.append(got)
    return results


def test_get_equals_the_reconstructed_row_at_every_position(int_archive: Built) -> None:
    results = _assert_matches(int_archive, 25, 7)
    assert all(r.used_index for r in results)
    changed = [r for r in results if r.version is not None and not r.copied]
    assert changed and all(r.commit_time for r in changed)
    assert any(r.changed_after is None for r in changed)  # changed before the re-base: from its versions object
    assert any(r.copied and r.found for r in results)  # unchanged since the initial load: its position
    deleted = [r for r in results if r.deleted_at is not None]
    assert deleted and all(r.row is None and r.deleted_at == r.version for r in deleted)

    for r in results:  # the snapshot part of a lookup is the index and one block, a small share of the object
        assert r.bytes_read.scanned == 0
        assert r.bytes_read.ranges <= 4 * 1024 + 200 and r.bytes_read.index < r.snapshot_bytes / 4


def test_composite_keys(composite_archive: Built) -> None:
    _assert_matches(composite_archive, 20, 11)


def test_the_rebase_kept_the_index_entries_of_the_buckets_it_copied(int_archive: Built) -> None:
    built = int_archive
    state: StateBase = built.rebase.details["state"]
    assert built.rebase.details["mode"] == "incremental"
    assert 0 < built.rebase.details["rewritten"] < len(state.buckets)
    got = built.dest.get(index_key(PREFIX, 2, built.positions[3]))
    assert got is not None
    index = KeyIndex.loads(got.data, "epoch 2")
    assert len(index.sks) > 3 * len(state.buckets)  # entries inside buckets, not only their bounds
    data = built.dest.get(f"{PREFIX}epoch=2/snapshot-{built.positions[3].replace('/', '_')}.jsonl")
    assert data is not None and index.sizes["jsonl"] == len(data.data)
    lines = data.data.split(b"\n")[:-1]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    assert set(index.offsets["jsonl"]) <= set(starts[:-1])  # every entry starts a row


def test_a_snapshot_without_an_index_is_scanned_and_says_so(int_archive: Built, tmp_path: Path) -> None:
    copy = LocalDestination(tmp_path / "archive")
    shutil.copytree(int_archive.dest.root, tmp_path / "archive", dirs_exist_ok=True)
    for epoch, position in ((1, int_archive.positions[0]), (2, int_archive.positions[3])):
        copy.delete(index_key(PREFIX, epoch, position))
    reader = ArchiveReader(copy, PREFIX, key_fields=int_archive.key_fields)
    for at in (int_archive.positions[1], int_archive.positions[4]):
        rec = reader.reconstruct_as_of(at)
        assert rec is not None
        table = {typed_key(r, int_archive.key_fields): r for r in rec.rows}
        for key in random.Random(3).sample(int_archive.keys, 15):
            got = lookup.Lookup(reader).get(key, at)
            assert got.row == table.get(key)
            assert got.row is None or (got.exact and got.version is not None)  # versions streamed to the row's line
            assert not got.used_index and got.bytes_read.scanned == got.snapshot_bytes > 0
            assert any("has no key index: scanning" in n for n in got.notes)
            assert "snapshot scanned" in lookup.explain(got)


def test_retention_deletes_the_index_with_its_snapshot(int_archive: Built, tmp_path: Path) -> None:
    copy = LocalDestination(tmp_path / "archive")
    shutil.copytree(int_archive.dest.root, tmp_path / "archive", dirs_exist_ok=True)
    m = ArchiveReader(copy, PREFIX).load_manifest()
    first = next(m.snapshots())
    key = index_key(PREFIX, first.epoch, first.to_position)
    assert copy.get(key) is not None
    delete_artifacts([copy], PREFIX, [first])
    assert copy.get(key) is None


def test_cli_get_prints_the_row_and_the_bytes_read(int_archive: Built, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    base = ["get", "--path", str(int_archive.dest.root), "--table", "public.t"]
    key = BIG + 2500  # never changed: in the snapshot, unchanged since
    assert main([*base, "--key", str(key), "--verbose"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["found"] and doc["row"]["id"] == key and doc["unchanged_since"] == int_archive.positions[3]
    assert doc["version"] == int_archive.positions[0] and doc["copied"] and doc["commit_time"] is None
    assert "key index + one range" in err and "bytes read:" in err and "unchanged since the copy" in err
    updated = BIG + 37  # updated by the first transaction, in the first diff
    assert main([*base, "--key", str(updated), "--at", int_archive.positions[2]]) == 0
    doc = json.loads(capsys.readouterr()[0])
    assert doc["version"] == int_archive.positions[1] and doc["commit_time"] == "2026-11-01T12:00:01.25Z"
    assert doc["changed_after"] == int_archive.positions[0] and "copied" not in doc
    assert f'"id":{key}' in out  # exact beyond 2^53, not a rounded double
    deleted = BIG + 5
    assert main([*base, "--key", str(deleted), "--at", int_archive.positions[2]]) == 0
    doc = json.loads(capsys.readouterr()[0])
    assert not doc["found"] and doc["deleted_at"] == int_archive.positions[2]
    assert main([*base, "--key", "abc"]) == 1
    assert "holds integers; 'abc' is not one" in capsys.readouterr()[1]
    assert main([*base, "--key", "1", "--key", "2"]) == 1
    assert "2 key value(s)" in capsys.readouterr()[1]
    assert main([*base, "--key", "1", "--key-fields", "tenant,id"]) == 1
    assert "key fields" in capsys.readouterr()[1]


def test_cli_get_composite_and_wrong_key_fields(composite_archive: Built,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import json

    base = ["get", "--path", str(composite_archive.dest.root), "--key-prefix", PREFIX]
    assert main([*base, "--key", "tenant-3", "--key", "10"]) == 0
    doc = json.loads(capsys.readouterr()[0])
    assert doc["found"] and doc["row"]["tenant"] == "tenant-3" and doc["row"]["id"] == 10
    assert main([*base, "--key", "10", "--key-fields", "id"]) == 1
    assert "keyed by ['tenant', 'id'], not ['id']" in capsys.readouterr()[1]


def test_a_state_from_before_key_index_entries_makes_the_next_snapshot_a_full_build(int_archive: Built) -> None:
    """Its snapshot could get no index (its buckets have no entries): one full build writes them."""
    from dataclasses import replace

    from snapshot_assets.spark.snapshot import _incremental_base

    state: StateBase = int_archive.rebase.details["state"]
    assert _incremental_base(state, int_archive.key_fields, FORMATS_, None) is not None
    old = replace(state, buckets=tuple(replace(b, index=None) for b in state.buckets))
    assert old.key_index() is None
    assert _incremental_base(old, int_archive.key_fields, FORMATS_, None) is None


def test_a_diff_of_several_transactions_gives_each_key_its_own_version(spark: Any, tmp_path: Path) -> None:
    """One diff over four transactions, one of them a TRUNCATE: each key's version is the position
    and commit time of its own last change inside the window, a key the TRUNCATE removed reports
    the TRUNCATE's, and a diff without a versions object (an older archive) falls back to its end."""
    from resources.buffer import BufferReader, ChangeBuffer
    from resources.subscribers.events import (
        ChangeEvent,
        ResyncBegin,
        ResyncEnd,
        SchemaEvent,
        SnapshotRow,
        TableSchema,
        TxEnd,
    )
    from snapshot_assets.archive.changes import Action
    from snapshot_assets.archive.manifest import Manifest
    from snapshot_assets.archive.positions import format_lsn
    from snapshot_assets.archive.versions import diff_versions_key
    from snapshot_assets.spark.bases import BufferSnapshotBase, EmptyBase
    from snapshot_assets.spark.diff import build_diff
    from snapshot_assets.spark.snapshot import build_snapshot
    from tests.spark.lookup_support import _commit, commit_time

    table, fields = "public.events", ("id",)
    txs: list[list[tuple[Action, int]]] = [
        [(Action.UPDATE, i) for i in range(1, 6)],
        [(Action.UPDATE, 2), (Action.DELETE, 4)],
        [(Action.TRUNCATE, -1), (Action.INSERT, 3)],
        [(Action.UPDATE, 3), (Action.INSERT, 60)],
    ]
    positions = [format_lsn(0x1000 + 0x100 * t) for t in range(len(txs) + 1)]
    with ChangeBuffer(tmp_path / "buffer", table, seal_interval=3600.0, seal_changes=10_000) as buffer:
        buffer.append(SchemaEvent(TableSchema(table, INT_COLUMNS)))
        buffer.append(ResyncBegin("initial load"))
        for i in range(50):
            buffer.append(SnapshotRow(int_row(i, 0)))
        buffer.append(ResyncEnd(positions[0], 50))
        for t, tx in enumerate(txs, start=1):
            for action, i in tx:
                old = int_row(i, 0) if action in (Action.UPDATE, Action.DELETE) else None
                new = int_row(i, t) if action in (Action.UPDATE, Action.INSERT) else None
                buffer.append(ChangeEvent(positions[t], action, old, new, commit_time=commit_time(t)))
            buffer.append(TxEnd(positions[t]))
        buffer.seal()
    reader = BufferReader(tmp_path / "buffer", table)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    dest = LocalDestination(tmp_path / "archive")
    first = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], fields,
                           FORMATS_, tmp_path / "s1", tmp_path / "state" / "epoch=1")
    m = _commit(Manifest(table=table), first, dest, 1, table, INT_COLUMNS)
    diff = build_diff(spark, reader.segments(positions[0], positions[4]), EmptyBase(positions[0]), positions[4],
                      fields, FORMATS_, tmp_path / "d1", tmp_path / "delta1")
    _commit(m, diff, dest, 1, table, INT_COLUMNS)
    lookups = lookup.Lookup(ArchiveReader(dest, PREFIX, key_fields=fields))

    def version(i: int) -> tuple[Any, ...]:
        got = lookups.get((BIG + i,))
        return got.found, got.version, got.commit_time, got.deleted_at

    text = [gojson_time(t) for t in range(len(txs) + 1)]
    assert version(3) == (True, positions[4], text[4], None)  # re-inserted after the TRUNCATE, then updated
    assert version(60) == (True, positions[4], text[4], None)
    assert version(2) == (False, positions[3], text[3], positions[3])  # updated at 2, then truncated at 3
    assert version(4) == (False, positions[3], text[3], positions[3])  # deleted at 2: the TRUNCATE is its last
    assert version(40) == (False, positions[3], text[3], positions[3])  # only the TRUNCATE touched it
    assert version(70) == (False, None, None, None)  # never there
    # an archive written before diffs had versions objects: the diff's end, said to be inexact
    dest.delete(diff_versions_key(PREFIX, 1, positions[0], positions[4]))
    got = lookups.get((BIG + 2,))
    assert (got.version, got.exact, got.commit_time) == (positions[4], False, None)
    assert any("no versions object" in n for n in got.notes)
    assert lookup.describe(got)["version_exact"] is False


def gojson_time(wave: int) -> str | None:
    from snapshot_assets.archive import gojson
    from tests.spark.lookup_support import commit_time

    return gojson.time_text(commit_time(wave)) if wave else None


def test_verify_deep_checks_the_versions_objects(int_archive: Built, tmp_path: Path) -> None:
    from snapshot_assets.archive.verify import verify_archive
    from snapshot_assets.archive.versions import snapshot_versions_key

    copy = LocalDestination(tmp_path / "archive")
    shutil.copytree(int_archive.dest.root, tmp_path / "archive", dirs_exist_ok=True)
    reader = ArchiveReader(copy, PREFIX, key_fields=int_archive.key_fields)
    assert verify_archive(reader, deep=True) == []
    key = snapshot_versions_key(PREFIX, 2, int_archive.positions[3])
    got = copy.get(key)
    assert got is not None
    copy.put(key, got.data[: got.data.rindex(b"\n", 0, len(got.data) - 1) + 1])  # one line short
    assert [p for p in verify_archive(reader, deep=True) if "versions object holds" in p]
    assert lookup.Lookup(reader).get((BIG + 2500,)).exact  # the lines before the cut still read
