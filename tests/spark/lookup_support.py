"""Archives built by the Spark jobs for the get(key) tests (tests/spark/test_lookup.py) and the
read-only credentials test (tests/aws/test_read_only.py): a change buffer with an initial load and
waves of updates, inserts and deletes; epoch 1 a full snapshot and two diffs, epoch 2 an incremental
re-base (most buckets copied, their key index entries kept) and one more diff."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resources.buffer import BufferReader, ChangeBuffer
from resources.destinations.local import LocalDestination
from resources.subscribers.events import (
    ChangeEvent,
    Column,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.archive.manifest import DIFF, SNAPSHOT, Artifact, Manifest, utc_now
from snapshot_assets.archive.positions import comparator, format_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.pipeline.commit import commit_artifact
from snapshot_assets.spark.assemble import assemble
from snapshot_assets.spark.bases import BufferSnapshotBase, EmptyBase, LayeredBase
from snapshot_assets.spark.diff import build_diff
from snapshot_assets.spark.parts import BuiltArtifact
from snapshot_assets.spark.snapshot import build_snapshot
from snapshot_assets.spark.state import StateBase

FORMATS_ = ("jsonl", "protobuf")
BIG = 2**60  # snowflake-like ids, beyond 2^53
PREFIX = "t/"


@dataclass
class Built:
    dest: LocalDestination
    positions: list[str]  # every transaction end, the initial load first
    key_fields: tuple[str, ...]
    rebase: BuiltArtifact  # the epoch-2 snapshot (incremental)
    keys: list[TypedKey]  # every key that ever existed
    changes: list[list[TypedKey]]  # the keys each transaction changed (positions[1:], in order)

    def reader(self) -> ArchiveReader:
        return ArchiveReader(self.dest, PREFIX, key_fields=self.key_fields)

    def expected_version(self, key: TypedKey, at: str) -> tuple[str, str | None, bool]:
        """(position, commit time, copied) of the key's last change at or before the boundary `at`:
        the oracle of get()'s version, from what the buffer was given."""
        last = self.positions.index(at)
        for i in range(last, 0, -1):
            if key in self.changes[i - 1]:
                return self.positions[i], gojson.time_text(commit_time(i)), False
        return self.positions[0], None, True


def commit_time(wave: int) -> _dt.datetime:
    """The commit time the source gives transaction `wave` (1-based)."""
    return _dt.datetime(2026, 11, 1, 12, 0, wave, 250000 * (wave % 4), tzinfo=_dt.UTC)


def _buffer(root: Path, table: str, columns: Sequence[Column], make: Callable[[int, int], dict[str, Any]],
            initial: int, waves: list[list[tuple[Action, int]]]) -> tuple[BufferReader, list[str]]:
    lsn, positions = 0x1000, []
    with ChangeBuffer(root, table, seal_interval=3600.0, seal_changes=10_000) as buffer:
        buffer.append(SchemaEvent(TableSchema(table, tuple(columns))))
        buffer.append(ResyncBegin("initial load"))
        for i in range(initial):
            buffer.append(SnapshotRow(make(i, 0)))
        buffer.append(ResyncEnd(format_lsn(lsn), initial))
        positions.append(format_lsn(lsn))
        for w, wave in enumerate(waves, start=1):
            lsn += 0x40 * (len(wave) + 1)  # a change's position is its transaction's commit position
            for action, i in wave:
                old = make(i, 0) if action is not Action.INSERT else None
                new = make(i, w) if action is not Action.DELETE else None
                buffer.append(ChangeEvent(format_lsn(lsn), action, old, new, commit_time=commit_time(w)))
            buffer.append(TxEnd(format_lsn(lsn)))
            positions.append(format_lsn(lsn))
        buffer.seal()
    return BufferReader(root, table), positions


def _commit(m: Manifest, built: BuiltArtifact, dest: LocalDestination, epoch: int, table: str,
            columns: Sequence[Column]) -> Manifest:
    refs = assemble(built, [dest], PREFIX, epoch)
    kind = SNAPSHOT if built.kind == "snapshot" else DIFF
    art = Artifact(kind=kind, epoch=epoch, from_position=built.from_position, to_position=built.to_position,
                   created_at=utc_now(), formats=refs, row_count=built.count if kind == SNAPSHOT else 0,
                   change_count=built.count if kind == DIFF else 0)
    return commit_artifact([dest], PREFIX, table, art, cmp=comparator("lsn"),
                           columns=[c.definition() for c in columns]).manifest


def build_archive(spark: Any, work: Path, table: str, columns: Sequence[Column],
                  make: Callable[[int, int], dict[str, Any]], initial: int, bucket_bytes: int) -> Built:
    """Epoch 1: a full snapshot of the initial load and two diffs; epoch 2: an incremental re-base
    (most buckets copied from epoch 1's object, their index entries kept) and one more diff."""
    key_fields = tuple(c.name for c in sorted((c for c in columns if c.primary_key),
                                               key=lambda c: c.primary_key_ordinal))
    recent = range(initial - 60, initial)
    waves = [
        [(Action.UPDATE, i) for i in range(0, initial // 8, 37)] + [(Action.INSERT, initial + j) for j in range(20)],
        [(Action.DELETE, i) for i in range(5, initial // 8, 41)] + [(Action.UPDATE, i) for i in recent],
        [(Action.UPDATE, i) for i in recent] + [(Action.DELETE, initial + 3)],
        [(Action.DELETE, i) for i in range(initial - 10, initial)] + [(Action.INSERT, initial + 40)],
    ]
    reader, positions = _buffer(work / "buffer", table, columns, make, initial, waves)
    dest = LocalDestination(work / "archive")
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    p = positions
    first = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], p[0], key_fields,
                           FORMATS_, work / "s1", work / "state" / "epoch=1", bucket_bytes=bucket_bytes)
    m = _commit(Manifest(table=table), first, dest, 1, table, columns)
    for n, (lo, hi) in enumerate([(p[0], p[1]), (p[1], p[2])]):
        m = _commit(m, build_diff(spark, reader.segments(lo, hi), EmptyBase(lo), hi, key_fields, FORMATS_,
                                  work / f"d{n}", work / f"delta{n}"), dest, 1, table, columns)
    state: StateBase = first.details["state"]
    previous = {fid: f"{PREFIX}epoch=1/snapshot-{p[0].replace('/', '_')}{ext}"
                for fid, ext in (("jsonl", ".jsonl"), ("protobuf", ".pb"), ("versions", ".versions"))}
    rebase = build_snapshot(spark, LayeredBase(state, ()), reader.segments(p[0], p[3]), p[3], key_fields, FORMATS_,
                            work / "s2", work / "state" / "epoch=2", previous_keys=previous, bucket_bytes=bucket_bytes)
    m = _commit(m, rebase, dest, 2, table, columns)
    m = _commit(m, build_diff(spark, reader.segments(p[3], p[4]), EmptyBase(p[3]), p[4], key_fields, FORMATS_,
                              work / "d3", work / "delta3"), dest, 2, table, columns)
    assert m.head_position == p[4] and not m.problems()
    ever = [typed_key(make(i, 0), key_fields) for i in range(initial + 41)]
    changed = [[typed_key(make(i, 0), key_fields) for _, i in wave] for wave in waves]
    return Built(dest, positions, key_fields, rebase, ever, changed)


def int_row(i: int, version: int) -> dict[str, Any]:
    return {"id": BIG + i, "name": f"user {i}", "note": "x" * (40 + i % 17), "version": version}


def composite_row(i: int, version: int) -> dict[str, Any]:
    return {"tenant": f"tenant-{i % 7}", "id": i, "name": f"n{i}", "version": version}


INT_COLUMNS = (Column("id", "int8", False, True, 1, 1, type_oid=20), Column("name", "text", ordinal=2, type_oid=25),
               Column("note", "text", ordinal=3, type_oid=25), Column("version", "int4", ordinal=4, type_oid=23))
