"""Spark-written parquet artifacts: one file, read back by the project's reader exactly as the
Python writer's file of the same rows reads back, and by pyarrow, DuckDB and Spark with exact
integers; a value that does not fit the table's schema is refused with its column and key."""

from __future__ import annotations

import io
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from resources.buffer.segments import TYPED_COLUMN
from resources.destinations.local import LocalDestination
from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.formats.parquet import ParquetFormat
from snapshot_assets.archive.keys import diff_key, key_json, laredo_row_key, snapshot_key, typed_key
from snapshot_assets.archive.manifest import Artifact, FormatRef
from snapshot_assets.archive.positions import compare_lsn
from snapshot_assets.archive.reader import ArchiveReader
from snapshot_assets.archive.row_schema import ColumnType, RowSchema
from snapshot_assets.pipeline.commit import commit_artifact
from snapshot_assets.spark.effects import decode_row
from snapshot_assets.spark.parquet_artifact import (
    PARQUET_FORMAT,
    SchemaMisfit,
    check_names,
    infer_row_schema,
    refusing_misfits,
    snapshot_arrow_schema,
    typed_columns,
    write_diff,
)
from snapshot_assets.spark.parquet_pieces import parquet_object
from snapshot_assets.spark.parts import prepare_staging
from snapshot_assets.spark.state import buckets_from_reports, encode_rows, sample_bounds, write_buckets
from tests.spark.conftest import staged_bytes

KEY_FIELDS = ("tenant", "id")
FORMAT = ParquetFormat()

# A PostgreSQL table as the manifest describes it (OIDs: int8, text, int4, float8, bool, jsonb, bytea,
# numeric, int4[], timestamptz).
MANIFEST_COLUMNS = [
    {"Name": name, "TypeOID": oid, "OrdinalPosition": i + 1}
    for i, (name, oid) in enumerate([("id", 20), ("tenant", 25), ("n", 23), ("score", 701), ("flag", 16),
                                     ("doc", 3802), ("blob", 17), ("amount", 1700), ("tags", 1007),
                                     ("at", 1184)])
]


def _row(rng: random.Random, i: int) -> Row:
    """A row as the PostgreSQL source produces it, with the awkward values: ids beyond 2^53, nulls,
    float specials as names, integral floats, jsonb of every kind (big integers, strings, escapes)."""
    row: Row = {
        "id": 2**53 + 1 + i * 7919 if i % 3 else -(2**62) + i,
        "tenant": rng.choice(["acme", "初め", "a b", "<x>&\u2028"]),
        "n": rng.choice([None, 0, -(2**31), 2**31 - 1, i]),
        "score": rng.choice([None, 1.5, 3.0, -(2.0**60), 1e21, 1e-7, 0.1 + 0.2, "NaN", "Infinity", "-Infinity"]),
        "flag": rng.choice([None, True, False]),
        "doc": rng.choice([None, {"a": [1, 2**70, "x"], "b": {"c": None}}, "just text", 12, 2**64 + 1, [], {},
                           "\"quoted\" \\ \n", 1.25, True]),
        "blob": rng.choice([None, "AAEC/w==", ""]),
        "amount": rng.choice([None, "12345678901234567890.000000001", "NaN", "-0.5"]),
        "tags": rng.choice([None, [1, None, 3], [], "[0:1]={1,2}"]),
        "at": rng.choice([None, "2024-05-01T12:00:00.5Z", "infinity"]),
    }
    for name in rng.sample(sorted(row), rng.choice([0, 0, 0, 1, 2])):
        if name not in KEY_FIELDS:
            del row[name]  # absent, not null
    return row


def _rows(count: int, seed: int = 7) -> list[Row]:
    rng = random.Random(seed)
    return [_row(rng, i) for i in range(count)]


def _text(row: Row | None) -> str | None:
    return None if row is None else gojson.encode_row(row, lambda: "test")


def _state(spark: Any, rows: Sequence[Row]) -> Any:
    data = [(key_json(typed_key(r, KEY_FIELDS)), _text(r)) for r in rows]
    return spark.createDataFrame(data, "key STRING, row STRING").repartition(3)


@dataclass(frozen=True)
class _Written:
    path: Path
    bytes: int
    rows: int


def write_snapshot(frame: Any, schema: RowSchema, out: Path, *, buckets: int = 3) -> _Written:
    """The snapshot parquet file a build writes for `frame` (key, row), by the build's own path:
    rows encoded, typed and written as `buckets` buckets (each task writes its bucket's parquet
    piece), the pieces joined by `parquet_object` (magic, bodies, merged footer)."""
    check_names(frame.sparkSession, schema.names)
    work = Path(tempfile.mkdtemp(prefix="snapshot-parquet-"))
    try:
        rows = encode_rows(frame.selectExpr("key", "row", "CAST(NULL AS STRING) AS ver", "CAST(NULL AS BINARY) AS pb"),
                           KEY_FIELDS, (PARQUET_FORMAT,))
        bounds = sample_bounds(rows, buckets, rows.count())
        staging = prepare_staging(work / "staging", (PARQUET_FORMAT,)).path
        arrow = snapshot_arrow_schema(schema)
        reports = write_buckets(typed_columns(rows, schema), bounds, range(len(bounds) + 1), work / "pool", staging,
                                (PARQUET_FORMAT,), parquet=arrow)
        state = buckets_from_reports(reports, bounds)
        staged = parquet_object([b.sizes.get(PARQUET_FORMAT, 0) for b in state], [b.footer for b in state],
                                {int(r["bucket"]): Path(r["blob"]) for r in reports if r["format"] == PARQUET_FORMAT},
                                [], None, arrow, staging=staging, uploads=None)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(staged_bytes(staged))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _Written(out, staged.bytes, sum(b.rows for b in state))


def _python_snapshot(rows: Sequence[Row]) -> list[Row]:
    """What the Python writer's file (fed the decoded Go-JSON text, as Spark tasks feed it) reads back."""
    out = io.BytesIO()
    writer = FORMAT.snapshot_writer(out, KEY_FIELDS)
    for row in rows:
        decoded = decode_row(_text(row))
        assert decoded is not None
        writer.write(decoded)
    writer.close()
    out.seek(0)
    return list(FORMAT.read_snapshot(out))


def _read_snapshot(path: Path) -> list[Row]:
    with open(path, "rb") as src:
        return list(FORMAT.read_snapshot(src))


def _by_key(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: key_json(typed_key(r, KEY_FIELDS)))


def _with_types(rows: Sequence[Row]) -> list[list[tuple[str, type, Any]]]:
    """Rows with each value's type, so 3 and 3.0 do not compare equal."""
    return [[(k, type(v), v) for k, v in sorted(r.items())] for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("schema_from", ["manifest", "inferred"])
def test_snapshot_reads_back_exactly_as_the_python_writers(spark: Any, tmp_path: Path, schema_from: str) -> None:
    rows = _rows(300)
    state = _state(spark, rows)
    schema = RowSchema.from_manifest_columns(MANIFEST_COLUMNS) if schema_from == "manifest" \
        else infer_row_schema(state)
    written = write_snapshot(state, schema, tmp_path / "snapshot.parquet")
    assert written.path.is_file() and written.rows == len(rows)
    got = _by_key(_read_snapshot(written.path))
    assert _with_types(got) == _with_types(_by_key(_python_snapshot(rows)))
    assert _with_types(got) == _with_types(_by_key([decode_row(_text(r)) or {} for r in rows]))


@pytest.mark.slow
def test_inferred_schema_types_columns_like_the_python_writer(spark: Any) -> None:
    rows = [{"id": 1, "big": 2**64, "f": 1.5, "mixed": 1, "s": "x", "b": True, "nothing": None, "nest": [1]},
            {"id": 2, "big": None, "f": 0.25, "mixed": "one", "s": None, "b": False}]
    schema = infer_row_schema(_state_keyed(spark, rows, ("id",)))
    assert schema == RowSchema.of([("b", ColumnType.BOOL), ("big", ColumnType.JSON), ("f", ColumnType.FLOAT64),
                                   ("id", ColumnType.INT64), ("mixed", ColumnType.JSON), ("nest", ColumnType.JSON),
                                   ("nothing", ColumnType.STRING), ("s", ColumnType.STRING)])


def _state_keyed(spark: Any, rows: Sequence[Row], key_fields: Sequence[str]) -> Any:
    return spark.createDataFrame([(key_json(typed_key(r, key_fields)), _text(r)) for r in rows],
                                 "key STRING, row STRING")


@pytest.mark.slow
def test_peers_read_the_file_with_exact_integers(spark: Any, tmp_path: Path) -> None:
    rows = _rows(200, seed=11)
    schema = RowSchema.from_manifest_columns(MANIFEST_COLUMNS)
    path = write_snapshot(_state(spark, rows), schema, tmp_path / "s.parquet").path
    ids = sorted(r["id"] for r in rows)
    assert sorted(pq.read_table(path).column("id").to_pylist()) == ids
    assert [i for (i,) in duckdb.sql(f"SELECT id FROM read_parquet('{path}') ORDER BY id").fetchall()] == ids
    assert sorted(r["id"] for r in spark.read.parquet(str(path)).select("id").collect()) == ids
    doubles = duckdb.sql(f"SELECT count(*) FROM read_parquet('{path}') WHERE isnan(score)").fetchall()[0][0]
    assert doubles == sum(1 for r in rows if r.get("score") == "NaN")


@pytest.mark.slow
def test_same_rows_give_the_same_bytes(spark: Any, tmp_path: Path) -> None:
    rows = _rows(100, seed=3)
    schema = RowSchema.from_manifest_columns(MANIFEST_COLUMNS)
    state = _state(spark, rows)
    first = write_snapshot(state, schema, tmp_path / "a.parquet")
    second = write_snapshot(state, schema, tmp_path / "b.parquet")
    assert first.path.read_bytes() == second.path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet"]  # no folder left behind


def _changes(rows: Sequence[Row], rng: random.Random) -> list[tuple[str, Row | None, Row | None]]:
    """(action, old, new) net changes over `rows`: updates, deletes (one without a before-image) and inserts."""
    changes: list[tuple[str, Row | None, Row | None]] = []
    for i, row in enumerate(rows):
        if i % 4 == 0:
            changes.append(("UPDATE", row, {**_row(rng, i), "tenant": row["tenant"], "id": row["id"]}))
        elif i % 4 == 1:
            changes.append(("DELETE", row, None))
        elif i % 4 == 2:
            changes.append(("INSERT", None, {**_row(rng, i), "id": row["id"] + 10**6}))
    changes.append(("DELETE", None, None))
    return changes


def _net(spark: Any, changes: Sequence[tuple[str, Row | None, Row | None]]) -> Any:
    data = []
    for n, (action, old, new) in enumerate(changes):
        image = new if new is not None else old
        key = key_json(typed_key(image, KEY_FIELDS)) if image is not None else f'["gone",{n}]'
        change_key = laredo_row_key(image, KEY_FIELDS) if image is not None else f"[gone {n}]"
        data.append((key, action, change_key, _text(old), _text(new)))
    return spark.createDataFrame(data, "key STRING, action STRING, change_key STRING, old STRING, new STRING")


def _python_diff(net: Any, truncated: bool) -> list[Change]:
    """The Python writer's diff of the same net changes (TRUNCATE first, then by key, as Spark writes)."""
    out = io.BytesIO()
    writer = FORMAT.diff_writer(out, KEY_FIELDS)
    if truncated:
        writer.write(Change(Action.TRUNCATE))
    for r in sorted(net.collect(), key=lambda r: r["key"]):
        writer.write(Change(Change.parse_action(r["action"]), r["change_key"], decode_row(r["old"]),
                            decode_row(r["new"])))
    writer.close()
    out.seek(0)
    return list(FORMAT.read_diff(out))


@pytest.mark.slow
@pytest.mark.parametrize("truncated", [False, True])
def test_diff_reads_back_exactly_as_the_python_writers(spark: Any, tmp_path: Path, truncated: bool) -> None:
    net = _net(spark, _changes(_rows(120, seed=5), random.Random(9)))
    schema = RowSchema.from_manifest_columns(MANIFEST_COLUMNS)
    written = write_diff(net, schema, tmp_path / "diff.parquet", KEY_FIELDS, truncated=truncated)
    with open(written.path, "rb") as src:
        got = list(FORMAT.read_diff(src))
    want = _python_diff(net, truncated)
    assert [c.action for c in got][:1] == ([Action.TRUNCATE] if truncated else [want[0].action])
    assert [(c.action, c.key) for c in got] == [(c.action, c.key) for c in want]
    assert [(_with_types([c.old or {}]), _with_types([c.new or {}])) for c in got] == \
        [(_with_types([c.old or {}]), _with_types([c.new or {}])) for c in want]
    assert [c.old is None for c in got] == [c.old is None for c in want]


@pytest.mark.slow
def test_diff_keys_of_float_and_json_key_columns(spark: Any, tmp_path: Path) -> None:
    rows = [{"k": 1000000.5, "j": {"a": 1}}, {"k": 2.0**60, "j": "s"}, {"k": 1e21, "j": [1, 2**70]}]
    fields = ("k", "j")
    net = spark.createDataFrame(
        [(key_json(typed_key(r, fields)), "INSERT", laredo_row_key(r, fields), None, _text(r)) for r in rows],
        "key STRING, action STRING, change_key STRING, old STRING, new STRING")
    schema = RowSchema.of([("k", ColumnType.FLOAT64), ("j", ColumnType.JSON)])
    with open(write_diff(net, schema, tmp_path / "d.parquet", fields, truncated=False).path, "rb") as src:
        got = sorted(c.key for c in FORMAT.read_diff(src))
    out = io.BytesIO()
    writer = FORMAT.diff_writer(out, fields)
    for r in rows:
        writer.write(Change(Action.INSERT, "", None, decode_row(_text(r))))
    writer.close()
    out.seek(0)
    assert got == sorted(c.key for c in FORMAT.read_diff(out))


@pytest.mark.slow
@pytest.mark.parametrize(("row", "column", "message"), [
    ({"tenant": "acme", "id": 1, "n": "7"}, "n", "does not fit"),
    ({"tenant": "acme", "id": 1, "n": 1.5}, "n", "does not fit"),
    ({"tenant": "acme", "id": 1, "n": 2**31}, "n", "does not fit"),
    ({"tenant": "acme", "id": 2**63}, "id", "does not fit"),
    ({"tenant": "acme", "id": 1, "score": 2**53 + 1}, "score", "does not fit"),
    ({"tenant": "acme", "id": 1, "score": "+Inf"}, "score", "does not fit"),
    ({"tenant": "acme", "id": 1, "flag": 1}, "flag", "does not fit"),
    ({"tenant": 5, "id": 1}, "tenant", "does not fit"),
    ({"tenant": "acme", "id": 1, "surprise": 1}, "surprise", "does not name"),
])
def test_a_value_that_does_not_fit_is_refused_with_column_and_key(spark: Any, tmp_path: Path, row: Row, column: str,
                                                                   message: str) -> None:
    schema = RowSchema.from_manifest_columns(MANIFEST_COLUMNS)
    good = _rows(20)
    frame = spark.createDataFrame([("[\"bad\"]", _text(row)), *[(f"[{i}]", _text(r)) for i, r in enumerate(good)]],
                                  "key STRING, row STRING")
    with pytest.raises(SchemaMisfit, match=message) as caught:
        write_snapshot(frame, schema, tmp_path / "s.parquet")
    assert caught.value.column == column and caught.value.row_key == "[\"bad\"]"
    assert not (tmp_path / "s.parquet").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("escaped_literals", ["false", "true"])
def test_column_names_with_quotes_and_backslashes_are_typed_and_named(spark: Any, escaped_literals: str) -> None:
    """The typing is Spark SQL text: a column name is a constant in it, whatever it holds and
    however the session reads backslashes in literals."""
    names = ["it's", "back\\slash", "tick`name"]
    schema = RowSchema.of([(name, ColumnType.INT64) for name in names])
    spark.conf.set("spark.sql.parser.escapedStringLiterals", escaped_literals)
    try:
        row = dict(zip(names, (1, 2, 3), strict=True))
        good = spark.createDataFrame([("[1]", _text(row))], "key STRING, row STRING")
        (image,) = typed_columns(good, schema).select(TYPED_COLUMN).first() or ()
        assert [image[name] for name in names] == [1, 2, 3]
        bad = spark.createDataFrame([("[2]", _text({"back\\slash": "x"}))], "key STRING, row STRING")
        with pytest.raises(SchemaMisfit) as caught, refusing_misfits():
            typed_columns(bad, schema).collect()
        assert caught.value.column == "back\\slash" and caught.value.row_key == "[2]"
    finally:
        spark.conf.unset("spark.sql.parser.escapedStringLiterals")


@pytest.mark.slow
def test_a_row_that_is_not_an_object_is_refused(spark: Any, tmp_path: Path) -> None:
    frame = spark.createDataFrame([("[1]", "[1,2]")], "key STRING, row STRING")
    with pytest.raises(SchemaMisfit, match="not a JSON object"):
        write_snapshot(frame, RowSchema.of([("id", ColumnType.INT64)]), tmp_path / "s.parquet")


@pytest.mark.slow
def test_empty_snapshot_is_one_readable_file(spark: Any, tmp_path: Path) -> None:
    frame = spark.createDataFrame([], "key STRING, row STRING")
    written = write_snapshot(frame, RowSchema.from_manifest_columns(MANIFEST_COLUMNS), tmp_path / "e.parquet")
    assert written.rows == 0 and _read_snapshot(written.path) == []


def test_old_python_written_artifacts_still_read(tmp_path: Path) -> None:
    """The reader keeps reading the Python writer's files (Arrow metadata, no Spark footer entry)."""
    rows = [decode_row(_text(r)) or {} for r in _rows(50)]
    out = io.BytesIO()
    writer = FORMAT.snapshot_writer(out, KEY_FIELDS)
    for r in rows:
        writer.write(r)
    writer.close()
    out.seek(0)
    assert _with_types(list(FORMAT.read_snapshot(out))) == _with_types(rows)


@pytest.mark.slow
def test_archive_reader_rebuilds_the_table_from_spark_written_artifacts(spark: Any, tmp_path: Path) -> None:
    """The oracle: a Spark-written snapshot + diff (single files) rebuild to the rows the changes
    leave, read through the archive reader exactly as jsonl-style decoding would give them."""
    rows = _rows(80, seed=21)
    changes = _changes(rows, random.Random(4))[:-1]  # every change with an image
    schema = RowSchema.from_manifest_columns(MANIFEST_COLUMNS)
    dest = LocalDestination(tmp_path / "archive")
    prefix = "t/"
    snap = write_snapshot(_state(spark, rows), schema, dest.root / snapshot_key(prefix, 1, "0/10", ".parquet"))
    diff = write_diff(_net(spark, changes), schema, dest.root / diff_key(prefix, 1, "0/10", "0/20", ".parquet"),
                      KEY_FIELDS, truncated=False)
    for art in (Artifact("snapshot", 1, None, "0/10", "2026-01-01T00:00:00Z",
                         {"parquet": FormatRef(dest.uri(snapshot_key(prefix, 1, "0/10", ".parquet")), snap.bytes)},
                         row_count=snap.rows),
                Artifact("diff", 1, "0/10", "0/20", "2026-01-01T00:00:00Z",
                         {"parquet": FormatRef(dest.uri(diff_key(prefix, 1, "0/10", "0/20", ".parquet")), diff.bytes)},
                         change_count=diff.rows)):
        commit_artifact([dest], prefix, "public.t", art, cmp=compare_lsn, columns=MANIFEST_COLUMNS)

    expected = {key_json(typed_key(r, KEY_FIELDS)): decode_row(_text(r)) for r in rows}
    for action, old, new in changes:
        image = new if new is not None else old
        assert image is not None
        if action == "DELETE":
            expected.pop(key_json(typed_key(image, KEY_FIELDS)))
        else:
            expected[key_json(typed_key(image, KEY_FIELDS))] = decode_row(_text(new))
    rebuilt = ArchiveReader(dest, prefix, key_fields=KEY_FIELDS).reconstruct_as_of()
    assert rebuilt is not None and rebuilt.position == "0/20"
    assert _with_types(_by_key(rebuilt.rows)) == _with_types(_by_key([r for r in expected.values() if r]))
