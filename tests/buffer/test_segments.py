"""Segments are valid Parquet with the documented schema; sealing only ever cuts at transaction ends."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.buffer import SCHEMA, BadChange, BadEventOrder, BufferReader, ChangeBuffer, PositionWentBackwards
from resources.subscribers.events import ChangeEvent, Event, ResyncBegin, ResyncEnd, SchemaEvent, SnapshotRow, TxEnd
from snapshot_assets.archive.changes import Action
from tests.buffer.helpers import SIMPLE_SCHEMA, buffer_rows, initial_load, insert, lsn, read_refs, tx

T = "public.t"
BIG = 2**53 + 1
NO_TEXT = {"codec": None, "old_text": None, "new_text": None, "old_absent": None}  # typed changes: images encoded


def open_buffer(root: Path, **kw: object) -> ChangeBuffer:
    kw.setdefault("seal_interval", 3600.0)
    return ChangeBuffer(root, T, **kw)  # type: ignore[arg-type]


def test_segments_are_parquet_with_the_documented_schema(tmp_path: Path) -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 120000, tzinfo=dt.UTC)
    with open_buffer(tmp_path) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 1, "v": "a"}, {"id": BIG, "v": "<b>"}]):
            buf.append(event)
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, old={"id": 1, "v": "a"}, new={"id": 1, "v": "é"},
                               commit_time=when))
        buf.append(ChangeEvent(lsn(200), Action.DELETE, old={"id": BIG, "v": "<b>"}))
        buf.append(ChangeEvent(lsn(200), Action.TRUNCATE))
        buf.append(TxEnd(lsn(200)))
        buf.seal()
        refs = buf.all_segments()
    assert [r.kind for r in refs] == ["snapshot", "changes"]
    for ref in refs:
        table = pq.read_table(ref.path)
        assert table.schema.equals(SCHEMA, check_metadata=False)
        assert pq.read_metadata(ref.path).num_rows == ref.changes
    snapshot = pq.read_table(refs[0].path).to_pylist()
    assert [(r["seq"], r["position"], r["action"], r["key"]) for r in snapshot] == [
        (1, lsn(100), "SNAPSHOT", "[1]"), (2, lsn(100), "SNAPSHOT", f"[{BIG}]")]
    assert snapshot[1]["new"] == f'{{"id":{BIG},"v":"\\u003cb\\u003e"}}'  # Go's encoding, exact integer
    changes = pq.read_table(refs[1].path).to_pylist()
    assert changes == [
        {"seq": 3, "position": lsn(200), "action": "UPDATE", "key": "[1]", "old": '{"id":1,"v":"a"}',
         "new": '{"id":1,"v":"é"}', "commit_time": "2024-05-06T07:08:09.12Z", "unchanged": None,
         "old_key": None, "change_key": "1", "old_change_key": None, "old_partial": False, "old_carries_key": True,
         **NO_TEXT},
        {"seq": 4, "position": lsn(200), "action": "DELETE", "key": f"[{BIG}]",
         "old": f'{{"id":{BIG},"v":"\\u003cb\\u003e"}}', "new": None, "commit_time": None, "unchanged": None,
         "old_key": None, "change_key": "9.007199254740992e+15", "old_change_key": None, "old_partial": False,
         "old_carries_key": True, **NO_TEXT},
        {"seq": 5, "position": lsn(200), "action": "TRUNCATE", "key": None, "old": None, "new": None,
         "commit_time": None, "unchanged": None, "old_key": None, "change_key": None, "old_change_key": None,
         "old_partial": None, "old_carries_key": None, **NO_TEXT},
    ]


def test_an_update_that_omits_unchanged_values_names_them(tmp_path: Path) -> None:
    """REPLICA IDENTITY DEFAULT: `new` lacks the unchanged TOASTed columns; the row names them."""
    with open_buffer(tmp_path) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 1, "v": "a"}]):
            buf.append(event)
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, new={"id": 1}, unchanged=("v",)))
        buf.append(TxEnd(lsn(200)))
        buf.seal()
        refs = buf.all_segments()
    (row,) = pq.read_table(refs[1].path).to_pylist()
    assert (row["old"], row["new"], row["unchanged"]) == (None, '{"id":1}', '["v"]')


def test_segment_metadata_describes_the_segment(tmp_path: Path) -> None:
    with open_buffer(tmp_path) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), *tx(lsn(150), 1, 2)]:
            buf.append(event)
        buf.seal()
        ref = buf.all_segments()[-1]
    kv = pq.read_metadata(ref.path).metadata
    meta = json.loads(kv[b"snapshotter.buffer.segment"])
    assert (meta["kind"], meta["from_position"], meta["to_position"]) == ("changes", lsn(100), lsn(150))
    assert (meta["first_seq"], meta["last_seq"], meta["changes"]) == (1, 2, 2)
    assert kv[b"snapshotter.buffer.table"] == T.encode()
    assert json.loads(kv[b"snapshotter.buffer.schema"])["columns"][0]["name"] == "id"


def test_seal_only_at_transaction_end(tmp_path: Path) -> None:
    with open_buffer(tmp_path) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), *tx(lsn(200), 1)]:
            buf.append(event)
        buf.append(insert(lsn(300), 2))
        assert buf.seal() is True  # seals the complete transaction only
        assert buf.durable_position() == lsn(200)
        assert buf.seal() is False  # the open transaction cannot be cut
        buf.append(insert(lsn(300), 3))
        buf.append(TxEnd(lsn(300)))
        assert buf.seal() is True
        assert buf.durable_position() == lsn(300)
        segs = [r for r in buf.all_segments() if r.kind == "changes"]
    assert [(s.to_position, s.first_seq, s.last_seq) for s in segs] == [(lsn(200), 1, 1), (lsn(300), 2, 3)]


def test_seal_changes_and_interval_trigger_at_transaction_ends(tmp_path: Path) -> None:
    with open_buffer(tmp_path, seal_changes=3) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100)):
            buf.append(event)
        events: list[Event] = [*(insert(lsn(200), i) for i in range(1, 5)), TxEnd(lsn(200))]
        sealed = [buf.append(e) for e in events]
        assert sealed == [False, False, False, False, True]  # 4 >= 3, but only at the TxEnd
    with ChangeBuffer(tmp_path / "b", T, seal_interval=0.0) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100)):
            buf.append(event)
        assert buf.append(insert(lsn(200), 1)) is False
        assert buf.append(TxEnd(lsn(200))) is True


def test_transaction_larger_than_a_row_group_spills_and_stays_whole(tmp_path: Path) -> None:
    with open_buffer(tmp_path, row_group_rows=4) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), *tx(lsn(200), 1, 2)]:
            buf.append(event)
        for i in range(10, 20):  # 10 changes: the committed tx is sealed, then the big one spills
            buf.append(insert(lsn(300), i))
        assert buf.durable_position() == lsn(200)
        assert buf.seal() is False  # a spilling transaction cannot be cut
        assert buf.append(TxEnd(lsn(300))) is True  # ... so it seals at its end, as requested
        segs = [r for r in buf.all_segments() if r.kind == "changes"]
    assert [(s.to_position, s.changes) for s in segs] == [(lsn(200), 2), (lsn(300), 10)]
    assert pq.ParquetFile(segs[1].path).num_row_groups >= 3


def test_giant_transaction_cut_by_a_crash_leaves_nothing(tmp_path: Path) -> None:
    buf = open_buffer(tmp_path, row_group_rows=4)
    for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), *tx(lsn(200), 1)]:
        buf.append(event)
    for i in range(10, 20):
        buf.append(insert(lsn(300), i))
    buf.close()  # shutdown mid-transaction: the partial one is dropped
    assert BufferReader(tmp_path, T).durable_position() == lsn(200)
    assert [r["key"] for r in buffer_rows(tmp_path, T)] == ["[1]"]
    assert not [p for p in (tmp_path / T).rglob("*") if p.name.startswith(".tmp-")]


def test_change_free_transactions_advance_the_durable_position(tmp_path: Path) -> None:
    with open_buffer(tmp_path) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), TxEnd(lsn(150)), TxEnd(lsn(160))]:
            buf.append(event)
        assert buf.seal() is True
        assert buf.durable_position() == lsn(160)
        assert len(buf.all_segments()) == 1  # no empty segment
        for event in tx(lsn(170), 1):
            buf.append(event)
        buf.seal()
        assert buf.all_segments()[-1].from_position == lsn(160)
    assert BufferReader(tmp_path, T).durable_position() == lsn(170)


@pytest.mark.parametrize("bad", [
    insert(lsn(150), 9),                                   # before the last TxEnd
    insert(lsn(200), 9),                                   # equal to the last TxEnd
    TxEnd(lsn(200)),
    TxEnd(lsn(190)),
    ResyncEnd(lsn(190), 0),
])
def test_position_going_backwards_is_refused_and_nothing_written(tmp_path: Path, bad: object) -> None:
    with open_buffer(tmp_path) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), *tx(lsn(200), 1)]:
            buf.append(event)
        buf.seal()
        if isinstance(bad, ResyncEnd):
            buf.append(ResyncBegin("again"))
        before = sorted(p.name for p in (tmp_path / T).rglob("*"))
        with pytest.raises(PositionWentBackwards, match=r"table public\.t: .*nothing was written"):
            buf.append(bad)  # type: ignore[arg-type]
        assert sorted(p.name for p in (tmp_path / T).rglob("*")) == before
        assert buf.durable_position() == lsn(200)
        if isinstance(bad, ResyncEnd):
            buf.rollback()
        for event in tx(lsn(300), 2):  # the buffer is still usable
            buf.append(event)
        buf.seal()
    assert [r["key"] for r in buffer_rows(tmp_path, T)] == ["[1]", "[2]"]


def test_change_before_an_earlier_change_of_its_transaction_is_refused(tmp_path: Path) -> None:
    with open_buffer(tmp_path) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), insert(lsn(300), 1)]:
            buf.append(event)
        with pytest.raises(PositionWentBackwards):
            buf.append(insert(lsn(250), 2))
        with pytest.raises(PositionWentBackwards):
            buf.append(TxEnd(lsn(250)))


@pytest.mark.parametrize(("events", "error", "message"), [
    ([insert(lsn(200), 1)], BadEventOrder, "before any SchemaEvent"),
    ([SchemaEvent(SIMPLE_SCHEMA), SnapshotRow({"id": 1})], BadEventOrder, "outside a re-sync"),
    ([SchemaEvent(SIMPLE_SCHEMA), ResyncBegin("x"), insert(lsn(200), 1)], BadEventOrder, "during a re-sync"),
    ([SchemaEvent(SIMPLE_SCHEMA), ResyncBegin("x"), ResyncEnd(lsn(100), 3)], BadEventOrder, "announced 3 rows"),
    ([SchemaEvent(SIMPLE_SCHEMA), TxEnd("")], BadEventOrder, "must carry a position"),
    ([SchemaEvent(SIMPLE_SCHEMA), TxEnd("nonsense")], BadEventOrder, "not a valid lsn position"),
    ([SchemaEvent(SIMPLE_SCHEMA), ChangeEvent(lsn(200), Action.DELETE, old={"v": 1})], BadChange,
     "DELETE at 0/000000C8: the before-image lacks key field 'id'"),
    ([SchemaEvent(SIMPLE_SCHEMA), ChangeEvent(lsn(200), Action.DELETE)], BadChange,
     "no before-image naming its key"),
    ([SchemaEvent(SIMPLE_SCHEMA), ChangeEvent(lsn(200), Action.INSERT)], BadChange, "has no new row"),
    ([SchemaEvent(SIMPLE_SCHEMA), insert(lsn(200), 1),
      ChangeEvent(lsn(200), Action.INSERT, new={"id": 2, "v": float("nan")})], BadChange, "NaN"),
    ([SchemaEvent(SIMPLE_SCHEMA.__class__("other.t", SIMPLE_SCHEMA.columns))], BadEventOrder, "describes table"),
    ([SchemaEvent(SIMPLE_SCHEMA.__class__(T, (SIMPLE_SCHEMA.columns[1],)))], BadEventOrder, "no primary key"),
])
def test_bad_input_gets_a_clear_error_naming_the_table(tmp_path: Path, events: list[object],
                                                       error: type[Exception], message: str) -> None:
    with open_buffer(tmp_path) as buf:
        with pytest.raises(error, match=message) as info:
            for event in events:
                buf.append(event)  # type: ignore[arg-type]
        assert "table public.t" in str(info.value)
        assert buf.durable_position() is None


def test_primary_key_change_keys_by_the_new_image(tmp_path: Path) -> None:
    with open_buffer(tmp_path) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 1, "v": "a"}]):
            buf.append(event)
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, old={"id": 1, "v": "a"}, new={"id": 2, "v": "a"}))
        buf.append(TxEnd(lsn(200)))
        buf.seal()
        assert buf.stats(lsn(100)).distinct_keys_estimate == 2  # both keys were touched
    row = buffer_rows(tmp_path, T)[-1]
    assert (row["key"], row["old"]) == ("[2]", '{"id":1,"v":"a"}')
    assert (row["old_key"], row["change_key"], row["old_change_key"]) == ("[1]", "2", "1")
    assert (row["old_partial"], row["old_carries_key"]) == (False, True)


def test_an_update_naming_its_own_key_in_old_is_no_key_change(tmp_path: Path) -> None:
    """A partial before-image (key columns only, or none) or the same key: `old_key` stays null;
    the row says which before-images are partial and which name their key."""
    with open_buffer(tmp_path) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 1, "v": "a"}, {"id": 3, "v": "c"}]):
            buf.append(event)
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, old={"id": 1}, new={"id": 1, "v": "b"}))
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, old={"v": "c"}, new={"id": 3, "v": "d"}))
        buf.append(ChangeEvent(lsn(200), Action.UPDATE, new={"id": 1000000, "v": "e"}))
        buf.append(TxEnd(lsn(200)))
        buf.seal()
    rows = buffer_rows(tmp_path, T)[-3:]
    assert [(r["old_key"], r["change_key"], r["old_change_key"], r["old_partial"], r["old_carries_key"])
            for r in rows] == [(None, "1", None, True, True), (None, "3", None, False, False),
                               (None, "1e+06", None, True, False)]


def test_empty_positions_belong_to_the_next_boundary(tmp_path: Path) -> None:
    with open_buffer(tmp_path) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100)), insert("", 1), insert(lsn(200), 2),
                      TxEnd(lsn(200)), insert("", 3), insert(lsn(300), 4), TxEnd(lsn(300))]:
            buf.append(event)
        buf.seal()
        inner = buf.segments(lsn(200), lsn(300))
        first = buf.segments(lsn(100), lsn(200))
    assert [r["seq"] for r in read_refs(inner)] == [3, 4]
    assert [r["seq"] for r in read_refs(first)] == [1, 2]


def test_record_batch_schema_matches_parquet_columns() -> None:
    from resources.buffer.segments import record_batch

    batch = record_batch([(1, "0/1", "INSERT", "[1]", None, '{"id":1}', None, None, None, "1", None, True, False,
                           None, None, None, None)])
    assert batch.schema.equals(SCHEMA) and isinstance(batch, pa.RecordBatch)
