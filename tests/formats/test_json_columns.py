"""JSON row texts split into column tokens give the per-row encoder's protobuf records, exactly.

The oracle is the archive's own path for a row that enters as JSON: `snapshot_record` of the decoded
row. Rows are drawn as the Go-JSON encoder writes them: names and strings with escapes and non-ASCII,
integers of any size, floats, nested arrays and objects (deeper than the split accepts, too), rows
whose names differ from the first row's, and values that hold a later column's separator.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive import gojson
from snapshot_assets.archive.formats.json_columns import snapshot_records_of_texts, split_rows
from snapshot_assets.archive.formats.protobuf import snapshot_record
from snapshot_assets.spark.effects import decode_row

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | _TEXT
            | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(['","b":', ',"b":1', "}", "]"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                       max_leaves=8)


def _text(row: dict[str, Any]) -> str:
    return gojson.encode_row(row, lambda: "")


def _oracle(texts: list[str]) -> list[bytes]:
    return [snapshot_record(decode_row(t) or {}, ("id",)) for t in texts]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_records_of_json_rows_are_the_per_row_records(data: Any) -> None:
    names = data.draw(st.lists(st.sampled_from(["a", "b", "id", "é", 'q"uote', "<&>", "z"]) | _TEXT, min_size=1,
                               max_size=5, unique=True))
    rows = data.draw(st.lists(st.fixed_dictionaries({n: _VALUES for n in names}) | st.dictionaries(_TEXT, _VALUES,
                                                                                                  max_size=3),
                              min_size=1, max_size=12))
    texts = [_text(r) for r in rows]
    assert snapshot_records_of_texts(pa.array(texts, pa.string()), ("id",), decode_row).to_pylist() == _oracle(texts)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_rows_of_one_shape_are_all_split(data: Any) -> None:
    names = data.draw(st.lists(_TEXT, min_size=1, max_size=5, unique=True))
    shallow = _SCALARS | st.lists(_SCALARS, max_size=3) | st.dictionaries(_TEXT, st.lists(_SCALARS, max_size=2))
    rows = data.draw(st.lists(st.fixed_dictionaries({n: shallow for n in names}), min_size=1, max_size=12))
    split = split_rows(pa.array([_text(r) for r in rows], pa.string()))
    assert split is not None and list(split.rows) == list(range(len(rows)))
    assert [c.to_pylist() for c in split.columns] == [[gojson.encode_value(r[n]) for r in rows]
                                                        for n in split.names]


def test_table_shaped_rows_split_into_their_columns() -> None:
    rows = [{"id": 2**63 + i, "name": f"n\u00e9 {i}", "tags": ["x", {"k": 1}, [2, 3]], "note": None, "score": i / 3}
            for i in range(100)]
    texts = [_text(r) for r in rows]
    split = split_rows(pa.array(texts, pa.string()))
    assert split is not None and split.names == tuple(sorted(rows[0])) and list(split.rows) == list(range(100))
    assert split.columns[0].to_pylist()[:2] == [str(2**63), str(2**63 + 1)]
    assert snapshot_records_of_texts(pa.array(texts, pa.string()), ("id",), decode_row).to_pylist() == _oracle(texts)


@pytest.mark.parametrize("row", [
    {"a": {"b": {"c": {"d": 1}}}, "b": 1},  # nested deeper than the split accepts
    {"a": {"x": 1, "b": 2}, "b": 3},  # a nested object holds the next column's separator
    {"a": '","b":', "b": 1},  # so does a string (escaped: no separator)
])
def test_rows_the_split_must_not_take_apart_keep_their_records(row: dict[str, Any]) -> None:
    texts = [_text({"a": 1, "b": 2}), _text(row)]
    split = split_rows(pa.array(texts, pa.string()))
    assert split is not None and 0 in split.rows
    assert snapshot_records_of_texts(pa.array(texts, pa.string()), ("id",), decode_row).to_pylist() == _oracle(texts)


def test_a_batch_across_a_schema_change_splits_every_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows before and after a column was added (and one that splits nothing, first of all): every row
    of both shapes gets its record from its tokens, none from its decoded row but the odd one."""
    odd = {"deep": {"a": {"b": {"c": [1]}}}}
    before = [{"id": 2**63 + i, "name": f"n{i}", "tags": [i]} for i in range(3)]
    after = [{"id": 2**63 + i, "name": f"n{i}", "tags": [i], "added": None} for i in range(3, 6)]
    texts = [_text(r) for r in [odd, *before, *after, before[0]]]
    expected = _oracle(texts)
    decoded: list[str] = []

    def counting(text: str) -> Any:
        decoded.append(text)
        return decode_row(text)

    assert snapshot_records_of_texts(pa.array(texts, pa.string()), ("id",), counting).to_pylist() == expected
    assert decoded == [texts[0]]


def test_large_string_batches_split_too() -> None:
    texts = [_text({"a": i, "b": [i, "x"], "c": None}) for i in range(5)]
    split = split_rows(pa.array(texts, pa.large_string()))
    assert split is not None and list(split.rows) == list(range(5))
    got = snapshot_records_of_texts(pa.array(texts, pa.large_string()), ("id",), decode_row)
    assert got.to_pylist() == _oracle(texts)


def test_a_text_that_is_no_row_is_refused_as_before() -> None:
    with pytest.raises(ValueError, match="must be a JSON object"):
        snapshot_records_of_texts(pa.array(['{"a":1}', "[1]"], pa.string()), ("id",), decode_row)


def test_no_split_without_an_object_row() -> None:
    assert split_rows(pa.array([None, None], pa.string())) is None
    assert split_rows(pa.array(["{}"], pa.string())) is None
