"""The buffer keeps the schema of the rows it holds, per segment, across a schema-change re-sync.

The source announces a new shape by a re-sync (`ResyncBegin("schema change")`, the new schema, the
rows in it): the segments sealed before it keep the old schema, the re-sync's segment and those
after it carry the new one, and the next artifact is a snapshot named `schema_change`. What the
buffer says it holds durably (`durable_schema`, the schema a restarted source is told) never runs
ahead of what is sealed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

from resources.buffer import BufferReader, ChangeBuffer
from resources.subscribers.events import (
    SCHEMA_CHANGE,
    ChangeEvent,
    Column,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.policy import Policy
from snapshot_assets.pipeline.decide import SNAPSHOT_ONLY_TRIGGERS, next_artifact
from tests.buffer.helpers import SIMPLE_SCHEMA, lsn

WIDER = replace(SIMPLE_SCHEMA, columns=(*SIMPLE_SCHEMA.columns,
                                        Column("extra", "integer", ordinal=3, default="5", type_oid=23)))


def insert(position: int, ident: int, **values: object) -> ChangeEvent:
    return ChangeEvent(lsn(position), Action.INSERT, new={"id": ident, "v": "x", **values})


def test_segments_keep_their_own_schema_and_the_resync_names_its_reason(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, "public.t", seal_interval=3600) as buf:
        buf.append(SchemaEvent(SIMPLE_SCHEMA))
        buf.append(ResyncBegin("initial load"))
        buf.append(SnapshotRow({"id": 1, "v": "a"}))
        buf.append(ResyncEnd(lsn(10), 1))
        buf.append(insert(20, 2))
        buf.append(TxEnd(lsn(20)))
        buf.append(insert(30, 3))  # a partial transaction: the re-sync supersedes it
        assert buf.append(ResyncBegin(SCHEMA_CHANGE))  # seals what is complete, in the old shape
        buf.append(SchemaEvent(WIDER))
        for ident in (1, 2, 3):
            buf.append(SnapshotRow({"id": ident, "v": "a", "extra": 5}))
        buf.append(ResyncEnd(lsn(40), 3))
        buf.append(insert(50, 4, extra=6))
        buf.append(TxEnd(lsn(50)))
        buf.seal()

    reader = BufferReader(tmp_path, "public.t")
    assert reader.schema_at(lsn(10)) == SIMPLE_SCHEMA
    assert reader.schema_at(lsn(20)) == SIMPLE_SCHEMA
    assert reader.schema_at(lsn(40)) == WIDER and reader.schema_at(lsn(50)) == WIDER
    assert reader.schema_at(lsn(5)) is None
    assert reader.durable_schema() == WIDER
    assert reader.stats(lsn(20)).resync_reason == SCHEMA_CHANGE
    assert reader.stats(lsn(40)).resync_reason == ""

    committed = Manifest(table="public.t", epoch=1, head_position=lsn(20), artifacts=(
        Artifact(kind="snapshot", epoch=1, from_position=None, to_position=lsn(20),
                 created_at="2026-01-01T00:00:00Z", formats={}, row_count=2),))
    nxt = next_artifact(committed, reader.stats(lsn(20)), Policy(), dt.datetime.now(dt.UTC))
    assert (nxt.kind, nxt.trigger, nxt.to_position) == ("snapshot", "schema_change", lsn(50))
    assert nxt.trigger in SNAPSHOT_ONLY_TRIGGERS


def test_a_schema_announced_after_the_last_seal_is_forgotten_with_the_unsealed_rows(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, "public.t", seal_interval=3600) as buf:
        buf.append(SchemaEvent(SIMPLE_SCHEMA))
        buf.append(ResyncBegin("initial load"))
        buf.append(ResyncEnd(lsn(10), 0))
        buf.append(ResyncBegin(SCHEMA_CHANGE))
        buf.append(SchemaEvent(WIDER))
        buf.append(SnapshotRow({"id": 1, "v": "a", "extra": 5}))
        buf.rollback()  # the source failed mid re-sync: it resumes from what is durable
        assert buf.durable_schema() == SIMPLE_SCHEMA
        # The restarted source states the durable schema first; rows of the old shape are accepted.
        buf.append(SchemaEvent(buf.durable_schema() or SIMPLE_SCHEMA))
        buf.append(insert(20, 2))
        assert buf.append(TxEnd(lsn(20))) or buf.seal()
    assert BufferReader(tmp_path, "public.t").schema_at(lsn(20)) == SIMPLE_SCHEMA


def test_the_schema_shape_is_names_and_types_not_defaults_or_nullability() -> None:
    other_default = replace(WIDER, columns=tuple(replace(c, default=None, nullable=False) for c in WIDER.columns))
    assert other_default.shape == WIDER.shape
    retyped = replace(WIDER, columns=(*WIDER.columns[:2], replace(WIDER.columns[2], type="bigint", type_oid=20)))
    assert retyped.shape != WIDER.shape
    assert TableSchema("public.t", WIDER.columns[:2]).shape == SIMPLE_SCHEMA.shape
