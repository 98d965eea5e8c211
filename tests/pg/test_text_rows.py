"""PostgreSQL changes and copied rows kept as column text: the rows the build reads are those of
the typed ones.

The oracle is the typed path itself: for every change a real stream delivers (every common type,
REPLICA IDENTITY DEFAULT and FULL, unchanged TOASTed values, key changes, composite text keys,
deletes, truncates), the buffer row written from its text and completed by `with_images` (what the
diff job reads) must equal, column for column, the row `encode_change` writes for the same change
with typed images, and both must touch the same keys. The same holds for every row of a real
initial copy against `encode_snapshot_row` of the typed row.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from resources.buffer import BufferReader, ChangeBuffer
from resources.buffer.errors import BadChange
from resources.buffer.segments import (
    SCHEMA,
    encode_change,
    encode_snapshot_row,
    encode_text_snapshot_row,
    record_batch,
    with_images,
)
from resources.subscribers.events import (
    ChangeEvent,
    Column,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotBatch,
    SnapshotRow,
    TableSchema,
)
from resources.subscribers.text_rows import RowCodec, TextChange, TextSnapshotRow
from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.errors import ArchiveError, EncodeError
from snapshot_assets.archive.formats.protobuf import snapshot_record
from tests.buffer.helpers import read_refs
from tests.pg import test_postgres_source as pgsrc
from tests.pg.test_postgres_source import _TYPES_DDL, _TYPES_VALUES, Db, Stream

db = pgsrc.db
source = pgsrc.source

_TEXT_COLUMNS = ("codec", "old_text", "new_text", "old_absent")


def _as_read(changes: list[ChangeEvent], key_fields: tuple[str, ...]) -> None:
    assert changes and all(isinstance(c, TextChange) for c in changes)
    for seq, change in enumerate(changes, start=1):
        text_row, text_keys = encode_change(change, seq, key_fields)
        assert text_row[SCHEMA.get_field_index("codec")] is not None, "kept as text"
        typed = change.typed() if isinstance(change, TextChange) else change
        typed_row, typed_keys = encode_change(typed, seq, key_fields)
        (read,) = with_images(record_batch([text_row])).to_pylist()
        (expected,) = record_batch([typed_row]).to_pylist()
        assert {k: v for k, v in read.items() if k not in _TEXT_COLUMNS} == \
            {k: v for k, v in expected.items() if k not in _TEXT_COLUMNS}, change
        assert text_keys == typed_keys


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_every_type_reads_back_as_the_typed_change(source: Any, db: Db, identity: str) -> None:
    sub, names = source()
    t = names.table
    db.run(_TYPES_DDL.format(t=t))
    db.run(f"ALTER TABLE {t} REPLICA IDENTITY {identity}")
    stream = Stream(sub.events(None))
    schema, _, _, _ = stream.initial()
    db.tx(f"INSERT INTO {t} VALUES {_TYPES_VALUES}".replace("%s", "1"),
          f"INSERT INTO {t} VALUES {_TYPES_VALUES}".replace("%s", "2"))
    db.tx(f"UPDATE {t} SET t = '<b>&amp;\u2028', f8 = 1e-7, f4 = 3e21, jb = '{{\"a\": 1.0, \"b\": 2.50}}' "
          "WHERE id = 1")
    db.tx(f"UPDATE {t} SET id = 3 WHERE id = 2", f"DELETE FROM {t} WHERE id = 1", f"TRUNCATE {t}")
    changes = [c for tx in stream.transactions(3) for c in tx.changes]
    assert [c.action.value for c in changes] == ["INSERT", "INSERT", "UPDATE", "UPDATE", "DELETE", "TRUNCATE"]
    _as_read(changes, schema.key_fields)


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_toast_and_composite_text_keys_read_back_as_the_typed_change(source: Any, db: Db, identity: str) -> None:
    sub, names = source()
    t = names.table
    db.run(f"CREATE TABLE {t} (a int, b text, big text, n int, PRIMARY KEY (b, a))")
    db.run(f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL, REPLICA IDENTITY {identity}")
    db.run(f"INSERT INTO {t} VALUES (1, 'x<', repeat('z', 30000), 0), (2, 'x', NULL, 0)")
    stream = Stream(sub.events(None))
    schema, _, _, _ = stream.initial()
    db.tx(f"UPDATE {t} SET n = 1 WHERE a = 1")  # big unchanged: not resent
    db.tx(f"UPDATE {t} SET b = 'y' WHERE a = 1", f"UPDATE {t} SET a = 5 WHERE a = 2")  # key changes
    db.tx(f"DELETE FROM {t} WHERE a = 5")
    changes = [c for tx in stream.transactions(3) for c in tx.changes]
    assert any(c.unchanged for c in changes) == (identity == "DEFAULT")
    _as_read(changes, schema.key_fields)


def _copied_as_read(events: list[Any], key_fields: tuple[str, ...]) -> None:
    assert all(isinstance(e, TextSnapshotRow) for e in events if isinstance(e, SnapshotRow))
    rows = [e for e in events if isinstance(e, TextSnapshotRow)]
    assert rows
    text_rows = [encode_text_snapshot_row(r, seq, "", lambda: "a copied row") for seq, r in enumerate(rows, 1)]
    typed_rows = [encode_snapshot_row(r.row, seq, key_fields, "", "a copied row") for seq, r in enumerate(rows, 1)]
    read = with_images(record_batch(text_rows)).to_pylist()
    expected = record_batch(typed_rows).to_pylist()
    assert [{k: v for k, v in r.items() if k not in _TEXT_COLUMNS} for r in read] == \
        [{k: v for k, v in r.items() if k not in _TEXT_COLUMNS} for r in expected]
    # the protobuf record made beside the image is the state's per-row record of that image
    records = with_images(record_batch(text_rows), records=True).column("pb").to_pylist()
    assert records == [snapshot_record(gojson.loads(r["new"]), key_fields) for r in expected]


def test_every_type_of_the_initial_copy_reads_back_as_the_typed_row(source: Any, db: Db) -> None:
    sub, names = source()
    t = names.table
    db.run(_TYPES_DDL.format(t=t))
    for i in (1, 2):
        db.run(f"INSERT INTO {t} VALUES {_TYPES_VALUES}", i)
    db.run(f"INSERT INTO {t} (id, t, f8, f4, jb) VALUES (3, '<b>&amp;\u2028\n\"', 1e-7, 3e21, "
           "'{\"b\": 2.50, \"a\": [1.0, null]}')")
    stream = Stream(sub.events(None))
    events = stream._until(lambda e: isinstance(e, ResyncEnd), 20)
    schema = next(e.schema for e in events if isinstance(e, SchemaEvent))
    _copied_as_read(events, schema.key_fields)


def test_a_copied_row_without_a_usable_key_is_refused_like_a_typed_one() -> None:
    codec = RowCodec(("a", "b", "v"), ("int", "text", "text"), ("b", "a"))
    for texts in [("1", None, "x"), (None, "k", "x"), ("1",)]:
        with pytest.raises(ArchiveError) as text_error:
            encode_text_snapshot_row(TextSnapshotRow(codec, texts), 1, "", lambda: "re-sync row 1")
        if len(texts) == len(codec.names):
            with pytest.raises(ArchiveError) as typed_error:
                encode_snapshot_row(codec.image(texts), 1, codec.key, "", "re-sync row 1")
            assert (type(text_error.value), str(text_error.value)) == \
                (type(typed_error.value), str(typed_error.value))
        else:
            assert "has 1 columns, the table 3" in str(text_error.value)


def test_a_codec_survives_its_text_and_refuses_an_unknown_converter() -> None:
    codec = RowCodec(("id", "v", "tags"), ("int", "json", "array:float"), ("id",))
    assert RowCodec.from_text(codec.text) == codec
    assert codec.image(("1", '{"a": [1]}', "{1.5,NULL}")) == {"id": 1, "v": {"a": [1]}, "tags": [1.5, None]}
    assert codec.image(("7",)) == {"id": 7}  # a key-only before-image
    with pytest.raises(ValueError, match="unknown PostgreSQL value converter 'money'"):
        RowCodec(("id",), ("money",), ("id",))


def test_a_value_no_format_holds_is_kept_at_ingest_and_refused_by_the_build_by_column_and_key() -> None:
    codec = RowCodec(("id", "j"), ("int", "json"), ("id",))
    change = TextChange("0/10", Action.INSERT, codec, new_text=("7", '{"x": 1e400}'))
    row, touched = encode_change(change, 1, ("id",))  # ingest keeps it: nothing is lost
    assert touched == ["[7]"]
    with pytest.raises(EncodeError) as refused:
        with_images(record_batch([row]))
    assert refused.value.column == "j" and refused.value.row_key == "[7]"


def test_a_text_change_without_a_usable_key_is_refused_like_a_typed_one() -> None:
    codec = RowCodec(("id", "v"), ("int", "text"), ("id",))
    refused = [TextChange("0/20", Action.INSERT, codec, new_text=(None, "a")),
               TextChange("0/20", Action.UPDATE, codec, new_text=("1", "a"), unchanged=("id",)),
               TextChange("0/20", Action.DELETE, codec)]
    for change in refused:
        with pytest.raises(ArchiveError) as text_error:
            encode_change(change, 1, ("id",))
        with pytest.raises(ArchiveError) as typed_error:
            encode_change(change.typed(), 1, ("id",))
        assert (type(text_error.value), str(text_error.value)) == (type(typed_error.value), str(typed_error.value))


def test_a_key_of_every_column_in_another_order_than_the_tables_is_read_as_the_key() -> None:
    codec = RowCodec(("a", "b"), ("int", "text"), ("b", "a"))  # PRIMARY KEY (b, a) on (a int, b text)
    change = TextChange("0/30", Action.INSERT, codec, new_text=("1", "x"))
    _as_read([change], codec.key)
    copied = encode_text_snapshot_row(TextSnapshotRow(codec, ("1", "x")), 1, "", lambda: "re-sync row 1")
    assert copied[3] == encode_snapshot_row({"a": 1, "b": "x"}, 1, codec.key, "", "re-sync row 1")[3] == '["x",1]'


# --- the copy in batches (`SnapshotBatch`: what the ingest's buffer asks the source for) ---------------


def _copy_events(source: Any, t: str, **options: Any) -> list[Any]:
    sub, _ = source(table=t, slot=f"{t}_s{len(options)}", publication=f"{t}_p{len(options)}", **options)
    stream = Stream(sub.events(None))
    return stream._until(lambda e: isinstance(e, ResyncEnd), 20)


def test_the_copy_in_batches_gives_the_rows_of_the_copy_row_by_row(source: Any, db: Db) -> None:
    """Every type, NULL against '', quotes, commas, newlines, a value larger than the parser's block
    (read again with larger blocks), keys beyond 2^53: the batches' texts are the row path's, in order."""
    _, names = source()
    t = names.table
    db.run(_TYPES_DDL.format(t=t))
    for i in (1, 2):
        db.run(f"INSERT INTO {t} VALUES {_TYPES_VALUES}", i)
    db.run(f"INSERT INTO {t} (id, t, vc, ta, nul) VALUES (3, '', '', '{{}}', 'a,b\n\"c\"\r\nd')")
    db.run(f"INSERT INTO {t} (id, t, i8) SELECT g, repeat('x', 3000) || g, 9007199254740993 + g "
           "FROM generate_series(4, 300) g")
    rows = _copy_events(source, t)
    batched = _copy_events(source, t, batched_copy=True, copy_block_bytes=1024)
    batches = [e for e in batched if isinstance(e, SnapshotBatch)]
    assert len(batches) > 1 and not any(isinstance(e, SnapshotRow) for e in batched)
    expected = [(e.codec, e.texts) for e in rows if isinstance(e, TextSnapshotRow)]
    assert [(r.codec, r.texts) for b in batches for r in b.rows()] == expected and len(expected) == 300
    assert [e.row_count for e in batched if isinstance(e, ResyncEnd)] == [300]
    assert next(texts for _, texts in expected if texts[0] == "3")[batches[0].codec.names.index("t")] == ""


@pytest.mark.parametrize("codec", [
    RowCodec(("id", "v"), ("int", "text"), ("id",)),
    RowCodec(("tenant", "id", "v"), ("int", "int", "json"), ("tenant", "id")),  # composite, the fast path
    RowCodec(("a", "b", "v"), ("int", "text", "text"), ("b", "a")),  # a text key: row by row
])
def test_a_batch_of_copied_rows_is_buffered_as_its_rows(codec: RowCodec, tmp_path: Any) -> None:
    def value(i: int, name: str, spec: str) -> str | None:
        if name in codec.key:
            return str(2**62 + i) if spec == "int" else f"k{i}"
        if i % 3 == 0:
            return None
        return f'{{"n": {i}}}' if spec == "json" else f'v{i}\n",'

    texts = [tuple(value(i, n, spec) for n, spec in zip(codec.names, codec.specs, strict=True)) for i in range(50)]
    columns = list(zip(*texts, strict=True))
    batch = pa.RecordBatch.from_arrays([pa.array(c, pa.string()) for c in columns],
                                       names=[f"c{i}" for i in range(len(columns))])
    segments = []
    one_by_one = [TextSnapshotRow(codec, t) for t in texts]
    for name, events in (("rows", one_by_one), ("batch", [SnapshotBatch(codec, batch)])):
        buffer = ChangeBuffer(tmp_path / name, "public.t", seal_interval=3600)
        buffer.append(SchemaEvent(TableSchema("public.t", tuple(
            Column(n, "text", primary_key=n in codec.key, primary_key_ordinal=codec.key.index(n) + 1 if n in codec.key
                   else 0, ordinal=i + 1) for i, n in enumerate(codec.names)))))
        buffer.append(ResyncBegin("initial"))
        for event in events:
            buffer.append(event)
        buffer.append(ResyncEnd("0/10", len(texts)))
        buffer.close()
        segments.append(read_refs(BufferReader(tmp_path / name, "public.t").all_segments()))
    assert segments[0] == segments[1] and len(segments[0]) == len(texts)


def test_a_batch_whose_key_is_null_is_refused_like_its_row(tmp_path: Any) -> None:
    codec = RowCodec(("id", "v"), ("int", "text"), ("id",))
    batch = pa.RecordBatch.from_arrays([pa.array(["1", None]), pa.array(["a", "b"])], names=["c0", "c1"])
    errors = []
    for name, event in (("rows", TextSnapshotRow(codec, (None, "b"))), ("batch", SnapshotBatch(codec, batch))):
        buffer = ChangeBuffer(tmp_path / name, "public.t", seal_interval=3600)
        buffer.append(SchemaEvent(TableSchema("public.t", (Column("id", "int8", primary_key=True,
                                                                  primary_key_ordinal=1, ordinal=1),
                                                           Column("v", "text", ordinal=2)))))
        buffer.append(ResyncBegin("initial"))
        if name == "rows":
            buffer.append(TextSnapshotRow(codec, ("1", "a")))
        with pytest.raises(BadChange) as refused:
            buffer.append(event)
        errors.append(str(refused.value))
    assert errors[0] == errors[1] and "re-sync row 2" in errors[0]
