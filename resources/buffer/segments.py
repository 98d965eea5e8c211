"""Buffer segments: the Parquet files Spark reads, their row encoding and their self-description.

A segment holds one transaction-aligned range `(from, to]` of one table's changes (kind `changes`)
or one complete re-sync (kind `snapshot`, every row action `SNAPSHOT` at the re-sync's end
position). Every row has the same seventeen columns (`SCHEMA`):

    seq          int64   strictly increasing over the table's whole buffer: the order Spark sorts by
    position     string  the change's own source position (never re-formatted)
    action       string  INSERT | UPDATE | DELETE | TRUNCATE | SNAPSHOT
    key          string  canonical JSON array of the typed key values (`keys.typed_key`): exact
                         integers, so Spark can group by it; the *new* image's key (the old one's for
                         a DELETE), null for a TRUNCATE. A primary-key-changing UPDATE is one row whose
                         `old` has another key: explode it with `algebra.key_effects` semantics
    old, new     string  Go-compatible JSON (`gojson`) of the row images, null when absent
    commit_time  string  RFC 3339 (Go's format), null when the source gave none
    unchanged    string  JSON array of the columns an UPDATE's `new` omits because they kept their
                         value (unchanged TOASTed values under REPLICA IDENTITY DEFAULT), else null.
                         Segments written before this column existed read it as null.
    old_key      string  a primary-key-changing UPDATE (its `old` names another key): the canonical
                         JSON of that old key; else null
    change_key   string  laredo's key string of the change (`keys.laredo_row_key` of `new`, else of
                         `old`), null for a TRUNCATE
    old_change_key string  laredo's key string of `old` for a primary-key change, else null
    old_partial  bool    `old` is absent or holds only key columns (`algebra.partial_image`), null
                         for a TRUNCATE
    old_carries_key bool `old` holds every key field (`algebra.carries_key`), null for a TRUNCATE
    codec        string  a change or copied row kept as PostgreSQL's column text
                         (`text_rows.RowCodec.text`: column names, converter specs, key), else null;
                         then `old`, `new` and the five derived columns are null in the file and
                         `with_images` computes them
    old_text, new_text  list<string>  that change's images as column text (`text_rows.TextValues`)
    old_absent   string  JSON array of the columns `old_text` lacks (unchanged TOASTed values), else null

Why the last five are stored: they are facts of one change that only a decoder of its images can
compute (exact integers, Go's `%v`, which columns an image holds), and ingest already holds the
decoded change. Stored, they let
the diff job run the change algebra as Spark SQL over `(key, seq)` without decoding an image
(`spark/effects.py`). Segments written before they existed read them as null; the diff job
derives them for such rows with `derived_columns`, the function ingest uses.

Why text: encoding two images of every change into Go's JSON took two thirds of the ingest's CPU.
A PostgreSQL change (`text_rows.TextChange`) is therefore stored as its column text, with only the
`key` computed at ingest (the buffer's own bookkeeping needs it, and it refuses a change without
one); every reader of change segments (the diff job's `read_window`, through `with_images`) turns
those rows into exactly the row `encode_change` writes for the typed change, by calling it. A
copied row (`text_rows.TextSnapshotRow`: the initial copy, a re-sync) is stored the same way, and
`with_images` encodes a batch of them column by column (`text_columns.encode_copies`): the copy is
the whole table, and encoding it on the ingest thread bounded an initial snapshot at ~25,000 rows/s.

Why the file describes itself: its Parquet key-value metadata carries its own index entry
(`SegmentMeta`), the table name and the table schema, so the index can always be rebuilt from the
segments alone — after a crash between a segment's rename and the index rewrite, or if the index
is lost.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from resources.buffer.storage import BufferStorage
from resources.subscribers.events import ChangeEvent, Column, TableSchema
from resources.subscribers.text_changes import IMAGE_COLUMNS, encode_changes
from resources.subscribers.text_columns import CellTyper, encode_copies, spread
from resources.subscribers.text_rows import RowCodec, TextChange, TextSnapshotRow, TextValues
from snapshot_assets.archive import gojson
from snapshot_assets.archive.algebra import MalformedChange, carries_key, partial_image
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.errors import MissingKeyField
from snapshot_assets.archive.keys import key_json, laredo_row_key, typed_key
from snapshot_assets.archive.positions import Comparator

SegmentKind = Literal["changes", "snapshot"]
SNAPSHOT_ACTION = "SNAPSHOT"
SEGMENT_FOLDER = "segments"
COMPRESSION = "zstd"
#: A snapshot segment's (a copy's) columns whose values repeat from row to row (its position and
#: action, the table's codec), the ones a dictionary shrinks. A copied row's key and column texts
#: differ in every row: a dictionary for them is built, found useless and dropped page after page.
#: On the 1,000,000-row copy of the benchmark's table the segment was written in 0.8-1.0 s instead of
#: 1.1-1.3 s and was 19.1 MB instead of 24.7 MB, read as fast or faster. A change segment keeps a
#: dictionary for every column: a row updated again and again repeats its key and much of its image.
SNAPSHOT_DICTIONARY_COLUMNS = ["position", "action", "commit_time", "unchanged", "codec", "old_absent"]

_META_SEGMENT = b"snapshotter.buffer.segment"
_META_TABLE = b"snapshotter.buffer.table"
_META_SCHEMA = b"snapshotter.buffer.schema"

SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("position", pa.string(), nullable=False),
    pa.field("action", pa.string(), nullable=False),
    pa.field("key", pa.string()),
    pa.field("old", pa.string()),
    pa.field("new", pa.string()),
    pa.field("commit_time", pa.string()),
    pa.field("unchanged", pa.string()),
    pa.field("old_key", pa.string()),
    pa.field("change_key", pa.string()),
    pa.field("old_change_key", pa.string()),
    pa.field("old_partial", pa.bool_()),
    pa.field("old_carries_key", pa.bool_()),
    pa.field("codec", pa.string()),
    pa.field("old_text", pa.list_(pa.string())),
    pa.field("new_text", pa.list_(pa.string())),
    pa.field("old_absent", pa.string()),
])
_POSITION_COLUMN = SCHEMA.get_field_index("position")

RowTuple = tuple[int, str, str, str | None, str | None, str | None, str | None, str | None, str | None, str | None,
                 str | None, bool | None, bool | None, str | None, TextValues | None, TextValues | None, str | None]
DerivedColumns = tuple[str | None, str | None, str | None, bool | None, bool | None]
"""old_key, change_key, old_change_key, old_partial, old_carries_key (`derived_columns`)."""
_NO_TEXT = (None, None, None, None)
"""codec, old_text, new_text, old_absent of a change whose images are encoded."""


# --- row encoding ------------------------------------------------------------------------------


def key_text(row: Row, key_fields: Sequence[str], where: str) -> str:
    """The `key` column: canonical JSON of the row's typed key (exact integers beyond 2^53).

    A row that lacks a key field, or holds NULL in one, names no row: folded under a `<nil>` key,
    every such row would become one. Both are refused here, at ingest, with `where` (the action and
    position, or the re-sync row) in the message, before anything is buffered. A PostgreSQL key
    (primary key or replica identity index) is NOT NULL anyway; a NULL can only come from key
    fields configured on columns that are not the table's key.
    """
    try:
        key = typed_key(row, key_fields)
    except MissingKeyField as exc:
        raise exc.at(where) from None
    for name, value in zip(key_fields, key, strict=True):
        if value is None:
            raise MalformedChange(f"{where} has NULL in key field {name!r} (key fields {list(key_fields)}): "
                                  "a NULL names no row")
    return key_json(key)


def _row_text(row: Row | None, key: str | None) -> str | None:
    return None if row is None else gojson.encode_row(row, lambda: key or "")


def derived_columns(action: Action, key: str | None, old: Row | None, new: Row | None, key_fields: Sequence[str],
                    where: str) -> DerivedColumns:
    """The derived columns of a change whose `key` is known (`DerivedColumns`).

    An UPDATE's `old` names a key only when it carries every key field (REPLICA IDENTITY DEFAULT
    sends the key columns only when they changed); a different one makes it a primary-key change.
    The key strings are laredo's (`laredo_row_key`, lone surrogates made writable), computed from
    the image the change names its key with: `new`, else `old` (`effects.buffer_change` agrees).
    """
    if action is Action.TRUNCATE:
        return None, None, None, None, None
    old_key = None
    named = carries_key(old, key_fields)
    if action is Action.UPDATE and named:
        old_text = key_text(old, key_fields, f"{where}: the before-image")  # type: ignore[arg-type]
        old_key = old_text if old_text != key else None
    image = new if new is not None else old
    change_key = gojson.valid_text(laredo_row_key(image, key_fields))
    old_change_key = None if old_key is None else gojson.valid_text(laredo_row_key(old, key_fields))
    return old_key, change_key, old_change_key, partial_image(old, key_fields), named


def encode_change(event: ChangeEvent, seq: int, key_fields: Sequence[str]) -> tuple[RowTuple, list[str]]:
    """The buffer row of one change, and the keys it touches (two for a primary-key change).

    Refuses what cannot mean anything, before anything is buffered: an INSERT/UPDATE without `new`
    or whose `new` lacks a key field (MalformedChange, MissingKeyField), a DELETE whose `old` does
    not name its key. An UPDATE's `old` may be partial (REPLICA IDENTITY DEFAULT sends the key
    columns only when they changed): it names the old key only when it carries every key field.
    """
    if isinstance(event, TextChange) and tuple(key_fields) == event.codec.key:
        return _encode_text_change(event, seq)
    action = event.action
    old, new = event.old, event.new
    where = f"{action.value} at {event.position or '(a position-less entry)'}"
    if action is Action.TRUNCATE:
        key = None
    elif action is Action.DELETE:
        if old is None:
            raise MalformedChange(f"{where} has no before-image naming its key {list(key_fields)}")
        key = key_text(old, key_fields, f"{where}: the before-image")
    else:
        if new is None:
            raise MalformedChange(f"{where} has no new row")
        key = key_text(new, key_fields, f"{where}: the new row")
    derived = derived_columns(action, key, old, new, key_fields, where)
    touched = [k for k in (key, derived[0]) if k is not None]
    commit_time = None if event.commit_time is None else gojson.time_text(event.commit_time)
    unchanged = gojson.dumps(list(event.unchanged)) if event.unchanged and action is Action.UPDATE else None
    row = (seq, event.position, action.value, key, _row_text(old, key), _row_text(new, key), commit_time, unchanged,
           *derived, *_NO_TEXT)
    return row, touched


@functools.lru_cache(maxsize=4)
def _commit_time_text(commit_time: _dt.datetime) -> str:
    """`gojson.time_text`, once per transaction (every change of one shares its commit time)."""
    return gojson.time_text(commit_time)


def _where(event: ChangeEvent, image: str = "") -> str:
    """Where a change is, for an error message (built only when one is raised)."""
    return f"{event.action} at {event.position or '(a position-less entry)'}{image}"


def _image_key(event: TextChange, texts: TextValues, image: str) -> str:
    """The `key` of one text image: `key_text` of its typed key columns, unless the text is exact."""
    codec = event.codec
    key_texts = codec.key_texts(texts)
    fast = codec.fast_key(key_texts)
    if fast is not None:
        return fast
    return key_text(codec.key_image(key_texts), codec.key, _where(event, image))


def _lacks_key(event: TextChange, absent: tuple[str, ...], image: str) -> None:
    """Refuse an image that lacks a key column (`key_text`'s MissingKeyField)."""
    if absent:
        missing = [name for name in event.codec.key if name in absent]
        if missing:
            raise MissingKeyField(missing[0], event.codec.key).at(_where(event, image))


def _encode_text_change(event: TextChange, seq: int) -> tuple[RowTuple, list[str]]:
    """`encode_change` of a change kept as text: the same refusals and keys, images left as text.

    The old key of an UPDATE is looked at only when the old image names one (every key column
    present) and its key text differs from the new image's: the same text gives the same key.
    """
    action = event.action
    codec, old, new = event.codec, event.old_text, event.new_text
    touched: list[str] = []
    key = None
    if action is _DELETE:
        if old is None:
            raise MalformedChange(f"{_where(event)} has no before-image naming its key {list(codec.key)}")
        _lacks_key(event, event.old_absent, _BEFORE)
        key = _image_key(event, old, _BEFORE)
    elif action is not _TRUNCATE:
        if new is None:
            raise MalformedChange(f"{_where(event)} has no new row")
        _lacks_key(event, event.unchanged, _NEW)
        key = _image_key(event, new, _NEW)
    if key is not None:
        touched.append(key)
    if (action is _UPDATE and old is not None and new is not None
            and not (event.old_absent and any(name in event.old_absent for name in codec.key))
            and codec.key_texts(old) != codec.key_texts(new)):
        old_key = _image_key(event, old, _BEFORE)
        if old_key != key:
            touched.append(old_key)
    commit_time = None if event.commit_time is None else _commit_time_text(event.commit_time)
    unchanged = gojson.dumps(list(event.unchanged)) if event.unchanged and action is _UPDATE else None
    old_absent = gojson.dumps(list(event.old_absent)) if event.old_absent else None
    # `action` is a StrEnum, i.e. already the column's text.
    row = (seq, event.position, action, key, None, None, commit_time, unchanged, None, None, None, None, None,
           codec.text, old, new, old_absent)
    return row, touched


_BEFORE, _NEW = ": the before-image", ": the new row"
_DELETE, _UPDATE, _TRUNCATE = Action.DELETE, Action.UPDATE, Action.TRUNCATE
_TEXT_ROW_COLUMNS = ("seq", "position", "action", "codec", "old_text", "new_text", "old_absent", "unchanged")
_CHANGE_TEXT_COLUMNS = ("action", "old_text", "new_text", "old_absent", "unchanged")


#: The column `with_images(..., records=True)` adds: each copied text row's protobuf snapshot
#: record (`protobuf.snapshot_record` of its `new`), null for every other row.
RECORD_COLUMN = pa.field("pb", pa.binary())
#: The typed parquet cells' struct column, wherever rows carry it: what `with_images(..., typed=...)`
#: adds (each copied row's cells, `typed_copies`), `typed_columns` writes and the bucket tasks read.
TYPED_COLUMN = "columns"


def with_images(batch: pa.RecordBatch, *, records: bool = False, typed: CellTyper | None = None) -> pa.RecordBatch:
    """`batch` (buffer rows, `SCHEMA`) with the images and derived columns of its text rows filled
    in: for each, exactly what ingest would have written for the typed row. A copied row's image
    is encoded column by column (`text_columns.encode_copies`); a change's row is what
    `encode_change` writes for the typed change, because it calls it. With `records`, the batch
    also has `RECORD_COLUMN`, built from the same columns: a copy's protobuf records are encoded
    where its JSON is, once, and never from a decoded row.

    This is where PostgreSQL's column text is typed and encoded (in the build's tasks, not on the
    ingest path); rows that are already encoded pass through untouched. With `typed`, the batch
    also has `TYPED_COLUMN`: the typed cells `typed` makes of a copied row's JSON values (null
    elsewhere, and where `typed` is not certain of them).
    """
    pb = pa.nulls(batch.num_rows, RECORD_COLUMN.type)
    cells = pa.nulls(batch.num_rows, typed.type) if typed is not None else None
    if "codec" in batch.schema.names and batch.column("codec").null_count < batch.num_rows:
        codecs = batch.column("codec")
        copied = pc.and_(pc.is_valid(codecs), pc.equal(batch.column("action"), SNAPSHOT_ACTION)).fill_null(False)
        if pc.any(copied).as_py():
            batch, pb, cells = _copied_images(batch, copied, records, typed)
        if not pc.all(pc.or_(copied, pc.is_null(codecs))).as_py():
            batch = _change_images(batch, copied)
    batch = batch.append_column(RECORD_COLUMN, pb) if records else batch
    return batch.append_column(pa.field(TYPED_COLUMN, cells.type), cells) if cells is not None else batch


def _copied_images(batch: pa.RecordBatch, copied: pa.Array, records: bool,
                   typed: CellTyper | None) -> tuple[pa.RecordBatch, pa.Array, pa.Array | None]:
    """`batch` with the `new` image of its copied text rows (`encode_text_snapshot_row`'s) filled,
    and (with `records`) those rows' protobuf records, (with `typed`) their typed cells, null elsewhere."""
    codecs, images, keys = (batch.column(name).filter(copied) for name in ("codec", "new_text", "key"))
    distinct = pc.unique(codecs).to_pylist()
    cells = None
    if len(distinct) == 1:  # the usual batch: one table shape
        texts, pbs, cells = encode_copies(RowCodec.from_text(distinct[0]), images, keys, records=records,
                                          typed=typed)
    else:
        text_out = np.empty(len(codecs), dtype=object)
        pb_out = np.full(len(codecs), None, dtype=object)
        for codec_text in distinct:
            mine = pc.equal(codecs, codec_text)
            at = np.flatnonzero(mine.to_numpy(zero_copy_only=False))
            encoded, pb, _ = encode_copies(RowCodec.from_text(codec_text), images.filter(mine),
                                           keys.filter(mine), records=records)
            text_out[at] = encoded.to_pylist()
            if pb is not None:
                pb_out[at] = pb.to_pylist()
        texts, pbs = pa.array(text_out, pa.string()), pa.array(pb_out, pa.binary())
    index = batch.schema.get_field_index("new")
    filled = pc.replace_with_mask(batch.column(index), copied, texts)
    records_column = pa.nulls(batch.num_rows, RECORD_COLUMN.type)
    if pbs is not None:
        records_column = pc.replace_with_mask(records_column, copied, pbs.cast(RECORD_COLUMN.type))
    cells_column = None
    if typed is not None:  # rows of several shapes (cells is None) are typed by the JVM
        cells_column = pa.nulls(batch.num_rows, typed.type) if cells is None else \
            spread(cells, copied)
    return batch.set_column(index, batch.schema.field(index), filled), records_column, cells_column


def _change_images(batch: pa.RecordBatch, copied: pa.Array) -> pa.RecordBatch:
    """`batch` with the images and derived columns of its text changes filled: column by column
    where `text_changes.encode_changes` can (one table shape at a time), the rest one by one."""
    codecs = batch.column("codec")
    todo = pc.and_(pc.is_valid(codecs), pc.invert(copied)).fill_null(False)
    done = np.zeros(batch.num_rows, dtype=bool)
    for codec_text in pc.unique(codecs.filter(todo)).to_pylist():
        mine = pc.and_(todo, pc.equal(codecs, codec_text)).fill_null(False)
        part = batch.filter(mine)
        encoded = encode_changes(RowCodec.from_text(codec_text), *(part.column(name) for name in _CHANGE_TEXT_COLUMNS))
        at = np.flatnonzero(mine.to_numpy(zero_copy_only=False))[encoded.done.to_numpy(zero_copy_only=False)]
        if not len(at):
            continue
        where = np.zeros(batch.num_rows, dtype=bool)
        where[at] = True
        done |= where
        for name in IMAGE_COLUMNS:
            index = batch.schema.get_field_index(name)
            field = batch.schema.field(index)
            batch = batch.set_column(index, field, pc.replace_with_mask(batch.column(index), pa.array(where),
                                                                        encoded.columns[name].cast(field.type)))
    rest = pc.and_(todo, pa.array(~done))
    return _changes_one_by_one(batch, rest) if pc.any(rest).as_py() else batch


def _changes_one_by_one(batch: pa.RecordBatch, rows: pa.Array) -> pa.RecordBatch:
    """`batch` with the images and derived columns of the text changes at `rows` filled: exactly the
    row `encode_change` writes for each typed change, because it calls it."""
    at = np.flatnonzero(rows.to_numpy(zero_copy_only=False))
    picked = batch.take(pa.array(at))
    columns = {name: picked.column(name).to_pylist() for name in _TEXT_ROW_COLUMNS}
    filled: dict[str, list[Any]] = {name: [] for name in IMAGE_COLUMNS}
    for i, codec_text in enumerate(columns["codec"]):
        absent = columns["old_absent"][i]
        unchanged = columns["unchanged"][i]
        text = TextChange(columns["position"][i], Action(columns["action"][i]), RowCodec.from_text(codec_text),
                          old_text=_texts(columns["old_text"][i]), new_text=_texts(columns["new_text"][i]),
                          old_absent=() if absent is None else tuple(json.loads(absent)),
                          unchanged=() if unchanged is None else tuple(json.loads(unchanged)))
        row, _ = encode_change(text.typed(), columns["seq"][i], text.codec.key)
        encoded = dict(zip(SCHEMA.names, row, strict=True))
        for name in IMAGE_COLUMNS:
            filled[name].append(encoded[name])
    for name, values in filled.items():
        index = batch.schema.get_field_index(name)
        field = batch.schema.field(index)
        batch = batch.set_column(index, field, pc.replace_with_mask(batch.column(index), rows,
                                                                    pa.array(values, field.type)))
    return batch


def _texts(values: list[str | None] | None) -> TextValues | None:
    return None if values is None else tuple(values)


def encode_snapshot_row(row: Row, seq: int, key_fields: Sequence[str], position: str, where: str) -> RowTuple:
    """A re-sync row; `position` is a placeholder until the re-sync's end position is known."""
    key = key_text(row, key_fields, where)
    return (seq, position, SNAPSHOT_ACTION, key, None, _row_text(row, key), None, None, None, None, None, None, None,
            *_NO_TEXT)


def encode_text_snapshot_row(event: TextSnapshotRow, seq: int, position: str, where: Callable[[], str]) -> RowTuple:
    """`encode_snapshot_row` of a row kept as column text: the same key and refusals, the image left
    as text for `with_images` (`where` names the row, only in an error)."""
    codec, texts = event.codec, event.texts
    if codec.is_key_only(texts):
        raise MalformedChange(f"{where()} has {len(texts)} columns, the table {len(codec.names)}")
    key_texts = codec.key_texts(texts)
    key = codec.fast_key(key_texts)
    if key is None:
        key = key_text(codec.key_image(key_texts), codec.key, where())
    return (seq, position, SNAPSHOT_ACTION, key, None, None, None, None, None, None, None, None, None,
            codec.text, None, texts, None)


def encode_text_snapshot_batch(codec: RowCodec, texts: pa.RecordBatch, first_seq: int) -> pa.RecordBatch | None:
    """`encode_text_snapshot_row` of every row of a batch of whole images (`events.SnapshotBatch`),
    as one record batch (`SCHEMA`, position left empty) built with Arrow kernels; None when a row
    needs the per-row path (a key that is not all integers, or is NULL: its refusal names the row)."""
    keys = codec.fast_keys(texts)
    if keys is None:
        return None
    rows, width = texts.num_rows, texts.num_columns  # width >= 1: the key columns are among them
    # The images as list<string>, row by row: the columns' values interleaved.
    values = pa.concat_arrays([column.cast(pa.string()) for column in texts.columns])
    order = (np.arange(rows, dtype=np.int64)[:, None] + np.arange(width, dtype=np.int64)[None, :] * rows).ravel()
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    images = pa.ListArray.from_arrays(offsets, values.take(pa.array(order)))
    constant = {"position": "", "action": SNAPSHOT_ACTION, "codec": codec.text}
    arrays = []
    for field in SCHEMA:
        if field.name == "seq":
            arrays.append(pa.array(np.arange(first_seq, first_seq + rows, dtype=np.int64)))
        elif field.name == "key":
            arrays.append(keys.cast(pa.string()))
        elif field.name == "new_text":
            arrays.append(images.cast(field.type))
        elif field.name in constant:
            arrays.append(pa.repeat(pa.scalar(constant[field.name], field.type), rows))
        else:
            arrays.append(pa.nulls(rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def record_batch(rows: Sequence[RowTuple]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(SCHEMA)
    arrays = [pa.array(col, type=field.type) for col, field in zip(columns, SCHEMA, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


# --- schema <-> JSON ---------------------------------------------------------------------------


def schema_to_json(schema: TableSchema) -> dict[str, Any]:
    return {"table": schema.table, "columns": [asdict(c) for c in schema.columns]}


def schema_from_json(data: dict[str, Any]) -> TableSchema:
    return TableSchema(table=data["table"], columns=tuple(Column(**c) for c in data["columns"]))


# --- the self-description ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResyncInfo:
    """What a snapshot segment records about its re-sync."""

    reason: str
    begin_position: str | None  # the durable position when it began (None: empty buffer)
    rows: int


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """One segment's index entry; also stored inside the segment itself.

    Rows cover `(from_position, to_position]` (None: from the very beginning) and seqs
    `first_seq..last_seq` (`last_seq = first_seq - 1` for an empty snapshot). `first_arrival` is the
    wall-clock time (epoch seconds) its first row reached the buffer, which makes "oldest change
    age" independent of the source's clock. `bytes` comes from the storage, not from the file.
    """

    number: int
    kind: SegmentKind
    from_position: str | None
    to_position: str
    first_position: str | None
    first_seq: int
    last_seq: int
    changes: int
    hll: str
    first_arrival: float | None
    sealed_at: float
    resync: ResyncInfo | None = None
    bytes: int = 0

    @property
    def name(self) -> str:
        return segment_name(self.number, self.kind)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SegmentMeta:
        resync = data.get("resync")
        return cls(**{**data, "resync": None if resync is None else ResyncInfo(**resync)})


def segment_name(number: int, kind: SegmentKind) -> str:
    """Names sort in seal order; the number is never reused (publish is no-clobber anyway)."""
    return f"{SEGMENT_FOLDER}/{number:012d}-{kind}.parquet"


def read_meta(storage: BufferStorage, name: str) -> tuple[SegmentMeta, str, TableSchema | None]:
    """A sealed segment's own entry, table name and schema, from its Parquet footer."""
    with storage.open_read(name) as f:
        kv = pq.read_metadata(f).metadata or {}
    if _META_SEGMENT not in kv:
        raise ValueError(f"{name} is not a change-buffer segment (no {_META_SEGMENT.decode()} metadata)")
    meta = SegmentMeta.from_json(json.loads(kv[_META_SEGMENT]))
    schema = schema_from_json(json.loads(kv[_META_SCHEMA])) if _META_SCHEMA in kv else None
    return replace(meta, bytes=storage.size(name)), kv[_META_TABLE].decode(), schema


# --- writing -----------------------------------------------------------------------------------


class SegmentWriter:
    """Streams row groups into a temporary object, then seals it as one segment (or discards it).

    Nothing is visible under a segment name until `seal`, which writes the footer (with the
    self-description), fsyncs and publishes atomically: a crash at any earlier instant leaves only
    a temporary, which recovery deletes.
    """

    def __init__(self, storage: BufferStorage, kind: SegmentKind) -> None:
        self._storage = storage
        self._temp = storage.create_temp(segment_name(0, kind))
        dictionary = SNAPSHOT_DICTIONARY_COLUMNS if kind == "snapshot" else True
        self._writer = pq.ParquetWriter(self._temp, SCHEMA, compression=COMPRESSION, use_dictionary=dictionary)
        self.rows = 0

    def write(self, rows: Sequence[RowTuple]) -> None:
        """Write `rows` as one row group."""
        if rows:
            self.write_batch(record_batch(rows))

    def write_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        if isinstance(batch, pa.Table):
            self._writer.write_table(batch)
        else:
            self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def seal(self, meta: SegmentMeta, table: str, schema: TableSchema | None) -> SegmentMeta:
        """Footer + fsync + atomic no-clobber publish under `meta.name`; returns meta with its size."""
        kv = {_META_SEGMENT: json.dumps(meta.to_json()).encode(), _META_TABLE: table.encode()}
        if schema is not None:
            kv[_META_SCHEMA] = json.dumps(schema_to_json(schema)).encode()
        self._writer.add_key_value_metadata(kv)
        self._writer.close()
        size = self._storage.publish(self._temp, meta.name)
        return replace(meta, bytes=size)

    def discard(self) -> None:
        try:
            self._writer.close()
        finally:
            self._storage.discard(self._temp)


class SnapshotStaging:
    """Re-sync rows as they arrive, before their position (the re-sync's end) is known.

    Rows stream into an anonymous local temp file (unlinked: even SIGKILL leaves nothing behind)
    as Arrow IPC record batches (lz4), counted into the row groups the segment will have, so memory
    holds one batch whatever the table size. At the end, `copy_to` streams them into the real segment with the position
    filled in: one extra sequential pass, paid only on an initial load or a re-sync.

    Why Arrow IPC and not parquet: the staged rows are read back once, in order, on this host; a
    parquet writer would compress them with the segment's codec twice (1,000,000 rows of the
    benchmark's table: 1.4 s to stage and 0.35 s to read back, against about 0.3 s in all as IPC).
    """

    def __init__(self, row_group_rows: int) -> None:
        self._file: BinaryIO = tempfile.TemporaryFile()  # noqa: SIM115 - closed by copy_to/discard
        self._writer = ipc.new_file(self._file, SCHEMA, options=ipc.IpcWriteOptions(compression="lz4"))
        self._row_group_rows = row_group_rows
        self._groups: list[int] = []  # staged batches per row group, in order (the last one open)
        self._open_rows = 0  # rows of the open (last) row group

    def write(self, rows: Sequence[RowTuple]) -> None:
        if rows:
            self.write_batch(record_batch(rows))

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Rows already encoded as a record batch (`encode_text_snapshot_batch`); batches make a
        row group until it holds `row_group_rows` (small row groups cost the writer and every reader)."""
        if batch.num_rows:
            self._writer.write_batch(batch)
            if not self._open_rows:
                self._groups.append(0)
            self._groups[-1] += 1
            self._open_rows += batch.num_rows
            if self._open_rows >= self._row_group_rows:
                self._open_rows = 0

    def copy_to(self, target: SegmentWriter, position: str) -> None:
        """Every staged row group into `target`, its `position` column filled in."""
        self._writer.close()
        self._file.seek(0)
        staged = ipc.open_file(self._file)
        first = 0
        for count in self._groups:
            group = pa.Table.from_batches([staged.get_batch(i) for i in range(first, first + count)], SCHEMA)
            first += count
            stamped = pa.repeat(pa.scalar(position, pa.string()), group.num_rows)
            target.write_batch(group.set_column(_POSITION_COLUMN, SCHEMA.field("position"), stamped))
        self._file.close()

    def discard(self) -> None:
        try:
            self._writer.close()
        finally:
            self._file.close()


# --- reading -----------------------------------------------------------------------------------


def resolved_positions(positions: Iterable[str], last: str) -> list[str]:
    """Each row's boundary position: an empty position belongs to the next row that has one.

    A source entry without a position (laredo may send some) belongs to the next boundary, which
    falls on the next entry that carries one; past the last such entry, the segment's end.
    """
    out = list(positions)
    following = last
    for i in range(len(out) - 1, -1, -1):
        if out[i]:
            following = out[i]
        else:
            out[i] = following
    return out


def seq_through(storage: BufferStorage, meta: SegmentMeta, position: str, cmp: Comparator) -> int:
    """The last seq of `meta` whose row is at or before `position` (first_seq - 1 if none).

    Only needed when a requested boundary falls strictly inside a segment; it reads two columns.
    """
    with storage.open_read(meta.name) as f:
        table = pq.read_table(f, columns=["seq", "position"])
    seqs = table.column("seq").to_pylist()
    positions = resolved_positions(table.column("position").to_pylist(), meta.to_position)
    through = meta.first_seq - 1
    for seq, pos in zip(seqs, positions, strict=True):
        if cmp(pos, position) > 0:
            break
        through = seq
    return through
