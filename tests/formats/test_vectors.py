"""The spec's test vectors (archive-format.md sections 4 and 5), byte for byte, in both directions,
plus the Go encoding rules and format limits the vectors stand for, and the concrete layout of this
project's parquet format.

A consumer may compare laredo's bytes with ours, so "equivalent JSON" is not good enough here:
every assertion is on exact bytes.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.errors import CorruptArtifact, EncodeError
from snapshot_assets.archive.formats.jsonl import MAX_LINE_BYTES, JsonlFormat
from snapshot_assets.archive.formats.parquet import ParquetFormat
from snapshot_assets.archive.formats.protobuf import ProtobufFormat

JSONL = JsonlFormat()
PROTOBUF = ProtobufFormat()


def snapshot_bytes(fmt: Any, rows: list[Row]) -> bytes:
    out = io.BytesIO()
    writer = fmt.snapshot_writer(out)
    for row in rows:
        writer.write(row)
    writer.close()
    return out.getvalue()


def diff_bytes(fmt: Any, changes: list[Change]) -> bytes:
    out = io.BytesIO()
    writer = fmt.diff_writer(out)
    for change in changes:
        writer.write(change)
    writer.close()
    return out.getvalue()


# --- section 4: jsonl vectors -----------------------------------------------------------------

JSONL_SNAPSHOT_VECTORS = {
    "laredo_formattest_row": (
        {"id": "1", "name": "alice", "score": 42.0, "active": True},
        b'{"active":true,"id":"1","name":"alice","score":42}\n',
    ),
    "float_forms_and_big_int": (
        {"id": 1000000, "f": 1e21, "g": 1e-7, "h": 0.000001, "i": 9007199254740993},
        b'{"f":1e+21,"g":1e-7,"h":0.000001,"i":9007199254740993,"id":1000000}\n',
    ),
    "html_and_line_separator_escapes": (
        {"html": "<a>&b</a>", "uni": "é\u2028"},
        '{"html":"\\u003ca\\u003e\\u0026b\\u003c/a\\u003e","uni":"é\\u2028"}\n'.encode(),
    ),
}


@pytest.mark.parametrize("name", sorted(JSONL_SNAPSHOT_VECTORS))
def test_jsonl_snapshot_vector(name: str) -> None:
    row, expected = JSONL_SNAPSHOT_VECTORS[name]
    assert snapshot_bytes(JSONL, [row]) == expected


def test_jsonl_vectors_read_back() -> None:
    data = b"".join(expected for _, expected in JSONL_SNAPSHOT_VECTORS.values())
    got = list(JSONL.read_snapshot(io.BytesIO(data)))
    assert got == [
        {"active": True, "id": "1", "name": "alice", "score": 42},
        {"f": 1e21, "g": 1e-7, "h": 1e-6, "i": 9007199254740993, "id": 1000000},
        {"html": "<a>&b</a>", "uni": "é\u2028"},
    ]
    assert type(got[1]["i"]) is int and got[1]["i"] == 2**53 + 1  # exact, not rounded to a double


def test_jsonl_diff_vector_delete() -> None:
    change = Change(Action.DELETE, "2", old={"id": "2", "name": "bob"})
    expected = b'{"action":"DELETE","key":"2","old":{"id":"2","name":"bob"}}\n'
    assert diff_bytes(JSONL, [change]) == expected
    assert list(JSONL.read_diff(io.BytesIO(expected))) == [change]


def test_jsonl_diff_keys_in_go_map_order_and_empty_images_omitted() -> None:
    changes = [
        Change(Action.UPDATE, "1", old={"id": "1", "name": "alice"}, new={"id": "1", "name": "alice2"}),
        Change(Action.INSERT, "3", old={}, new={"id": "3"}),
        Change(Action.TRUNCATE),
    ]
    assert diff_bytes(JSONL, changes) == (
        b'{"action":"UPDATE","key":"1","new":{"id":"1","name":"alice2"},"old":{"id":"1","name":"alice"}}\n'
        b'{"action":"INSERT","key":"3","new":{"id":"3"}}\n'
        b'{"action":"TRUNCATE","key":""}\n'
    )


# --- section 5: protobuf vectors --------------------------------------------------------------

PROTOBUF_SNAPSHOT_ROW = bytes.fromhex("0d 0a 0b 0a 09 0a 02 69 64 12 03 1a 01 31")
PROTOBUF_DIFF_DELETE = bytes.fromhex("18 0a 06 44 45 4c 45 54 45 12 01 32 1a 0b 0a 09 0a 02 69 64 12 03 1a 01 32")


def test_protobuf_snapshot_row_vector() -> None:
    assert snapshot_bytes(PROTOBUF, [{"id": "1"}]) == PROTOBUF_SNAPSHOT_ROW
    assert list(PROTOBUF.read_snapshot(io.BytesIO(PROTOBUF_SNAPSHOT_ROW))) == [{"id": "1"}]


def test_protobuf_diff_delete_vector() -> None:
    change = Change(Action.DELETE, "2", old={"id": "2"})
    assert diff_bytes(PROTOBUF, [change]) == PROTOBUF_DIFF_DELETE
    assert list(PROTOBUF.read_diff(io.BytesIO(PROTOBUF_DIFF_DELETE))) == [change]


def test_protobuf_artifact_is_plain_concatenation_of_frames() -> None:
    assert snapshot_bytes(PROTOBUF, [{"id": "1"}, {"id": "1"}]) == PROTOBUF_SNAPSHOT_ROW * 2
    assert snapshot_bytes(PROTOBUF, []) == b""


def test_protobuf_is_deterministic_whatever_the_dict_order() -> None:
    assert snapshot_bytes(PROTOBUF, [{"b": 1, "a": 2}]) == snapshot_bytes(PROTOBUF, [{"a": 2, "b": 1}])


def test_protobuf_integers_beyond_2_53_are_exact_decimal_strings() -> None:
    rows = [{"id": 1, "safe": 2**53, "big": 2**53 + 1, "neg": -(2**64), "f": 2.5, "whole": 3.0}]
    got = list(PROTOBUF.read_snapshot(io.BytesIO(snapshot_bytes(PROTOBUF, rows))))
    assert got == [{"id": 1, "safe": 2**53, "big": str(2**53 + 1), "neg": str(-(2**64)), "f": 2.5, "whole": 3}]
    assert type(got[0]["id"]) is int and type(got[0]["whole"]) is int


def test_protobuf_unknown_action_is_corrupt() -> None:
    data = diff_bytes(PROTOBUF, [Change(Action.DELETE, "2", old={"id": "2"})]).replace(b"DELETE", b"DELETX")
    with pytest.raises(CorruptArtifact, match="DELETX"):
        list(PROTOBUF.read_diff(io.BytesIO(data)))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (PROTOBUF_SNAPSHOT_ROW[:-1], "truncated"),
        (b"\x80", "truncated inside a length prefix"),
        (b"\xff" * 11, "over-long length prefix"),
        (b"\xff\xff\xff\xff\x0f", "exceeds 2 GiB"),
        (b"\x02\xff\xff", "not a SnapshotRow"),
    ],
    ids=["short-message", "short-prefix", "long-prefix", "huge-length", "garbage-message"],
)
def test_protobuf_damage_is_corrupt(data: bytes, match: str) -> None:
    with pytest.raises(CorruptArtifact, match=match):
        list(PROTOBUF.read_snapshot(io.BytesIO(data)))


# --- Go encoding/json rules behind the vectors ---------------------------------------------------

GO_ENCODINGS: dict[str, tuple[Any, str]] = {
    "short_escapes": ("\n\r\t\b\f\"\\", '"\\n\\r\\t\\b\\f\\"\\\\"'),
    "control_chars_lowercase_hex": ("\x00\x1f\x0b", '"\\u0000\\u001f\\u000b"'),
    "del_and_non_ascii_raw": ("\x7f€😀", '"\x7f€😀"'),
    "paragraph_separator": ("\u2029", '"\\u2029"'),
    "lone_surrogate_as_go_replacement_escape": ("a\udcffb", '"a\\ufffdb"'),
    "real_replacement_char_raw": ("\ufffd", '"\ufffd"'),
    "negative_zero": (-0.0, "-0"),
    "float_fixed_below_1e21": (1e20, "100000000000000000000"),
    "float_small_exponent": (1.5e-7, "1.5e-7"),
    "float_large_exponent": (1.5e300, "1.5e+300"),
    "huge_int_exact": (10**5000, "1" + "0" * 5000),
    "bytes_base64": (b"\x00\xffhi", '"AP9oaQ=="'),
    "empty_bytes": (b"", '""'),
    "utc_datetime_trims_fraction": (dt.datetime(2026, 6, 3, 21, 40, 0, 120000, tzinfo=dt.UTC),
                                    '"2026-06-03T21:40:00.12Z"'),
    "naive_datetime_is_utc": (dt.datetime(2026, 6, 3, 21, 40), '"2026-06-03T21:40:00Z"'),
    "offset_datetime": (dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(-dt.timedelta(hours=5, minutes=30))),
                        '"2026-01-02T03:04:05.000006-05:30"'),
    "date": (dt.date(2026, 6, 3), '"2026-06-03"'),
    "decimal_text": (Decimal("1.10"), "1.10"),
    "decimal_exponent": (Decimal("1E+3"), "1E+3"),
    "nested_sorted": ({"b": [1, {"d": None, "c": True}], "a": ()}, '{"a":[],"b":[1,{"c":true,"d":null}]}'),
    "keys_sorted_by_utf8_bytes": ({"é": 1, "z": 2, "Z": 3, "": 4}, '{"":4,"Z":3,"z":2,"é":1}'),
    "escaped_keys": ({"<k>": 1}, '{"\\u003ck\\u003e":1}'),
}


@pytest.mark.parametrize("name", sorted(GO_ENCODINGS))
def test_go_encoding(name: str) -> None:
    value, expected = GO_ENCODINGS[name]
    assert gojson.dumps(value) == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), Decimal("NaN"), Decimal("-Inf")],
                         ids=repr)
def test_go_refuses_non_finite(value: Any) -> None:
    with pytest.raises(EncodeError, match="not encodable"):
        gojson.dumps(value)


def test_go_refuses_unknown_types_and_non_string_keys() -> None:
    with pytest.raises(EncodeError, match=r"unsupported value type builtins\.object"):
        gojson.dumps(object())
    with pytest.raises(EncodeError, match="keys must be strings"):
        gojson.dumps({1: "a"})


def test_marshal_indent_matches_go() -> None:
    value = {"b": [1, {}], "a": {"x": "y,:{"}, "c": []}
    assert gojson.marshal_indent(value) == (
        b'{\n  "b": [\n    1,\n    {}\n  ],\n  "a": {\n    "x": "y,:{"\n  },\n  "c": []\n}'
    )
    assert gojson.marshal(value) == b'{"a":{"x":"y,:{"},"b":[1,{}],"c":[]}'
    assert gojson.marshal(value, sort_keys=False) == b'{"b":[1,{}],"a":{"x":"y,:{"},"c":[]}'


def test_loads_keeps_integers_exact_and_refuses_what_go_never_writes() -> None:
    assert gojson.loads(b'{"a":9007199254740993,"b":1.5,"c":-0}') == {"a": 2**53 + 1, "b": 1.5, "c": 0}
    assert gojson.loads("1" * 5000) == (10**5000 - 1) // 9  # beyond int()'s default 4300-digit limit
    for text in ("NaN", "[Infinity]", '{"a":-Infinity}', "1e400"):
        with pytest.raises(CorruptArtifact):
            gojson.loads(text)
    with pytest.raises(CorruptArtifact, match="UTF-8"):
        gojson.loads(b'"\xff"')


def test_go_encoding_agrees_with_python_json_where_they_overlap() -> None:
    value = {"k<>&": ["\u2028\u2029", "\x01\n", 1, None, True, {"z": 0, "a": -1}]}
    python = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        python = python.replace(raw, escaped)
    assert gojson.dumps(value) == python


# --- jsonl line rules ------------------------------------------------------------------------


def test_jsonl_reader_skips_blank_lines_and_accepts_crlf() -> None:
    data = b'{"id":1}\r\n\n{"id":2}\n\n'
    assert list(JSONL.read_snapshot(io.BytesIO(data))) == [{"id": 1}, {"id": 2}]


def test_jsonl_last_line_without_newline() -> None:
    assert list(JSONL.read_snapshot(io.BytesIO(b'{"id":1}\n{"id":2}'))) == [{"id": 1}, {"id": 2}]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"id":1}\n{"id":\n', "line 2"),
        (b'{"id":1}\n\n[1,2]\n', "line 3: expected a JSON object"),
        (b'{"id":NaN}\n', "line 1: NaN"),
        (b'\xef\xbb\xbf{"id":1}\n', "line 1"),
    ],
    ids=["truncated", "not-an-object", "nan", "bom"],
)
def test_jsonl_malformed_line_names_its_number(data: bytes, match: str) -> None:
    with pytest.raises(CorruptArtifact, match=match):
        list(JSONL.read_snapshot(io.BytesIO(data)))


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b'{"action":"UPSERT","key":"1"}', "unknown change action 'UPSERT'"),
        (b'{"key":"1"}', "'action' must be a string"),
        (b'{"action":"DELETE","key":1}', "'key' must be a string"),
        (b'{"action":"INSERT","key":"1","new":[1]}', "'new' must be an object"),
    ],
)
def test_jsonl_bad_change_is_corrupt(line: bytes, match: str) -> None:
    with pytest.raises(CorruptArtifact, match=match):
        list(JSONL.read_diff(io.BytesIO(line + b"\n")))


def test_jsonl_line_limit_is_16_mib_with_the_newline() -> None:
    overhead = len(b'{"id":1,"pad":""}\n')
    fits = {"id": 1, "pad": "x" * (MAX_LINE_BYTES - overhead)}
    data = snapshot_bytes(JSONL, [fits])
    assert len(data) == MAX_LINE_BYTES
    assert list(JSONL.read_snapshot(io.BytesIO(data))) == [fits]
    with pytest.raises(EncodeError, match="16 MiB") as caught:
        snapshot_bytes(JSONL, [{"id": 1, "pad": "x" * (MAX_LINE_BYTES - overhead + 1)}])
    assert caught.value.row_key == "1"
    with pytest.raises(CorruptArtifact, match="line 2 is longer than"):
        list(JSONL.read_snapshot(io.BytesIO(b"{}\n" + b" " * MAX_LINE_BYTES + b"\n")))


# --- parquet: this project's layout ----------------------------------------------------------

PARQUET = ParquetFormat()


def parquet_bytes(rows: Any) -> bytes:
    return snapshot_bytes(PARQUET, rows)


def test_parquet_columns_are_typed_by_their_values() -> None:
    when = dt.datetime(2026, 6, 3, 21, 40, 0, 123456, tzinfo=dt.UTC)
    row = {"i": 1, "f": 0.5, "s": "x", "b": True, "raw": b"\x00", "t": when, "d": dt.date(2026, 6, 3),
           "dec": Decimal("1.10"), "obj": {"a": [1]}, "big": 2**63, "mixed": 1, "nothing": None}
    other = {**row, "mixed": "one"}
    data = parquet_bytes([row, other])
    schema = pq.read_schema(io.BytesIO(data))
    assert {f.name: str(f.type) for f in schema} == {
        "i": "int64", "f": "double", "s": "string", "b": "bool", "raw": "binary", "t": "timestamp[us, tz=UTC]",
        "d": "date32[day]", "dec": "string", "obj": "string", "big": "string", "mixed": "string", "nothing": "null",
    }
    encodings = {f.name: (f.metadata or {}).get(b"snapshotter.encoding") for f in schema}
    assert encodings["dec"] == b"decimal" and encodings["i"] is None
    assert encodings["obj"] == encodings["big"] == encodings["mixed"] == b"json"
    assert list(PARQUET.read_snapshot(io.BytesIO(data))) == [row, other]


def test_parquet_is_plain_parquet_for_other_readers() -> None:
    table = pq.read_table(io.BytesIO(parquet_bytes({"id": i, "v": i * 1.5} for i in range(10))))
    assert table.column("id").to_pylist() == list(range(10))
    assert pc.sum(table.column("v")).as_py() == 67.5


def test_parquet_types_a_column_from_every_row_not_the_first_batch() -> None:
    late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [{"id": i, "deleted_at": None if i < 20_000 else late} for i in range(20_001)]
    data = parquet_bytes(rows)
    assert str(pq.read_schema(io.BytesIO(data)).field("deleted_at").type) == "timestamp[us, tz=UTC]"
    assert list(PARQUET.read_snapshot(io.BytesIO(data)))[-1] == {"id": 20_000, "deleted_at": late}


def test_parquet_records_absent_columns_only_when_some_row_lacks_one() -> None:
    assert "__snapshotter_absent__" not in pq.read_schema(io.BytesIO(parquet_bytes([{"id": 1}, {"id": 2}]))).names
    uneven = [{"id": 1}, {"id": 2, "note": None}]
    data = parquet_bytes(uneven)
    assert "__snapshotter_absent__" in pq.read_schema(io.BytesIO(data)).names
    assert list(PARQUET.read_snapshot(io.BytesIO(data))) == uneven


def test_parquet_refuses_the_reserved_column_name() -> None:
    with pytest.raises(EncodeError, match="reserved"):
        parquet_bytes([{"id": 1, "__snapshotter_absent__": None}])


def test_parquet_diff_layout() -> None:
    changes = [Change(Action.INSERT, "3", new={"id": 3, "name": "c"}), Change(Action.DELETE, "2", old={"id": 2})]
    schema = pq.read_schema(io.BytesIO(diff_bytes(PARQUET, changes)))
    assert schema.names == ["action", "key", "old", "new"]
    assert schema.field("old").type == schema.field("new").type
    assert [f.name for f in schema.field("new").type] == ["id", "name", "__snapshotter_absent__"]


def test_parquet_snapshot_and_diff_are_not_interchangeable() -> None:
    with pytest.raises(CorruptArtifact, match="holds a snapshot, not a diff"):
        list(PARQUET.read_diff(io.BytesIO(parquet_bytes([{"id": 1}]))))


def test_parquet_many_row_groups() -> None:
    data = parquet_bytes({"id": i} for i in range(70_000))
    assert pq.ParquetFile(io.BytesIO(data)).metadata.num_row_groups == 2
    assert sum(row["id"] for row in PARQUET.read_snapshot(io.BytesIO(data))) == 70_000 * 69_999 // 2
