"""Struct bytes written directly are the protobuf runtime's bytes, exactly (struct_wire.py).

The oracle is the runtime itself: `fill_row` / `set_value` into the generated message classes and
`SerializeToString(deterministic=True)`, over every kind of value `set_value` accepts (integers of
any size, floats, strings with non-ASCII text, bytes, times, dates, Decimals, nested objects and
arrays, subclasses such as IntEnum) and whole diff changes (absent and empty images, empty keys).
Values the runtime refuses are refused with the same error, naming column and row.
"""

from __future__ import annotations

import datetime as dt
import enum
from decimal import Decimal
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.errors import EncodeError
from snapshot_assets.archive.formats import struct_wire
from snapshot_assets.archive.formats.protobuf import (
    _diff_message,
    _varint,
    diff_record,
    fill_row,
    set_value,
    snapshot_record,
)
from snapshot_assets.archive.keys import row_key, written_key
from snapshot_assets.archive.proto.laredo.snapshotter.v1.artifact_pb2 import SnapshotRow


class Tier(enum.IntEnum):
    GOLD = 3


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | _TEXT
            | st.floats(allow_nan=False, allow_infinity=False) | st.binary(max_size=6)
            | st.datetimes(timezones=st.just(dt.UTC)) | st.dates()
            | st.decimals(allow_nan=False, allow_infinity=False, places=3)
            | st.sampled_from([0.0, -0.0, 2.0**53 + 2, 2**53, -(2**53) - 1, Tier.GOLD, True, False, ""]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                       | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=8)
_ROWS = st.dictionaries(_TEXT, _VALUES, max_size=6)


def _runtime_value(value: Any) -> bytes:
    target = struct_pb2.Value()
    set_value(target, value)
    return target.SerializeToString(deterministic=True)


def _runtime_record(row: dict[str, Any]) -> bytes:
    message = SnapshotRow()
    fill_row(message.row, row, lambda: "k")
    data = message.SerializeToString(deterministic=True)
    return _varint(len(data)) + data


@settings(max_examples=300, deadline=None)
@given(_VALUES)
def test_a_value_is_the_runtimes_value_bytes(value: Any) -> None:
    assert struct_wire.value_bytes(value) == _runtime_value(value)


@settings(max_examples=300, deadline=None)
@given(_ROWS)
def test_a_row_is_the_runtimes_snapshot_record(row: dict[str, Any]) -> None:
    assert snapshot_record(row, ()) == _runtime_record(row)


_IMAGES: st.SearchStrategy[dict[str, Any] | None] = st.none() | st.just({}) | _ROWS


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([Action.INSERT, Action.UPDATE, Action.DELETE]), _TEXT, _IMAGES, _IMAGES)
def test_a_change_is_the_runtimes_diff_record(action: Action, key: str, old: Any, new: Any) -> None:
    change = Change(action, key, old, new)
    message = _diff_message(change, gojson.valid_text(written_key(change, ("id",), lambda v: v)))
    assert diff_record(change, ("id",)) == _varint(len(message)) + message


def test_a_truncate_has_only_its_action() -> None:
    change = Change(Action.TRUNCATE, "", None, None)
    assert diff_record(change, ("id",)) == b"\x0a\x0a\x08TRUNCATE"


def test_lone_surrogates_go_through_the_runtime_which_replaces_them() -> None:
    row = {"a" + chr(0xD800): "x", "b": "y" + chr(0xDFFF), "a" + chr(0xDBFF): [1]}  # the runtime merges two keys
    with pytest.raises(struct_wire.NotPlain):
        struct_wire.row_struct(row, lambda: "k")
    assert snapshot_record(row, ()) == _runtime_record(row)


def test_a_key_comes_after_the_keys_it_is_a_prefix_of() -> None:
    row = dict.fromkeys(["a", "ab", "b", "", "abc", "ac", "b\x00", "é", "e"])
    assert snapshot_record(row, ()) == _runtime_record(row)


def test_big_and_small_lengths_use_multi_byte_varints() -> None:
    row = {"k" * 200: "v" * 70_000, "n": [0] * 300}
    assert snapshot_record(row, ()) == _runtime_record(row)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), Decimal("NaN"), object(), {1: "non-string key"}])
def test_what_the_runtime_refuses_is_refused_naming_column_and_row(bad: Any) -> None:
    with pytest.raises(EncodeError) as ours:
        snapshot_record({"a": 1, "col": {"nested": bad}}, ("a",))
    with pytest.raises(EncodeError) as theirs:
        fill_row(SnapshotRow().row, {"a": 1, "col": {"nested": bad}}, lambda: row_key({"a": 1}, ("a",)))
    assert str(ours.value) == str(theirs.value)
    assert "col" in str(ours.value)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([Action.INSERT, Action.UPDATE]), _TEXT, _IMAGES, _ROWS)
def test_a_change_given_its_new_images_snapshot_record_is_the_same_record(action: Action, key: str, old: Any,
                                                                        new: dict[str, Any]) -> None:
    """The DiffChange's `new` reuses the SnapshotRow's Struct (diff_records.py encodes it once)."""
    change = Change(action, key, old, new)
    assert diff_record(change, ("id",), snapshot_record(new, ("id",))) == diff_record(change, ("id",))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([Action.UPDATE, Action.DELETE]), _TEXT, _ROWS, _IMAGES)
def test_a_change_given_its_old_images_snapshot_record_is_the_same_record(action: Action, key: str,
                                                                        old: dict[str, Any], new: Any) -> None:
    """The DiffChange's `old` reuses the base row's SnapshotRow Struct (images.complete_befores)."""
    change = Change(action, key, old, new)
    assert diff_record(change, ("id",), old_record=snapshot_record(old, ("id",))) == diff_record(change, ("id",))


def test_a_new_image_with_lone_surrogates_reuses_the_runtimes_record() -> None:
    new = {"a" + chr(0xD800): "x", "a" + chr(0xDBFF): [1]}
    change = Change(Action.UPDATE, "k", {"id": 1}, new)
    assert diff_record(change, ("id",), snapshot_record(new, ("id",))) == diff_record(change, ("id",))
