"""Object keys and the Go `%v` row key: spec vectors plus the float rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.archive.gonum import go_json_float, go_v_float
from snapshot_assets.archive.keys import (
    default_key_prefix,
    diff_key,
    laredo_row_key,
    manifest_key,
    parse_key_string,
    row_key,
    san,
    snapshot_key,
    typed_key,
)


def test_san() -> None:
    assert san("") == "0"
    assert san("0/1A2B3C") == "0_1A2B3C"
    assert san("a:b c/d") == "a_b_c_d"
    assert san("x-y.z") == "x-y.z"


def test_object_keys() -> None:
    assert manifest_key("users/") == "users/manifest.json"
    assert snapshot_key("users/", 3, "0/1A2B3C", ".jsonl") == "users/epoch=3/snapshot-0_1A2B3C.jsonl"
    assert diff_key("users/", 3, "0/10", "0/20", ".pb") == "users/epoch=3/diff-0_10-0_20.pb"
    assert diff_key("", 0, "", "1", ".jsonl") == "epoch=0/diff-0-1.jsonl"
    assert default_key_prefix("public.users") == "users/"


@pytest.mark.parametrize(
    ("row", "fields", "expected"),
    [
        ({"id": "42"}, ["id"], "42"),
        ({"id": 7}, ["id"], "7"),
        ({"tenant": "acme", "id": 1}, ["tenant", "id"], "[acme 1]"),
        ({}, ["id"], "<nil>"),
        ({"id": None}, ["id"], "<nil>"),
        ({"id": True}, ["id"], "true"),
        ({"id": 1000000.0}, ["id"], "1e+06"),
        ({"id": 1234567.0}, ["id"], "1.234567e+06"),
        ({"id": 100000.0}, ["id"], "100000"),
        ({"id": 0.00001}, ["id"], "1e-05"),
        ({"id": 2**63 + 5}, ["id"], str(2**63 + 5)),
    ],
)
def test_row_key_vectors(row: dict[str, object], fields: list[str], expected: str) -> None:
    assert row_key(row, fields) == expected


def test_laredo_row_key_uses_doubles() -> None:
    # laredo's reader decodes every JSON number as float64 before printing it with %v.
    assert laredo_row_key({"id": 1000000}, ["id"]) == "1e+06"
    assert laredo_row_key({"id": 42}, ["id"]) == "42"
    assert laredo_row_key({"t": "a", "id": 1000000}, ["t", "id"]) == "[a 1e+06]"


def test_typed_key_is_exact_and_format_independent() -> None:
    big = 2**53 + 1
    assert typed_key({"id": big}, ["id"]) != typed_key({"id": big - 1}, ["id"])
    # protobuf carries integers beyond 2^53 as decimal strings; they key as the same integer.
    assert typed_key({"id": str(big)}, ["id"]) == typed_key({"id": big}, ["id"])
    # a double read back from protobuf/laredo keys like the integer it holds.
    assert typed_key({"id": 1e6}, ["id"]) == typed_key({"id": 1000000}, ["id"])
    assert typed_key({"id": "42"}, ["id"]) != typed_key({"id": 42}, ["id"])


def test_parse_key_string() -> None:
    assert parse_key_string("42", 1) == (42,)
    assert parse_key_string("1e+06", 1) == (1000000,)
    assert parse_key_string("[acme 1]", 2) == ("acme", 1)
    assert parse_key_string("<nil>", 1) == (None,)


@pytest.mark.parametrize(
    ("value", "json_text", "v_text"),
    [
        (1e21, "1e+21", "1e+21"),
        (1e-7, "1e-7", "1e-07"),
        (0.000001, "0.000001", "1e-06"),
        (42.0, "42", "42"),
        (-2.5, "-2.5", "-2.5"),
        (123456789.125, "123456789.125", "1.23456789125e+08"),
        (1e20, "100000000000000000000", "1e+20"),
    ],
)
def test_go_float_formats(value: float, json_text: str, v_text: str) -> None:
    assert go_json_float(value) == json_text
    assert go_v_float(value) == v_text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_go_float_round_trips(value: float) -> None:
    assert float(go_json_float(value)) == value
    assert float(go_v_float(value)) == value


def test_go_json_float_rejects_nan() -> None:
    with pytest.raises(ValueError):
        go_json_float(float("nan"))
