"""Column-wise encoding of rows kept as PostgreSQL text is the typed path, byte for byte.

The oracle is the typed path: `gojson.encode_value(converter(text))` for one value and
`gojson.encode_row(codec.image(texts))` for a row. The texts are generated the way PostgreSQL
prints each type under the source's session settings (shortest floats, ISO timestamps in UTC),
including the values the kernels must hand back to the typed path (escapes, exponents, BC dates,
NaN, years past 9999, integers beyond 2^53).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from resources.buffer.segments import encode_snapshot_row, encode_text_snapshot_row, record_batch, with_images
from resources.subscribers import pgtypes
from resources.subscribers.text_columns import encode_column, encode_copies, encode_images
from resources.subscribers.text_rows import RowCodec, TextSnapshotRow
from snapshot_assets.archive import gojson
from snapshot_assets.archive.errors import EncodeError
from snapshot_assets.archive.formats.protobuf import snapshot_record
from tests.buffer.pg_texts import SPEC_TEXTS, TEXT


def _typed(spec: str, texts: list[str | None]) -> list[str]:
    convert = pgtypes.converter_of(spec)
    return ["null" if text is None else gojson.encode_value(convert(text)) for text in texts]


@pytest.mark.parametrize("spec", sorted(SPEC_TEXTS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_column_is_encoded_as_the_typed_path_encodes_each_value(spec: str, data: Any) -> None:
    texts = data.draw(st.lists(st.none() | SPEC_TEXTS[spec], max_size=20))
    assert encode_column(pa.array(texts, pa.string()), spec).to_pylist() == _typed(spec, texts)


_NAMES = st.lists(st.one_of(TEXT.filter(bool), st.sampled_from(["id", "a<b", 'q"', "é", "Z"])),
                  min_size=1, max_size=6, unique=True)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_batch_of_rows_is_encoded_as_the_typed_path_encodes_each_row(data: Any) -> None:
    names = data.draw(_NAMES)
    specs = data.draw(st.lists(st.sampled_from(sorted(SPEC_TEXTS)), min_size=len(names), max_size=len(names)))
    codec = RowCodec(tuple(names), tuple(specs), (names[0],))
    rows = data.draw(st.lists(st.tuples(*(st.none() | SPEC_TEXTS[s] for s in specs)), min_size=1, max_size=12))
    keys = [f"[{i}]" for i in range(len(rows))]
    encoded, records, _ = encode_copies(codec, pa.array([list(r) for r in rows], pa.list_(pa.string())),
                                        pa.array(keys), records=True)
    assert encoded.to_pylist() == [gojson.encode_row(codec.image(r), lambda: "") for r in rows]
    # the protobuf records: what the state's per-row path makes of that very text
    assert records is not None
    assert records.to_pylist() == [snapshot_record(gojson.loads(text), ()) for text in encoded.to_pylist()]


def test_a_value_no_format_holds_is_refused_by_column_and_row_key_as_the_typed_path_refuses_it() -> None:
    codec = RowCodec(("id", "j", "t"), ("int", "json", "text"), ("id",))
    images = pa.array([["1", "{}", "a"], ["7", '{"x": 1e400}', "b"]], pa.list_(pa.string()))
    with pytest.raises(EncodeError) as refused:
        encode_images(codec, images, pa.array(["[1]", "[7]"]))
    assert refused.value.column == "j" and refused.value.row_key == "[7]"


def test_copied_rows_of_two_table_shapes_in_one_batch_get_their_own_images() -> None:
    before = RowCodec(("id", "v"), ("int", "text"), ("id",))
    after = RowCodec(("id", "v", "w"), ("int", "int", "bool"), ("id",))
    rows = [TextSnapshotRow(before, ("1", "x")), TextSnapshotRow(after, ("2", "5", "t")),
            TextSnapshotRow(before, ("3", None))]
    batch = record_batch([encode_text_snapshot_row(r, i, "0/1", lambda: "") for i, r in enumerate(rows, 1)])
    assert with_images(batch).column("new").to_pylist() == \
        ['{"id":1,"v":"x"}', '{"id":2,"v":5,"w":true}', '{"id":3,"v":null}']
    read = with_images(batch, records=True)
    texts = read.column("new").to_pylist()
    assert read.column("pb").to_pylist() == [snapshot_record(gojson.loads(t), ()) for t in texts]


def test_only_copied_rows_get_records_beside_their_images() -> None:
    codec = RowCodec(("id", "v"), ("int", "text"), ("id",))
    copied = encode_text_snapshot_row(TextSnapshotRow(codec, ("1", "x")), 1, "0/1", lambda: "")
    typed = encode_snapshot_row({"id": 2, "v": "y"}, 2, ("id",), "0/1", "")
    read = with_images(record_batch([copied, typed]), records=True)
    assert read.column("pb").to_pylist() == [snapshot_record({"id": 1, "v": "x"}, ()), None]
    assert with_images(record_batch([typed]), records=True).column("pb").to_pylist() == [None]


def test_an_integer_text_postgresql_would_not_print_goes_through_the_typed_path() -> None:
    assert encode_column(pa.array(["0", "-5", "007", None], pa.string()), "int").to_pylist() == \
        ["0", "-5", "7", "null"]
    with pytest.raises(ValueError):
        encode_column(pa.array(["12", "x"], pa.string()), "int")


_PLAIN_NUMBER = st.one_of(st.integers(), st.integers(-10**6, 10**6).map(float),
                          st.floats(min_value=1e-3, max_value=1e15).filter(lambda x: not x.is_integer()))
_NO_NUL = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)  # as jsonb
_DOCUMENT = st.recursive(st.none() | st.booleans() | _PLAIN_NUMBER | _NO_NUL |
                         st.sampled_from(["<a href='x?y&z'>", "\u2028\u2029", "\x1f\x7f", "😀"]),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NO_NUL, inner, max_size=3),
                         max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(st.lists(_DOCUMENT, max_size=30), st.booleans())
def test_json_documents_are_encoded_all_at_once_as_the_typed_path_encodes_each(values: list[Any], jsonb: bool) -> None:
    """Documents as PostgreSQL prints them (jsonb's `, `/`: ` spacing, or json's text as written):
    the one-pass encoding is the typed path's, and it is taken for every such batch."""
    texts = [json.dumps(v, ensure_ascii=not jsonb, separators=(", ", ": ") if jsonb else (",", ":")) for v in values]
    # `\u0000` is the one-pass encoding's separator: a document spelling it goes one by one (tested below)
    assume(not any("\\u0000" in text for text in texts))
    assert gojson.encode_documents(texts) == _typed("json", texts)


@pytest.mark.parametrize("spec", ["json", "float"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_column_of_repeated_values_is_encoded_as_the_typed_path_encodes_each(spec: str, data: Any) -> None:
    """The typed path runs once per distinct value and the results are spread back: each row still
    gets its own value's encoding, NULLs stay `null`."""
    distinct = data.draw(st.lists(SPEC_TEXTS[spec], min_size=1, max_size=4, unique=True))
    texts = data.draw(st.lists(st.none() | st.sampled_from(distinct), min_size=1, max_size=30))
    assert encode_column(pa.array(texts, pa.string()), spec).to_pylist() == _typed(spec, texts)


def test_a_refused_value_that_repeats_is_still_refused() -> None:
    with pytest.raises(gojson.UnsupportedValue):
        encode_column(pa.array(["1e400", '{"a": 1}', "1e400"], pa.string()), "json")


@settings(max_examples=200, deadline=None)
@given(st.lists(SPEC_TEXTS["json"] | st.sampled_from(['"\\u0000"', '["\\ud800"]', '1e-7', '-0.0', '1e400', "1" * 5000,
                                                       "[" * 2000 + "]" * 2000]), max_size=12))
def test_documents_the_c_encoder_cannot_spell_go_one_by_one(texts: list[str]) -> None:
    """NUL characters, lone surrogates, exponent forms Go spells otherwise, overflowing or overlong
    numbers, deep nesting: `encode_documents` declines the batch (None) or gives the typed path's bytes."""
    got = gojson.encode_documents(texts)
    try:
        expected = [gojson.encode_value(json.loads(t)) for t in texts]
    except (gojson.UnsupportedValue, ValueError, RecursionError) as refused:  # 1e400, 5,000 digits, deep nesting
        assert got is None  # the typed path refuses the batch, and so does the column
        with pytest.raises(type(refused)):
            encode_column(pa.array(texts, pa.string()), "json")
        return
    assert got is None or got == expected
    assert encode_column(pa.array(texts, pa.string()), "json").to_pylist() == expected
