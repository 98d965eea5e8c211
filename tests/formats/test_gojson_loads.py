"""`gojson.loads` with its one shared decoder reads exactly what `json.loads` with the same hooks read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive import gojson
from snapshot_assets.archive.errors import CorruptArtifact

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.text(max_size=6)
                     | st.floats(allow_nan=False, allow_infinity=False),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_loads_reads_what_json_reads(value: Any) -> None:
    text = json.dumps(value)
    assert gojson.loads(text) == json.loads(text)
    assert gojson.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("data", ['\ufeff{"a": 1}', b'\xef\xbb\xbf{"a": 1}', "NaN", '{"a": Infinity}', "1e400",
                                  '{"a": ', b"\xff"])
def test_loads_refuses_what_an_artifact_cannot_hold(data: str | bytes) -> None:
    with pytest.raises(CorruptArtifact):
        gojson.loads(data)
