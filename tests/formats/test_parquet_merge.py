"""Merging standalone parquet files by byte concatenation and a rewritten footer (`parquet_merge`).

The merged file must be an ordinary parquet file to every reader: pyarrow (whole file, row group by
row group, with statistics filters) and DuckDB read back exactly the concatenation of the inputs.
The Thrift codec must be the identity on footers pyarrow writes, and never fail on damaged input
with anything but a ParquetMergeError.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshot_assets.archive.formats import parquet_merge as pm
from snapshot_assets.archive.formats.parquet_merge import (
    MAGIC,
    Field,
    ParquetMergeError,
    Struct,
    ThriftList,
    ThriftMap,
    decode_struct,
    encode_struct,
    merge_files,
    merge_footers,
    split_file,
    trailer,
)

# PARQUET_MERGE_EXAMPLES=500 for a deeper search than the default run affords.
EXAMPLES = int(os.environ.get("PARQUET_MERGE_EXAMPLES", "100"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SPARK_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def write(table: pa.Table, **options: Any) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, **options)
    return out.getvalue()


def read(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))


def metadata(data: bytes) -> Any:
    return pq.read_metadata(io.BytesIO(data))


def footer_of(data: bytes) -> Struct:
    return decode_struct(split_file(data).footer)


def duckdb_rows(data: bytes, tmp_path: Path, order_by: str = "i") -> list[tuple[Any, ...]]:
    path = tmp_path / "merged.parquet"
    path.write_bytes(data)
    with duckdb.connect() as con:
        return con.execute(f"SELECT * FROM read_parquet(?) ORDER BY {order_by}", [str(path)]).fetchall()


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in table.to_pylist()]


def field(s: Struct, field_id: int) -> Any:
    f = s.get(field_id)
    assert f is not None, f"field {field_id} missing"
    return f.value


def row_groups(md: Struct) -> list[Struct]:
    return [rg for rg in field(md, 4).items if isinstance(rg, Struct)]


def column_chunks(md: Struct) -> list[Struct]:
    return [cc for rg in row_groups(md) for cc in field(rg, 1).items if isinstance(cc, Struct)]


def sample_table(n: int = 300) -> pa.Table:
    return pa.table({
        "i": pa.array(range(n), pa.int64()),
        "big": pa.array([2**62 + k if k % 5 else None for k in range(n)], pa.int64()),
        "f": pa.array([k / 7 for k in range(n)], pa.float64()),
        "b": pa.array([k % 3 == 0 for k in range(n)], pa.bool_()),
        "s": pa.array([f"text-{k % 11}" if k % 4 else "" for k in range(n)], pa.string()),
        "bin": pa.array([bytes([k % 256]) * (k % 3) for k in range(n)], pa.binary()),
        "tags": pa.array([[f"t{k}", None] if k % 2 else [] for k in range(n)], pa.list_(pa.string())),
    })


# --- the codec -------------------------------------------------------------------------------------


def _table(name: str) -> pa.Table:
    n = 2000
    if name == "ints":
        return pa.table({"a": pa.array([2**53 + k * 2**40 for k in range(n)], pa.int64()),
                         "neg": pa.array([-(2**63) + k for k in range(n)], pa.int64()),
                         "u": pa.array([2**64 - 1 - k for k in range(n)], pa.uint64()),
                         "small": pa.array([k % 100 for k in range(n)], pa.int8())})
    if name == "mixed":
        return sample_table(n)
    if name == "nulls":
        return pa.table({"n": pa.nulls(n), "s": pa.array([None] * n, pa.string()),
                         "x": pa.array([None if k % 2 else k for k in range(n)], pa.int32())})
    if name == "large_strings":
        return pa.table({"s": pa.array([("é" * 5000) + str(k) if k % 3 else "" for k in range(n)], pa.string()),
                         "ls": pa.array(["x" * (k % 50) for k in range(n)], pa.large_string())})
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["ints", "mixed", "nulls", "large_strings"])
@pytest.mark.parametrize("options", [
    {},
    {"use_dictionary": False},
    {"write_statistics": False},
    {"row_group_size": 300},
    {"row_group_size": 700, "write_page_index": True},
    {"write_page_index": True, "use_dictionary": False, "compression": "zstd"},
    {"store_schema": False, "compression": "none"},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_decode_encode_is_identity_on_pyarrow_footers(name: str, options: dict[str, Any]) -> None:
    footer = split_file(write(_table(name), **options)).footer
    assert encode_struct(decode_struct(footer)) == footer


def test_decode_encode_is_identity_with_bloom_filters_and_spark_metadata() -> None:
    table = sample_table().replace_schema_metadata({SPARK_KEY: b'{"type":"struct","fields":[]}'})
    footer = split_file(write(table, bloom_filter_options={"i": True, "s": {"ndv": 100, "fpp": 0.01}},
                              row_group_size=100)).footer
    assert encode_struct(decode_struct(footer)) == footer


def test_codec_covers_every_type_and_long_field_headers() -> None:
    nan_payload = bytes.fromhex("010000000000f87f")
    inner = Struct((Field(1, pm.BOOL_FALSE, False), Field(-3, pm.I8, -128)))
    s = Struct((
        Field(1, pm.BOOL_TRUE, True),
        Field(2, pm.I8, 127),
        Field(3, pm.I16, -(2**15)),
        Field(19, pm.I32, 2**31 - 1),  # delta 16: long form
        Field(5, pm.I64, -(2**63)),  # decreasing id: long form
        Field(6, pm.DOUBLE, nan_payload),
        Field(7, pm.BINARY, b""),
        Field(8, pm.LIST, ThriftList(pm.BOOL_TRUE, (1, 2, 0, 1))),  # raw bool bytes, writers differ
        Field(9, pm.SET, ThriftList(pm.I32, tuple(range(-20, 20)))),  # 40 elements: long list header
        Field(10, pm.MAP, ThriftMap(pm.BINARY, pm.STRUCT, ((b"k", inner), (b"", Struct(()))))),
        Field(11, pm.MAP, ThriftMap(0, 0, ())),
        Field(12, pm.LIST, ThriftList(pm.LIST, (ThriftList(pm.DOUBLE, ()), ThriftList(pm.STRUCT, (inner,))))),
        Field(32767, pm.STRUCT, inner),
        Field(-32768, pm.I64, 2**63 - 1),
    ))
    data = encode_struct(s)
    assert decode_struct(data) == s
    assert encode_struct(decode_struct(data)) == data


def _values(ttype: int) -> st.SearchStrategy[Any]:
    if ttype in (pm.BOOL_TRUE, pm.BOOL_FALSE):
        return st.integers(0, 255)
    if ttype in pm._INT_RANGES:
        lo, hi = pm._INT_RANGES[ttype]
        return st.integers(lo, hi)
    if ttype == pm.DOUBLE:
        return st.binary(min_size=8, max_size=8)
    if ttype == pm.BINARY:
        return st.binary(max_size=20)
    return st.deferred(lambda: _containers(ttype))


_TYPES = st.sampled_from([pm.BOOL_TRUE, pm.I8, pm.I16, pm.I32, pm.I64, pm.DOUBLE, pm.BINARY])
_ALL_TYPES = st.sampled_from(range(1, 13))


def _containers(ttype: int) -> st.SearchStrategy[Any]:
    if ttype == pm.STRUCT:
        return structs
    if ttype in (pm.LIST, pm.SET):
        return _TYPES.flatmap(lambda e: st.builds(ThriftList, st.just(e), st.lists(_values(e), max_size=18).map(tuple)))
    return st.tuples(_TYPES, _TYPES).flatmap(lambda kv: st.builds(
        ThriftMap, st.just(kv[0]), st.just(kv[1]),
        st.lists(st.tuples(_values(kv[0]), _values(kv[1])), min_size=1, max_size=4).map(tuple)))


def _field(field_id: int, ttype: int) -> st.SearchStrategy[Field]:
    if ttype in (pm.BOOL_TRUE, pm.BOOL_FALSE):
        return st.just(Field(field_id, ttype, ttype == pm.BOOL_TRUE))
    return _values(ttype).map(lambda v: Field(field_id, ttype, v))


structs: st.SearchStrategy[Struct] = st.recursive(
    st.just(Struct(())),
    lambda children: st.lists(
        st.tuples(st.integers(-(2**15), 2**15 - 1), _ALL_TYPES), max_size=6,
    ).flatmap(lambda spec: st.tuples(*(
        st.builds(Field, st.just(fid), st.just(t), children) if t == pm.STRUCT
        else st.builds(Field, st.just(fid), st.just(t), st.builds(ThriftList, st.just(pm.STRUCT),
                                                                  st.lists(children, max_size=3).map(tuple)))
        if t in (pm.LIST, pm.SET) and fid % 2
        else _field(fid, t)
        for fid, t in spec
    )).map(Struct)),
    max_leaves=12,
)


@SETTINGS
@given(structs)
def test_codec_round_trips_arbitrary_structs(s: Struct) -> None:
    data = encode_struct(s)
    assert decode_struct(data) == s
    assert encode_struct(decode_struct(data)) == data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_rejects_garbage_with_parquet_merge_error_only(data: bytes) -> None:
    with contextlib.suppress(ParquetMergeError):
        decode_struct(data)
    with contextlib.suppress(ParquetMergeError):
        merge_footers([(data, 4)])


_FOOTER = split_file(write(sample_table(50), row_group_size=20, write_page_index=True)).footer


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_FOOTER) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, len(_FOOTER)))
def test_damaged_real_footers_fail_only_with_parquet_merge_error(flips: list[tuple[int, int]], cut: int) -> None:
    damaged = bytearray(_FOOTER)
    for pos, value in flips:
        damaged[pos] = value
    for candidate in (bytes(damaged), bytes(damaged[:cut])):
        with contextlib.suppress(ParquetMergeError):
            merge_footers([(candidate, 4), (candidate, 1000)])


def test_decoder_limits_nesting() -> None:
    deep = bytes([0x1C]) * 200 + bytes(201)  # field 1 of type struct, 200 levels down
    with pytest.raises(ParquetMergeError, match="nesting deeper"):
        decode_struct(deep)


def test_decoder_rejects_oversized_containers_up_front() -> None:
    with pytest.raises(ParquetMergeError, match="container of 1000000000 elements"):
        decode_struct(bytes([0x19, 0xF5]) + bytes([0x80, 0x94, 0xEB, 0xDC, 0x03]) + b"\x00")


# --- the merge: property ---------------------------------------------------------------------------

MERGE_SCHEMA = pa.schema([
    ("i", pa.int64()),
    ("n", pa.int64()),
    ("f", pa.float64()),
    ("b", pa.bool_()),
    ("s", pa.string()),
    ("bin", pa.binary()),
    ("tags", pa.list_(pa.string())),
])

_rows = st.lists(st.tuples(
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.floats(allow_nan=False),
    st.none() | st.booleans(),
    st.none() | st.text(max_size=8),
    st.none() | st.binary(max_size=8),
    st.none() | st.lists(st.none() | st.text(max_size=4), max_size=3),
), max_size=60)

_write_options = st.fixed_dictionaries({
    "row_group_size": st.integers(1, 40),
    "compression": st.sampled_from(["snappy", "zstd", "none"]),
    "use_dictionary": st.booleans(),
    "write_statistics": st.booleans(),
    "write_page_index": st.booleans(),
})


def _merge_table(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [()] * 6
    return pa.Table.from_arrays([pa.array(range(len(rows)), pa.int64()),
                                 *(pa.array(list(c), t.type) for c, t in zip(columns, list(MERGE_SCHEMA)[1:],
                                                                                strict=True))],
                                schema=MERGE_SCHEMA)


@SETTINGS
@given(rows=_rows, cuts=st.lists(st.integers(0, 60), max_size=4), options=st.data())
def test_merged_file_reads_as_the_concatenation(tmp_path_factory: pytest.TempPathFactory, rows: list[Any],
                                                cuts: list[int], options: st.DataObject) -> None:
    table = _merge_table(rows)
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    pieces = [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)] or [table]
    files = [write(piece, **options.draw(_write_options)) for piece in pieces]

    merged = merge_files(files)

    assert read(merged).equals(table)
    md = metadata(merged)
    originals = [metadata(f) for f in files]
    assert md.num_rows == sum(o.num_rows for o in originals) == len(rows)
    assert md.num_row_groups == sum(o.num_row_groups for o in originals)
    parquet_file = pq.ParquetFile(io.BytesIO(merged))
    groups = [parquet_file.read_row_group(i) for i in range(md.num_row_groups)]
    assert pa.concat_tables(groups).equals(table) if groups else not rows
    assert duckdb_rows(merged, tmp_path_factory.mktemp("duck")) == rows_of(table)


# --- the merge: examples ---------------------------------------------------------------------------


def test_page_indexes_and_bloom_filters_are_dropped_and_filters_still_work(tmp_path: Path) -> None:
    table = sample_table(3000)
    pieces = [table.slice(0, 1000), table.slice(1000, 1000), table.slice(2000)]
    files = [write(p, row_group_size=250, write_page_index=True, bloom_filter_options={"i": True}) for p in pieces]
    assert all(metadata(f).row_group(0).column(0).has_offset_index for f in files)

    merged = merge_files(files)

    for cc in column_chunks(footer_of(merged)):
        assert not {4, 5, 6, 7} & {f.id for f in cc.fields}
        assert not {14, 15} & {f.id for f in field(cc, 3).fields}
    md = metadata(merged)
    for i in range(md.num_row_groups):
        for j in range(md.num_columns):
            column = md.row_group(i).column(j)
            assert not column.has_offset_index and not column.has_column_index
            assert column.bloom_filter_offset is None
            assert column.is_stats_set
    assert read(merged).equals(table)
    path = tmp_path / "merged.parquet"
    path.write_bytes(merged)
    filtered = pq.read_table(path, filters=[("i", ">=", 1200), ("i", "<", 1300)])
    assert filtered.equals(table.slice(1200, 100))
    assert pq.read_table(path, filters=[("s", "=", "text-3")]).num_rows == sum(
        1 for k in range(3000) if k % 4 and k % 11 == 3)
    assert duckdb_rows(merged, tmp_path) == rows_of(table)


def _without_arrow_schema(data: bytes) -> bytes:
    """The file as Spark writes it: its footer's key/value metadata without pyarrow's ARROW:schema."""
    md = footer_of(data)
    fields = []
    for f in md.fields:
        if f.id == 5:
            assert isinstance(f.value, ThriftList)
            kept = tuple(kv for kv in f.value.items if isinstance(kv, Struct) and field(kv, 1) != b"ARROW:schema")
            f = f._replace(value=ThriftList(f.value.elem_type, kept))
        fields.append(f)
    return data[:split_file(data).body_end] + trailer(encode_struct(Struct(tuple(fields))))


@pytest.mark.parametrize("arrow_schema", [True, False])
def test_spark_row_metadata_is_kept(arrow_schema: bool) -> None:
    spark = json.dumps({"type": "struct", "fields": [{"name": "i", "type": "long", "nullable": True,
                                                      "metadata": {"snapshotter.encoding": "number"}}]})
    table = sample_table(100).replace_schema_metadata({SPARK_KEY: spark})
    files = [write(table.slice(0, 40)), write(table.slice(40))]
    if not arrow_schema:
        files = [_without_arrow_schema(f) for f in files]
        assert set(metadata(files[0]).metadata) == {SPARK_KEY}

    merged = merge_files(files)

    schema = pq.read_schema(io.BytesIO(merged))
    assert schema.metadata is not None and schema.metadata[SPARK_KEY] == spark.encode()
    assert (b"ARROW:schema" in metadata(merged).metadata) == arrow_schema
    assert read(merged).equals(table)


def test_bodies_placed_at_arbitrary_offsets_shift_every_offset(tmp_path: Path) -> None:
    table = sample_table(500)
    files = [write(table.slice(0, 200), row_group_size=64), write(table.slice(200), row_group_size=100,
                                                                   use_dictionary=False)]
    splits = [split_file(f) for f in files]
    junk = [os.urandom(1020), os.urandom(333)]
    placed = [4 + len(junk[0])]
    placed.append(placed[0] + splits[0].body_end - 4 + len(junk[1]))
    merged = b"".join([MAGIC, junk[0], files[0][4:splits[0].body_end], junk[1], files[1][4:splits[1].body_end],
                       trailer(merge_footers([(s.footer, p) for s, p in zip(splits, placed, strict=True)]))])

    # The junk is just bytes no offset points at: the file reads like the junk-free one.
    assert read(merged).equals(table)
    assert duckdb_rows(merged, tmp_path) == rows_of(table)
    md = metadata(merged)
    k = 0
    for f, shift in zip(files, [p - 4 for p in placed], strict=True):
        original = metadata(f)
        for i in range(original.num_row_groups):
            for j in range(original.num_columns):
                before, after = original.row_group(i).column(j), md.row_group(k).column(j)
                assert after.data_page_offset == before.data_page_offset + shift
                if before.has_dictionary_page:
                    assert after.dictionary_page_offset == before.dictionary_page_offset + shift
            k += 1
    merged_groups = row_groups(footer_of(merged))
    original_groups = [(rg, p - 4) for f, p in zip(files, placed, strict=True) for rg in row_groups(footer_of(f))]
    assert [field(rg, 5) for rg in merged_groups] == [field(rg, 5) + shift for rg, shift in original_groups]


def test_merge_files_places_bodies_back_to_back() -> None:
    table = sample_table(100)
    files = [write(table.slice(0, 30)), write(table.slice(30, 30)), write(table.slice(60))]
    splits = [split_file(f) for f in files]
    placed, offset = [], 4
    for s in splits:
        placed.append(offset)
        offset += s.body_end - s.body_start
    expected = MAGIC + b"".join(f[4:s.body_end] for f, s in zip(files, splits, strict=True)) + trailer(
        merge_footers([(s.footer, p) for s, p in zip(splits, placed, strict=True)]))
    assert merge_files(files) == expected
    assert merge_files([memoryview(f) for f in files]) == expected


def test_single_input_merges_to_an_equivalent_file() -> None:
    data = write(sample_table(100), row_group_size=30)
    assert merge_files([data]) == data  # no page index to drop, shift 0: the very same bytes


def test_other_fields_pass_through_and_ordinals_are_renumbered() -> None:
    def with_future_field(meta_data: Field) -> Field:
        assert isinstance(meta_data.value, Struct)
        return meta_data._replace(value=Struct((*meta_data.value.fields, Field(99, pm.BINARY, b"future column field"))))

    def with_extras(data: bytes) -> bytes:
        md = footer_of(data)
        groups = []
        for rg in row_groups(md):
            chunks = [Struct(tuple(with_future_field(f) if f.id == 3 else f for f in cc.fields))
                      for cc in field(rg, 1).items if isinstance(cc, Struct)]
            groups.append(Struct((Field(1, pm.LIST, ThriftList(pm.STRUCT, tuple(chunks))), *rg.fields[1:],
                                  Field(7, pm.I16, 5), Field(40, pm.I32, 7))))
        fields = [f._replace(value=ThriftList(pm.STRUCT, tuple(groups))) if f.id == 4 else f for f in md.fields]
        footer = encode_struct(Struct((*fields, Field(100, pm.MAP, ThriftMap(pm.I32, pm.BINARY, ((1, b"x"),))))))
        return data[:split_file(data).body_end] + trailer(footer)

    table = sample_table(200)
    merged = merge_files([with_extras(write(table.slice(0, 120), row_group_size=50)),
                          with_extras(write(table.slice(120), row_group_size=50))])

    md = footer_of(merged)
    groups = row_groups(md)
    assert [field(rg, 7) for rg in groups] == list(range(5))
    assert all(field(rg, 40) == 7 for rg in groups)
    assert all(field(field(cc, 3), 99) == b"future column field" for cc in column_chunks(md))
    assert field(md, 100) == ThriftMap(pm.I32, pm.BINARY, ((1, b"x"),))
    assert read(merged).equals(table)


def test_metadata_comes_from_the_first_input() -> None:
    table = sample_table(50)
    first = write(table.slice(0, 20).replace_schema_metadata({"who": "first"}))
    second = write(table.slice(20).replace_schema_metadata({"who": "second"}))
    merged = merge_files([first, second])
    assert metadata(merged).metadata[b"who"] == b"first"
    assert metadata(merged).created_by == metadata(first).created_by


# --- errors ---------------------------------------------------------------------------------------


def _one() -> bytes:
    return write(sample_table(20))


def test_no_inputs() -> None:
    with pytest.raises(ParquetMergeError, match="no inputs"):
        merge_footers([])
    with pytest.raises(ParquetMergeError, match="no inputs"):
        merge_files([])


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: b"PAR2" + d[4:], r"starts with b'PAR2'"),
    (lambda d: d[:-1], "ends with"),
    (lambda d: d[: len(d) // 2], "ends with"),
    (lambda d: d[:11], "shorter than the 12-byte minimum"),
    (lambda d: b"", "shorter than"),
    (lambda d: d[:-8] + (len(d) - 11).to_bytes(4, "little") + MAGIC, "footer length .* out of range"),
    (lambda d: d[:-8] + (2**32 - 1).to_bytes(4, "little") + MAGIC, "footer length .* out of range"),
    (lambda d: d[:-8] + bytes(4) + MAGIC, "footer length 0 out of range"),
    (lambda d: d[:-4] + b"PARE", "encrypted parquet footer"),
    (lambda d: b"PARE" + d[4:-4] + b"PARE", r"encrypted parquet footer \(PARE\) is not supported"),
])
def test_malformed_files(damage: Any, message: str) -> None:
    with pytest.raises(ParquetMergeError, match=message):
        split_file(damage(_one()))
    with pytest.raises(ParquetMergeError, match=f"input 1: .*{message}"):
        merge_files([_one(), damage(_one())])


def test_smallest_possible_split() -> None:
    data = MAGIC + b"\x00" + (1).to_bytes(4, "little") + MAGIC
    assert split_file(data) == pm.SplitFile(body_start=4, body_end=4, footer=b"\x00")


def test_garbage_footer_bytes() -> None:
    data = _one()
    s = split_file(data)
    garbage = bytes((k * 37 + 11) % 256 for k in range(len(s.footer)))
    with pytest.raises(ParquetMergeError, match="input 0: footer does not decode as Thrift compact protocol"):
        merge_files([data[:s.body_end] + trailer(garbage)])
    with pytest.raises(ParquetMergeError, match="trailing bytes"):
        merge_footers([(s.footer + b"\x00", 4)])
    with pytest.raises(ParquetMergeError, match="unexpected end of data"):
        merge_footers([(s.footer[:-1], 4)])
    with pytest.raises(ParquetMergeError, match="lacks schema, num_rows or row_groups"):
        merge_footers([(b"\x15\x04\x00", 4)])


@pytest.mark.parametrize(("other", "message"), [
    (pa.table({"x": pa.array([1], pa.int64())}), r"input 1: schema differs from input 0's: schema element 1 "
                                                   r"is named 'a' in input 0 and 'x' in this input"),
    (pa.table({"a": pa.array([1], pa.int32())}), r"input 1: schema differs .*element 1 \('a'\) differs in type"),
    (pa.table({"a": pa.array([1], pa.int64()), "b": pa.array([1])}), "2 schema elements in input 0, 3 in"),
])
def test_differing_schemas(other: pa.Table, message: str) -> None:
    first = write(pa.table({"a": pa.array([1, 2], pa.int64())}))
    with pytest.raises(ParquetMergeError, match=message):
        merge_files([first, write(other)])


def test_nullability_is_part_of_the_schema() -> None:
    nullable = write(pa.table({"a": pa.array([1], pa.int64())}))
    required = write(pa.Table.from_arrays([pa.array([1], pa.int64())],
                                          schema=pa.schema([pa.field("a", pa.int64(), nullable=False)])))
    with pytest.raises(ParquetMergeError, match="schema element 1 \\('a'\\)"):
        merge_files([nullable, required])


def _footer_with(extra: Sequence[Field] = (), column_extra: Sequence[Field] = ()) -> bytes:
    md = footer_of(_one())
    groups = [Struct((Field(1, pm.LIST, ThriftList(pm.STRUCT, tuple(
        Struct((*column_extra, *cc.fields)) for cc in field(rg, 1).items if isinstance(cc, Struct)))),
        *rg.fields[1:])) for rg in row_groups(md)]
    fields = [f._replace(value=ThriftList(pm.STRUCT, tuple(groups))) if f.id == 4 else f for f in md.fields]
    return encode_struct(Struct((*fields, *extra)))


def test_encrypted_files_are_refused() -> None:
    algorithm = Field(8, pm.STRUCT, Struct((Field(1, pm.STRUCT, Struct(())),)))
    with pytest.raises(ParquetMergeError, match="input 0: encrypted parquet files are not supported"):
        merge_footers([(_footer_with([algorithm]), 4)])
    with pytest.raises(ParquetMergeError, match="encrypted parquet files are not supported"):
        merge_footers([(_footer_with([Field(9, pm.BINARY, b"key")]), 4)])
    with pytest.raises(ParquetMergeError, match="encrypted column chunks"):
        merge_footers([(_footer_with(column_extra=[Field(8, pm.STRUCT, Struct(()))]), 4)])


class IdentityKms(pe.KmsClient):  # type: ignore[misc]  # pyarrow is untyped here
    """A test KMS: keys are "wrapped" as themselves."""

    def __init__(self, _config: Any) -> None:
        pe.KmsClient.__init__(self)

    def wrap_key(self, key_bytes: bytes, master_key_identifier: str) -> bytes:
        return base64.b64encode(key_bytes)

    def unwrap_key(self, wrapped_key: bytes, master_key_identifier: str) -> bytes:
        return base64.b64decode(wrapped_key)


@pytest.mark.parametrize("plaintext_footer", [False, True])
def test_files_pyarrow_encrypted_are_refused(plaintext_footer: bool) -> None:
    config = pe.EncryptionConfiguration(footer_key="footer", column_keys={"column": ["i"]},
                                        plaintext_footer=plaintext_footer, double_wrapping=False)
    properties = pe.CryptoFactory(IdentityKms).file_encryption_properties(pe.KmsConnectionConfig(), config)
    encrypted = write(sample_table(10), encryption_properties=properties)
    with pytest.raises(ParquetMergeError, match="input 1: encrypted parquet"):
        merge_files([_one(), encrypted])


def test_column_chunks_in_other_files_are_refused() -> None:
    with pytest.raises(ParquetMergeError, match="lives in another file"):
        merge_footers([(_footer_with(column_extra=[Field(1, pm.BINARY, b"part-0.parquet")]), 4)])
    merge_footers([(_footer_with(column_extra=[Field(1, pm.BINARY, b"")]), 4)])


def test_wrongly_typed_known_fields_are_refused() -> None:
    md = footer_of(_one())
    fields = [f._replace(type=pm.I32) if f.id == 3 else f for f in md.fields]
    with pytest.raises(ParquetMergeError, match="field 3 has type i32, expected i64"):
        merge_footers([(encode_struct(Struct(tuple(fields))), 4)])


def test_placed_offset_inside_the_magic_is_refused() -> None:
    with pytest.raises(ParquetMergeError, match="placed at offset 3"):
        merge_footers([(split_file(_one()).footer, 3)])
