"""The key column's sort keys (`sortkey.sort_keys`) equal the per-key rule (`sort_key_of`) on any key column."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.archive.gojson import dumps
from snapshot_assets.archive.sortkey import sort_key_of, sort_keys

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
EDGES = [0, 1, -1, 255, 256, -256, -257, 2**53 + 1, 2**56 - 1, 2**56, -(2**56), -(2**56) - 1, 2**63 - 1, -(2**63)]
SCALARS = st.one_of(st.integers(), st.text(max_size=6), st.booleans(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False))


def _column(keys: list[str]) -> pa.Array:
    return pa.array(keys, pa.string())


def _rule(keys: list[str]) -> list[bytes]:
    return [sort_key_of(k) for k in keys]


@given(st.lists(st.one_of(INT64, st.sampled_from(EDGES)), max_size=300))
def test_one_int64_per_key_takes_the_vector_path_and_equals_the_rule(values: list[int]) -> None:
    keys = [f"[{v}]" for v in values]
    assert sort_keys(_column(keys)).to_pylist() == _rule(keys)


@given(st.lists(st.lists(SCALARS, min_size=1, max_size=3), max_size=50))
def test_any_key_column_equals_the_rule(keys_values: list[list[object]]) -> None:
    keys = [dumps(values) for values in keys_values]
    assert sort_keys(_column(keys)).to_pylist() == _rule(keys)


@pytest.mark.parametrize("keys", [["[1]", "[-0]"], ["[1]", "[07]"], ["[1]", "[99999999999999999999]"],
                                  ["[1]", "[1,2]"], ["[1]", '["1"]']], ids=["minus-zero", "leading-zero",
                                                                             "beyond-int64", "composite", "string"])
def test_a_column_the_vector_path_cannot_read_exactly_goes_key_by_key(keys: list[str]) -> None:
    assert sort_keys(_column(keys)).to_pylist() == _rule(keys)


def test_a_null_key_is_refused() -> None:
    with pytest.raises(ValueError, match="nulls"):
        sort_keys(pa.array(["[1]", None], pa.string()))
