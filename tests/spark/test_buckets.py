"""The bucketed state: rows encoded once, snapshots as stored bytes, re-bases that rewrite only the
buckets their changes fall in and copy the rest from the previous snapshot object."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resources.buffer import BufferReader, ChangeBuffer
from resources.buffer.buffer import DEFAULT_ROW_GROUP_ROWS
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
from resources.subscribers.text_rows import RowCodec, TextChange, TextSnapshotRow
from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.formats.protobuf import snapshot_record
from snapshot_assets.archive.keys import snapshot_key
from snapshot_assets.archive.positions import format_lsn
from snapshot_assets.archive.sortkey import sort_key
from snapshot_assets.archive.versions import VERSIONS, snapshot_versions_key
from snapshot_assets.spark.assemble import assemble
from snapshot_assets.spark.bases import BufferSnapshotBase, LayeredBase
from snapshot_assets.spark.parts import BuiltArtifact, Reuse
from snapshot_assets.spark.snapshot import build_snapshot
from snapshot_assets.spark.state import PLACED_BUCKETS, StateBase, bucket_of, bucket_placement, spark_int_hash
from tests.spark.conftest import python_bytes, staged_bytes

TABLE = "public.events"
KEYS = ("id",)
BYTE_FORMATS = ("jsonl", "protobuf")
BIG = 2**60  # snowflake-like ids, beyond 2^53


# --- the sort key --------------------------------------------------------------------------------

scalars = st.one_of(st.integers(), st.text(max_size=6))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-(2**80), max_value=2**80), min_size=2, max_size=2),
       st.lists(st.text(max_size=5), min_size=2, max_size=2))
def test_sort_key_keeps_the_order_of_integers_and_strings(ints: list[int], texts: list[str]) -> None:
    a, b = ints
    assert (sort_key([a]) < sort_key([b])) == (a < b)
    s, t = texts
    assert (sort_key([s]) < sort_key([t])) == (s.encode("utf-8", "surrogatepass") < t.encode("utf-8", "surrogatepass"))
    # composite keys order by their first field, then the next (a string prefix sorts first)
    assert (sort_key([s, a]) < sort_key([t, b])) == ((s.encode("utf-8", "surrogatepass"), a) <
                                                    (t.encode("utf-8", "surrogatepass"), b))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(min_value=-(2**90), max_value=2**90), st.text(max_size=5), st.none()),
                min_size=1, max_size=3))
def test_the_sort_key_of_a_key_json_is_the_sort_key_of_its_values(values: list[Any]) -> None:
    from snapshot_assets.archive.keys import key_json
    from snapshot_assets.archive.sortkey import sort_key_of

    assert sort_key_of(key_json(tuple(values))) == sort_key(values)


# --- re-bases ----------------------------------------------------------------------------------------


def row(i: int, version: int = 0) -> dict[str, Any]:
    return {"id": BIG + i, "name": f"user {i}", "note": "x" * (40 + i % 17), "version": version}


#: The table's rows as PostgreSQL's column text (what the PostgreSQL source copies).
CODEC = RowCodec(("id", "name", "note", "version"), ("int", "text", "text", "int"), KEYS)


def copied(i: int, make: Callable[[int], dict[str, Any]] = row) -> SnapshotRow:
    r = make(i)
    return TextSnapshotRow(CODEC, tuple(str(r[name]) for name in CODEC.names))


def changed(position: str, action: Action, old: dict[str, Any] | None, new: dict[str, Any] | None) -> TextChange:
    """A change as column text, as PostgreSQL sends it under REPLICA IDENTITY DEFAULT."""
    def texts(image: dict[str, Any], names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(image[name]) for name in names)

    if action is Action.DELETE:
        assert old is not None
        return TextChange(position, action, CODEC, old_text=texts(old, CODEC.key))
    assert new is not None
    return TextChange(position, action, CODEC, new_text=texts(new, CODEC.names))


def buffer_with(root: Path, initial: int, waves: list[list[tuple[Action, int]]], *,
                text: bool = False, text_changes: bool = False, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                make: Callable[[int], dict[str, Any]] = row, copy_order: Sequence[int] | None = None
                ) -> tuple[BufferReader, list[str]]:
    """A buffer: an initial load of `initial` rows `make(i)` (typed, or with `text` kept as column
    text; in key order, or `copy_order`, as a table's heap may hold them), then one transaction per
    wave of (action, i) (typed, or with `text_changes` kept as
    column text as PostgreSQL sends them under REPLICA IDENTITY DEFAULT: no before-image for an
    UPDATE, the key columns only for a DELETE)."""
    lsn = 0x1000
    positions = []
    with ChangeBuffer(root, TABLE, seal_interval=3600.0, seal_changes=10_000, row_group_rows=row_group_rows) as buffer:
        columns = (Column("id", "int8", False, True, 1, 1), Column("name", "text", ordinal=2),
                   Column("note", "text", ordinal=3), Column("version", "int4", ordinal=4))
        buffer.append(SchemaEvent(TableSchema(TABLE, columns)))
        buffer.append(ResyncBegin("initial load"))
        for i in range(initial) if copy_order is None else copy_order:
            buffer.append(copied(i, make) if text else SnapshotRow(make(i)))
        buffer.append(ResyncEnd(format_lsn(lsn), initial))
        positions.append(format_lsn(lsn))
        for w, wave in enumerate(waves, start=1):
            for action, i in wave:
                lsn += 0x40
                old = row(i) if action is not Action.INSERT else None
                new = row(i, w) if action is not Action.DELETE else None
                buffer.append(changed(format_lsn(lsn), action, old, new) if text_changes else
                              ChangeEvent(format_lsn(lsn), action, old, new))
            lsn += 0x40
            buffer.append(TxEnd(format_lsn(lsn)))
            positions.append(format_lsn(lsn))
        buffer.seal()
    return BufferReader(root, TABLE), positions


def table_after(initial: int, waves: list[list[tuple[Action, int]]]) -> dict[int, dict[str, Any]]:
    """The table `buffer_with` holds after its waves: `row(i, wave)` of every key still there."""
    table = {i: row(i) for i in range(initial)}
    for w, wave in enumerate(waves, start=1):
        for action, i in wave:
            if action is Action.DELETE:
                table.pop(i, None)
            else:
                table[i] = row(i, w)
    return table


def expected_bytes(format_id: str, rows: dict[int, dict[str, Any]]) -> bytes:
    """What the single-process writer produces for the table, rows in sort-key order."""
    ordered = sorted(rows.values(), key=lambda r: sort_key([r["id"]]))
    return python_bytes(format_id, "snapshot", ordered)


def test_a_copy_kept_as_column_text_is_encoded_once_into_the_typed_copys_bytes(spark: Any, tmp_path: Path) -> None:
    """The copy's protobuf records are made beside its JSON as the buffer is read (the base carries
    them), and the snapshot and the re-base after it are the single-process writer's bytes."""
    initial = 1500
    reader, positions = buffer_with(tmp_path / "buffer", initial, [[(Action.UPDATE, 7), (Action.INSERT, initial)]],
                                    text=True)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    base = BufferSnapshotBase(reader.segment_ref(resync.segment))
    carried = base.frame(spark, KEYS).select("row", "pb").collect()
    assert len(carried) == initial
    assert all(bytes(r["pb"]) == snapshot_record(gojson.loads(r["row"]), KEYS) for r in carried)
    dest = LocalDestination(tmp_path / "archive")
    first = build_snapshot(spark, base, [], positions[0], KEYS, BYTE_FORMATS, tmp_path / "staging1",
                           tmp_path / "state" / "epoch=1", bucket_bytes=16 * 1024)
    refs = assemble(first, [dest], "t", 1)
    table = {i: row(i) for i in range(initial)}
    for fid in BYTE_FORMATS:
        got = dest.get(refs[fid].uri.split("/archive/", 1)[1])
        assert got is not None and got.data == expected_bytes(fid, table), fid
    # The full build counted the copy from the buffer's columns and estimated its jsonl size from
    # the column texts (it encodes each row once, in the pass that buckets it).
    census = base.census(spark)
    jsonl = len(expected_bytes("jsonl", table))
    assert census.rows == initial and abs(census.jsonl_bytes - jsonl) < 0.1 * jsonl, (census.jsonl_bytes, jsonl)
    assert census.samples == sorted(sort_key([r["id"]]) for r in table.values())  # a small copy: every key
    second = build_snapshot(spark, LayeredBase(first.details["state"], ()), reader.segments(positions[0], positions[1]),
                            positions[1], KEYS, BYTE_FORMATS, tmp_path / "staging2", tmp_path / "state" / "epoch=2",
                            bucket_bytes=16 * 1024)
    refs = assemble(second, [dest], "t", 2)
    table.update({7: row(7, 1), initial: row(initial, 1)})
    for fid in BYTE_FORMATS:
        got = dest.get(refs[fid].uri.split("/archive/", 1)[1])
        assert got is not None and got.data == expected_bytes(fid, table), fid


def test_a_rebase_of_recent_rows_rewrites_only_their_buckets_and_copies_the_rest(spark: Any, tmp_path: Path) -> None:
    initial = 3000
    recent = [(Action.UPDATE, i) for i in range(initial - 40, initial)] + \
             [(Action.INSERT, i) for i in range(initial, initial + 30)] + [(Action.DELETE, initial - 50)]
    reader, positions = buffer_with(tmp_path / "buffer", initial, [recent])
    dest = LocalDestination(tmp_path / "archive")
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    first = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], KEYS,
                           BYTE_FORMATS, tmp_path / "staging1", tmp_path / "state" / "epoch=1",
                           bucket_bytes=16 * 1024)
    state: StateBase = first.details["state"]
    assert first.details["mode"] == "full" and len(state.buckets) >= 10
    refs = assemble(first, [dest], "t", 1)
    table = {i: row(i) for i in range(initial)}
    for fid in BYTE_FORMATS:
        assert dest.get(refs[fid].uri.rsplit("/archive/", 1)[1]) is not None
    previous_keys = {fid: refs[fid].uri.split("/archive/", 1)[1] for fid in BYTE_FORMATS}
    for fid, key in previous_keys.items():
        got = dest.get(key)
        assert got is not None and got.data == expected_bytes(fid, table), fid

    previous_keys[VERSIONS] = snapshot_versions_key("t", 1, positions[0])  # the versions object beside it
    second = build_snapshot(spark, LayeredBase(state, ()), reader.segments(positions[0], positions[1]),
                            positions[1], KEYS, BYTE_FORMATS, tmp_path / "staging2", tmp_path / "state" / "epoch=2",
                            previous_keys=previous_keys, bucket_bytes=16 * 1024)
    assert second.details["mode"] == "incremental"
    touched = {bucket_of(state.bounds, sort_key([BIG + i])) for _, i in recent}
    assert second.details["rewritten"] == len(touched) <= 2 < len(state.buckets)
    for fid in BYTE_FORMATS:  # the untouched buckets are ranges of the previous object, not bytes of this run
        assert any(isinstance(p, Reuse) for p in second.formats[fid].parts)
    assert any(isinstance(p, Reuse) for p in second.sidecars[VERSIONS].parts)  # and of its versions object
    refs2 = assemble(second, [dest], "t", 2)
    for _, i in recent:
        table.pop(i, None)
    table.update({i: row(i, 1) for action, i in recent if action is not Action.DELETE})
    for fid in BYTE_FORMATS:
        got = dest.get(refs2[fid].uri.split("/archive/", 1)[1])
        assert got is not None and got.data == expected_bytes(fid, table), fid
    rebuilt = {r["id"] - BIG: r for r in FORMATS["jsonl"].read_snapshot(io.BytesIO(expected_bytes("jsonl", table)))}
    assert rebuilt == table


def rebase_and_rebuild(spark: Any, tmp_path: Path, initial: int, wave: list[tuple[Action, int]],
                       formats: tuple[str, ...]) -> tuple[BuiltArtifact, BuiltArtifact, BuiltArtifact]:
    """A full build of the initial load (16 KiB buckets), the incremental re-base of `wave` on its
    state, and for comparison a full build of the same table (other, larger buckets)."""
    reader, positions = buffer_with(tmp_path / "buffer", initial, [wave])
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    copy = BufferSnapshotBase(reader.segment_ref(resync.segment))
    first = build_snapshot(spark, copy, [], positions[0], KEYS, formats, tmp_path / "s1",
                           tmp_path / "state" / "epoch=1", bucket_bytes=16 * 1024)
    segments = reader.segments(positions[0], positions[1])
    incremental = build_snapshot(spark, first.details["state"], segments, positions[1], KEYS, formats,
                                 tmp_path / "s2", tmp_path / "state" / "epoch=2", bucket_bytes=16 * 1024)
    full = build_snapshot(spark, copy, segments, positions[1], KEYS, formats, tmp_path / "s3",
                          tmp_path / "other" / "epoch=2", bucket_bytes=64 * 1024)
    assert incremental.details["mode"] == "incremental" and full.details["mode"] == "full"
    return first, incremental, full


def test_uniform_churn_rewrites_every_bucket_and_gives_the_same_bytes_as_a_full_build(spark: Any,
                                                                                      tmp_path: Path) -> None:
    initial = 2000
    wave = [(Action.UPDATE, i) for i in range(0, initial, 7)] + [(Action.DELETE, i) for i in range(3, initial, 101)]
    first, incremental, full = rebase_and_rebuild(spark, tmp_path, initial, wave, BYTE_FORMATS)
    assert incremental.details["rewritten"] == len(first.details["state"].buckets)
    for fid in BYTE_FORMATS:
        a = b"".join(p.read_bytes() for p in incremental.formats[fid].files())
        b = b"".join(p.read_bytes() for p in full.formats[fid].files())
        assert a == b and len(a) == incremental.formats[fid].bytes


def test_the_tasks_merge_changes_into_stored_rows_and_a_bucket_can_empty(spark: Any, tmp_path: Path) -> None:
    """A re-base shuffles only the changes; each task merges them into its bucket's stored rows
    (typed columns too): a bucket whose every row is deleted ends empty, and the artifact in every
    format equals a full build of the same table."""
    import pyarrow.parquet as pq

    initial, formats = 2000, ("jsonl", "protobuf", "parquet")
    wave = ([(Action.DELETE, i) for i in range(400)] + [(Action.UPDATE, i) for i in range(400, initial, 9)]
            + [(Action.INSERT, i) for i in range(initial, initial + 20)])
    _, incremental, full = rebase_and_rebuild(spark, tmp_path, initial, wave, formats)
    state: StateBase = incremental.details["state"]
    assert state.buckets[0].rows == 0 and state.buckets[0].path is None  # its keys were all deleted
    assert state.rows == full.details["state"].rows == initial - 400 + 20
    for fid in BYTE_FORMATS:
        a = b"".join(p.read_bytes() for p in incremental.formats[fid].files())
        assert a == b"".join(p.read_bytes() for p in full.formats[fid].files()), fid
    merged, rebuilt = (pq.read_table(io.BytesIO(staged_bytes(b.formats["parquet"]))).sort_by("id")
                       for b in (incremental, full))
    assert merged.equals(rebuilt) and merged.num_rows == state.rows


def test_a_rebase_after_diffs_merges_the_rows_the_diffs_encoded(spark: Any, tmp_path: Path) -> None:
    """Diffs encode their new images into the state's deltas; the snapshot after them runs no encoder."""
    from snapshot_assets.spark.diff import build_diff

    initial = 1500
    waves = [[(Action.UPDATE, i) for i in range(w, initial, 50)] + [(Action.INSERT, initial + w)] for w in range(3)]
    waves.append([(Action.DELETE, i) for i in range(0, initial, 300)])
    reader, positions = buffer_with(tmp_path / "buffer", initial, waves)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    first = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], KEYS,
                           BYTE_FORMATS, tmp_path / "s0", tmp_path / "state" / "epoch=1", bucket_bytes=16 * 1024)
    layered = LayeredBase(first.details["state"], ())
    for n in range(1, 4):
        built = build_diff(spark, reader.segments(positions[n - 1], positions[n]), layered, positions[n], KEYS,
                           ("jsonl",), tmp_path / f"d{n}", tmp_path / "deltas" / str(n), state_formats=BYTE_FORMATS)
        delta = built.details["delta"]
        assert delta.encoded == BYTE_FORMATS and delta.rows(spark, BYTE_FORMATS) is not None
        layered = LayeredBase(layered.state, (*layered.deltas, delta))
    snap = build_snapshot(spark, layered, reader.segments(positions[3], positions[4]), positions[4], KEYS,
                          BYTE_FORMATS, tmp_path / "s1", tmp_path / "state" / "epoch=2", bucket_bytes=16 * 1024)
    assert snap.details["mode"] == "incremental"
    table = table_after(initial, waves)
    for fid in BYTE_FORMATS:
        assert b"".join(p.read_bytes() for p in snap.formats[fid].files()) == expected_bytes(fid, table), fid


def _typed_first_snapshot(spark: Any, tmp_path: Path, initial: int, waves: list[list[tuple[Action, int]]], *,
                          text: bool) -> tuple[BufferReader, list[str], BuiltArtifact]:
    """A buffer (`buffer_with`, the changes as column text too with `text`) and the full build of
    its copy in every format, parquet included (so the state has typed columns)."""
    reader, positions = buffer_with(tmp_path / "buffer", initial, waves, text=text, text_changes=text)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    first = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], KEYS,
                           (*BYTE_FORMATS, "parquet"), tmp_path / "s0", tmp_path / "state" / "epoch=1",
                           bucket_bytes=16 * 1024)
    return reader, positions, first


@pytest.mark.parametrize("text", [False, True], ids=["typed", "postgres-text"])
def test_diffs_type_their_new_images_once_for_the_parquet_diff_and_the_rebase(spark: Any, tmp_path: Path,
                                                                             text: bool) -> None:
    """A diff writes its new images' typed columns and protobuf records into the state's delta (made
    once); its parquet diff takes the cells rather than typing again, and the re-base after the
    diffs merges them: the same parquet diff as typing both images, and the table in every format.
    Also with the changes as PostgreSQL's column text (REPLICA IDENTITY DEFAULT: the before-images
    come from the state)."""
    import pyarrow.parquet as pq

    from resources.buffer.segments import TYPED_COLUMN
    from snapshot_assets.spark.diff import build_diff
    from snapshot_assets.spark.parquet_artifact import typed_columns, write_diff

    initial = 1200
    waves = [[(Action.UPDATE, i) for i in range(w, initial, 40)] + [(Action.INSERT, initial + w)] for w in range(2)]
    waves.append([(Action.DELETE, i) for i in range(0, initial, 200)] + [(Action.UPDATE, 5)])
    reader, positions, first = _typed_first_snapshot(spark, tmp_path, initial, waves, text=text)
    formats = (*BYTE_FORMATS, "parquet")
    schema = first.details["state"].schema
    assert schema is not None
    layered = LayeredBase(first.details["state"], ())
    for n in range(1, 3):
        built = build_diff(spark, reader.segments(positions[n - 1], positions[n]), layered, positions[n], KEYS,
                           formats, tmp_path / f"d{n}", tmp_path / "deltas" / str(n), state_formats=formats,
                           schema=schema)
        delta = built.details["delta"]
        assert delta.schema == schema
        typed = delta.typed_frame(spark, schema)
        assert typed is not None
        once = {r["key"]: r[TYPED_COLUMN] for r in typed.select("key", TYPED_COLUMN).collect()}
        again = {r["key"]: r[TYPED_COLUMN] for r in typed_columns(delta.frame(spark), schema, text="new")
                 .select("key", TYPED_COLUMN).collect()}
        assert once == again and any(v is not None for v in once.values())
        stored = delta.rows(spark, formats)
        assert stored is not None
        records = stored.filter("row IS NOT NULL").select("row", "pb").collect()
        assert records and all(bytes(r["pb"]) == snapshot_record(gojson.loads(r["row"]), KEYS) for r in records)
        both = write_diff(delta.frame(spark), schema, tmp_path / f"typed-twice-{n}.parquet", KEYS, truncated=False)
        assert isinstance(both.path, Path)
        reused = built.formats["parquet"].files()
        assert pq.read_table(reused[0]).equals(pq.read_table(both.path)), n
        layered = LayeredBase(layered.state, (*layered.deltas, delta))
    snap = build_snapshot(spark, layered, reader.segments(positions[2], positions[3]), positions[3], KEYS,
                          formats, tmp_path / "s1", tmp_path / "state" / "epoch=2", bucket_bytes=16 * 1024,
                          schema=schema)
    assert snap.details["mode"] == "incremental"
    table = table_after(initial, waves)
    merged = pq.read_table(io.BytesIO(staged_bytes(snap.formats["parquet"]))).sort_by("id")
    assert merged.select(list(CODEC.names)).to_pylist() == [table[i] for i in sorted(table)]
    for fid in BYTE_FORMATS:
        assert staged_bytes(snap.formats[fid]) == expected_bytes(fid, table), fid


def test_rows_of_some_keys_come_from_their_buckets_only(spark: Any, tmp_path: Path) -> None:
    from snapshot_assets.archive.keys import key_json
    from snapshot_assets.spark.bases import rows_for

    reader, positions = buffer_with(tmp_path / "buffer", 2000, [])
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    built = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], KEYS,
                           BYTE_FORMATS, tmp_path / "s", tmp_path / "state" / "epoch=1", bucket_bytes=16 * 1024)
    state: StateBase = built.details["state"]
    wanted = [5, 6, 1999, 4000]  # 4000 is not in the table
    keys = spark.createDataFrame([(key_json((BIG + i,)),) for i in wanted], "key STRING")
    got = rows_for(state, spark, KEYS, keys)
    assert sorted(r["key"] for r in got.collect()) == sorted(key_json((BIG + i,)) for i in wanted[:3])
    read = {f.rsplit("/", 1)[-1] for f in got.inputFiles()}
    files = {b.path.rsplit("/", 1)[-1] for b in state.buckets if b.path}
    assert 0 < len(read) <= 3 < len(files) and read <= files  # only the buckets of the wanted keys are scanned


@pytest.mark.slow
@pytest.mark.s3
def test_an_s3_rebase_copies_the_untouched_buckets_server_side(spark: Any, tmp_path: Path, s3_bucket: str,
                                                              moto_server: str) -> None:
    """On S3 the untouched buckets' bytes become UploadPartCopy parts of the new object (ranges of at
    least 5 MiB); the object equals the single-process writer's bytes for the table."""
    from resources.destinations.multipart import CopyRange, Fresh, plan_parts
    from resources.destinations.s3 import S3Destination

    initial = 100_000
    recent = [(Action.UPDATE, i) for i in range(initial - 300, initial)] + \
             [(Action.INSERT, i) for i in range(initial, initial + 200)]
    reader, positions = buffer_with(tmp_path / "buffer", initial, [recent])
    dest = S3Destination(s3_bucket, endpoint_url=moto_server, path_style=True)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    first = build_snapshot(spark, BufferSnapshotBase(reader.segment_ref(resync.segment)), [], positions[0], KEYS,
                           BYTE_FORMATS, tmp_path / "s1", tmp_path / "state" / "epoch=1", bucket_bytes=512 * 1024)
    assemble(first, [dest], "t/", 1)
    previous = {fid: snapshot_key("t/", 1, positions[0], FORMATS[fid].extension) for fid in BYTE_FORMATS}
    previous[VERSIONS] = snapshot_versions_key("t/", 1, positions[0])
    second = build_snapshot(spark, first.details["state"], reader.segments(positions[0], positions[1]), positions[1],
                            KEYS, BYTE_FORMATS, tmp_path / "s2", tmp_path / "state" / "epoch=2",
                            previous_keys=previous, bucket_bytes=512 * 1024)
    assert second.details["rewritten"] <= 2
    for fid in BYTE_FORMATS:
        pieces = [CopyRange(p.source_key, p.start, p.length) if isinstance(p, Reuse) else Fresh(p.stat().st_size)
                  for p in second.formats[fid].parts]
        assert any(part.copy is not None for part in plan_parts(pieces)), (fid, second.formats[fid].parts)
    refs = assemble(second, [dest], "t/", 2)
    table = {i: row(i) for i in range(initial)}
    table.update({i: row(i, 1) for _, i in recent})
    for fid in BYTE_FORMATS:
        got = dest.get(refs[fid].uri.split(f"s3://{s3_bucket}/", 1)[1])
        assert got is not None and got.data == expected_bytes(fid, table), fid


# --- one task per bucket -------------------------------------------------------------------------


def test_the_python_hash_is_sparks(spark: Any) -> None:
    """`spark_int_hash` is Spark's `hash()` of an INT (what `repartition(n, column)` places rows by)."""
    values = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), 123_456_789, -987_654]
    got = spark.createDataFrame([(v,) for v in values], "v INT").selectExpr("v", "hash(v) AS h").collect()
    assert {r["v"]: r["h"] for r in got} == {v: spark_int_hash(v) for v in values}


@pytest.mark.parametrize("buckets", [[0, 1, 2, 3, 4, 5], [3, 9, 14], list(range(15)), [7]])
def test_every_bucket_gets_a_task_of_its_own(spark: Any, buckets: list[int]) -> None:
    """Hashing bucket ids as they are put 6 buckets into 3 tasks (and left 3 empty), so a bucket's
    task waited for another's; the placement column gives each bucket its own partition."""
    rows = spark.range(0, 40 * len(buckets)).selectExpr(
        f"element_at(array({', '.join(map(str, buckets))}), CAST(id % {len(buckets)} AS INT) + 1) AS bucket")
    placed = rows.selectExpr("*", f"{bucket_placement(buckets)} AS task").repartition(len(buckets), "task")
    tasks = placed.selectExpr("bucket", "spark_partition_id() AS p").distinct().collect()
    assert sorted(r["bucket"] for r in tasks) == sorted(buckets)  # each bucket in one partition only
    assert len({r["p"] for r in tasks}) == len(buckets)  # and no two in the same one


def test_the_placement_stays_small_for_many_buckets() -> None:
    """A placement value per bucket up to PLACED_BUCKETS, found in few tries; beyond, the bucket id."""
    many = list(range(PLACED_BUCKETS))
    placed = bucket_placement(many)
    salts = [int(value) for value in re.findall(r"THEN (\d+)", placed)]
    assert sorted(spark_int_hash(v) % PLACED_BUCKETS for v in salts) == many  # one partition each
    assert max(salts) < 20 * PLACED_BUCKETS
    assert bucket_placement(list(range(PLACED_BUCKETS + 1))) == "bucket"


def test_a_rebase_right_after_one_diff_merges_that_diffs_delta_as_it_is(spark: Any, tmp_path: Path) -> None:
    """The usual re-base (one diff since the state, nothing since the diff): the delta's rows are
    the changes, read where they are (no grouped copy of them in scratch), and the snapshot is the
    table in every format, parquet included."""
    import pyarrow.parquet as pq

    from snapshot_assets.spark.diff import build_diff

    initial = 1500
    waves = [[(Action.UPDATE, i) for i in range(initial - 100, initial, 5)] +
             [(Action.DELETE, 7), (Action.INSERT, initial)]]
    reader, positions, first = _typed_first_snapshot(spark, tmp_path, initial, waves, text=True)
    formats = (*BYTE_FORMATS, "parquet")
    schema = first.details["state"].schema
    diff = build_diff(spark, reader.segments(positions[0], positions[1]), LayeredBase(first.details["state"], ()),
                      positions[1], KEYS, formats, tmp_path / "d1", tmp_path / "deltas" / "1", state_formats=formats,
                      schema=schema)
    layered = LayeredBase(first.details["state"], (diff.details["delta"],))
    snap = build_snapshot(spark, layered, [], positions[1], KEYS, formats, tmp_path / "s1",
                          tmp_path / "state" / "epoch=2", bucket_bytes=16 * 1024, schema=schema)
    assert snap.details["mode"] == "incremental" and 0 < snap.details["rewritten"] < snap.details["buckets"]
    assert not (tmp_path / "s1" / "_work" / "changed").exists()
    table = table_after(initial, waves)
    for fid in BYTE_FORMATS:
        assert staged_bytes(snap.formats[fid]) == expected_bytes(fid, table), fid
    merged = pq.read_table(io.BytesIO(staged_bytes(snap.formats["parquet"]))).sort_by("id")
    assert merged.select(list(CODEC.names)).to_pylist() == [table[i] for i in sorted(table)]
