"""LSN parse/compare/format: the spec's vectors and the edges around them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.archive.positions import (
    comparator,
    compare_bytes,
    compare_lsn,
    compare_sequence,
    format_lsn,
    parse_lsn,
)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("0/10", "0/20", -1),
        ("1/0", "0/FFFFFFFF", 1),
        ("0/10", "0/2", 1),
        ("A/B", "a/b", 0),
        ("", "0/1", -1),
    ],
    ids=["0/10<0/20", "1/0>0/FFFFFFFF", "0/10>0/2", "A/B==a/b", "empty<0/1"],
)
def test_spec_vectors(a: str, b: str, expected: int) -> None:
    assert compare_lsn(a, b) == expected
    assert compare_lsn(b, a) == -expected


@pytest.mark.parametrize("text", ["", "0", "/", "0/", "/1", "x/1", "1/1/1", "100000000/0", "0/100000000",
                                  "0x1/2", "-1/2", "1_0/2", " 1/2"])
def test_unparseable_sorts_lowest(text: str) -> None:
    assert parse_lsn(text) is None
    assert compare_lsn(text, "0/0") == -1
    assert compare_lsn(text, "") == 0


def test_format_matches_postgres() -> None:
    assert format_lsn(0) == "0/00000000"
    assert format_lsn(0x1A2B3C4D5E) == "1A/2B3C4D5E"
    assert format_lsn(0x16B3748) == "0/016B3748"
    with pytest.raises(ValueError):
        format_lsn(-1)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_format_parse_round_trip(value: int) -> None:
    assert parse_lsn(format_lsn(value)) == value


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_order_is_numeric(a: int, b: int) -> None:
    assert compare_lsn(format_lsn(a), format_lsn(b)) == (a > b) - (a < b)


def test_other_comparators() -> None:
    assert compare_sequence("9", "10") == -1
    assert compare_sequence("", "0") == -1
    assert compare_bytes("a", "b") == -1
    assert comparator("lsn") is compare_lsn
    with pytest.raises(ValueError, match="unknown position ordering 'nope'"):
        comparator("nope")
