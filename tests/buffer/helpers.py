"""Shared helpers: read a buffer back, replay it, and describe a generator's history the same way."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from resources.buffer import BufferReader, SegmentRef
from resources.buffer.segments import with_images
from resources.buffer.storage import BufferStorage
from resources.subscribers.events import (
    ChangeEvent,
    Column,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from resources.subscribers.generator import KEY_FIELDS, GeneratorSubscriber
from snapshot_assets.archive import gojson
from snapshot_assets.archive.algebra import TableState, apply
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.archive.positions import compare_lsn, format_lsn

TABLE = "public.users"
HistoryEntry = tuple[str, str, TypedKey | None]  # (position, action, typed key)

SIMPLE_SCHEMA = TableSchema("public.t", (Column("id", "bigint", False, primary_key=True, ordinal=1,
                                                primary_key_ordinal=1),
                                         Column("v", "text", ordinal=2)))


def lsn(n: int) -> str:
    return format_lsn(n)


def read_refs(refs: Iterable[SegmentRef], storage: BufferStorage | None = None) -> list[dict[str, Any]]:
    """The rows Spark would read: each segment filtered by its seq range, in seq order, text rows
    with their images (`with_images`, as the diff job reads them); from `storage` when given (a
    buffer in S3, say), else from the segment's local path."""
    rows: list[dict[str, Any]] = []
    for ref in refs:
        source: Any = ref.path
        if storage is not None:
            with storage.open_read(ref.name) as f:
                source = io.BytesIO(f.read())
        table = pq.read_table(source, filters=[("seq", ">", ref.seq_from_exclusive),
                                               ("seq", "<=", ref.seq_to_inclusive)])
        for batch in table.to_batches():
            rows.extend(with_images(batch).to_pylist())
    return rows


def buffer_rows(root: Path | str, table: str = TABLE, storage: BufferStorage | None = None) -> list[dict[str, Any]]:
    """Every row the buffer holds, in seq order (asserted)."""
    rows = read_refs(BufferReader(root, table, storage=storage).all_segments(), storage)
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs)
    return rows


def row_history(rows: Iterable[dict[str, Any]]) -> list[HistoryEntry]:
    return [(r["position"], r["action"], None if r["key"] is None else tuple(json.loads(r["key"])))
            for r in rows]


def _loads(text: str | None) -> Row | None:
    return None if text is None else dict(gojson.loads(text))


def replay(rows: Iterable[dict[str, Any]], key_fields: Sequence[str] = KEY_FIELDS) -> TableState:
    """Fold buffer rows: a snapshot segment replaces the state, changes apply on top of it."""
    state: TableState = {}
    in_snapshot = False
    for r in rows:
        if r["action"] == "SNAPSHOT":
            if not in_snapshot:
                state, in_snapshot = {}, True
            new = _loads(r["new"])
            assert new is not None
            state[typed_key(new, key_fields)] = new
            continue
        in_snapshot = False
        old, new = _loads(r["old"]), _loads(r["new"])
        unchanged = json.loads(r["unchanged"]) if r.get("unchanged") else []
        if unchanged and new is not None:  # unchanged TOASTed values: the previous image of the row has them
            previous = state.get(typed_key(old if old is not None else new, key_fields), {})
            new = {**new, **{name: previous[name] for name in unchanged}}
        apply(state, [Change(Action(r["action"]), "", old=old, new=new)], key_fields)
    return state


def event_history(events: Iterable[Event], key_fields: Sequence[str] = KEY_FIELDS) -> Iterator[HistoryEntry]:
    """The (position, action, key) sequence a faithful buffer must hold for `events`."""
    pending: list[Row] = []
    for event in events:
        if isinstance(event, SnapshotRow):
            pending.append(event.row)
        elif isinstance(event, ResyncEnd):
            yield from ((event.position, "SNAPSHOT", typed_key(row, key_fields)) for row in pending)
            pending = []
        elif isinstance(event, ChangeEvent):
            image = event.new if event.new is not None else event.old
            key = None if image is None else typed_key(image, key_fields)
            yield event.position, event.action.value, key


def generator_history(gen: GeneratorSubscriber, through: str | None = None) -> list[HistoryEntry]:
    """The generator's full history (initial load included), optionally up to a position."""
    out = []
    for entry in event_history(gen.events(None)):
        if through is not None and compare_lsn(entry[0], through) > 0:
            break
        out.append(entry)
    return out


def initial_load(schema: TableSchema, position: str, rows: Sequence[Row] = ()) -> list[Event]:
    """Schema + a re-sync of `rows` ending at `position`."""
    return [SchemaEvent(schema), ResyncBegin("initial load"), *(SnapshotRow(r) for r in rows),
            ResyncEnd(position, len(rows))]


def insert(position: str, ident: int, value: str = "x") -> ChangeEvent:
    return ChangeEvent(position, Action.INSERT, new={"id": ident, "v": value})


def tx(position: str, *idents: int) -> list[Event]:
    """A transaction inserting `idents` at `position`, with its TxEnd."""
    return [*(insert(position, i) for i in idents), TxEnd(position)]
