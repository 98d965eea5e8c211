"""Protobuf records assembled column by column are the per-row encoder's bytes, exactly.

The oracle is the archive's own path: `set_value(Value(), gojson.loads(token))` for one value and
`snapshot_record(gojson.loads(text))` for a row, over Go-JSON tokens as the encoder writes them
(integers of any size, shortest floats in both notations, -0, strings with and without escapes,
non-ASCII, nested objects and arrays).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import struct_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive import gojson
from snapshot_assets.archive.formats.protobuf import _varint, set_value, snapshot_record
from snapshot_assets.archive.formats.protobuf_columns import (
    KnownTokens,
    TokenKind,
    snapshot_records,
    value_bytes,
    varints,
)

_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)
_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | _TEXT
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.sampled_from([0.0, -0.0, 1e21, 1e-7, 5e-324, 2.0**53, 2.0**53 + 2, 123456789.0, 0.1]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                       max_leaves=6)


def _token(value: Any) -> str:
    return gojson.encode_value(value)


def _typed(token: str) -> bytes:
    value = struct_pb2.Value()
    set_value(value, gojson.loads(token))
    return value.SerializeToString(deterministic=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(_VALUES, max_size=30))
def test_each_value_token_becomes_the_value_bytes_the_typed_path_writes(values: list[Any]) -> None:
    tokens = [_token(v) for v in values]
    assert value_bytes(pa.array(tokens, pa.string())).to_pylist() == [_typed(t) for t in tokens]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_rows_of_value_columns_become_the_records_the_state_encodes(data: Any) -> None:
    names = data.draw(st.lists(_TEXT, min_size=1, max_size=5, unique=True))
    rows = data.draw(st.lists(st.tuples(*(_VALUES for _ in names)), min_size=1, max_size=10))
    columns = [pa.array([_token(row[j]) for row in rows], pa.string()) for j in range(len(names))]
    texts = [gojson.encode_row(dict(zip(names, row, strict=True)), lambda: "") for row in rows]
    assert snapshot_records(names, columns).to_pylist() == [snapshot_record(gojson.loads(t), ()) for t in texts]


#: Integers at the edges the known path decides on: 2^53 (number or digits) and INT64_SAFE_CHARS
#: (cast to int64 or left as digits: 18 characters fit, sign included; 19 may not).
_INTEGER_EDGES = [2**53, 2**53 + 1, -(2**53) - 1, 10**18 - 1, -(10**17) + 1, 10**18, -(10**17), 2**63 - 1, -(2**63),
                  2**63]

#: Values whose token is of each kind, as a kernel that knows its column's type spells them.
_KIND_VALUES = {
    TokenKind.PLAIN_STRING: st.text(st.characters(exclude_categories=("Cs", "Cc"),
                                                  exclude_characters='"\\<>&\u2028\u2029'), max_size=10),
    TokenKind.INTEGER: st.integers() | st.integers(-(2**70), 2**70) | st.sampled_from(_INTEGER_EDGES),
    TokenKind.BOOL: st.booleans(),
}


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_tokens_of_a_known_kind_get_the_bytes_the_typed_path_writes(data: Any) -> None:
    """The rows a caller names as known skip the classification and must still get the same bytes;
    the rest of the column (any value) is classified as usual."""
    kind = data.draw(st.sampled_from(list(TokenKind)))
    cells = data.draw(st.lists(st.tuples(st.booleans(), _KIND_VALUES[kind], _VALUES), max_size=30))
    tokens = [_token(value if known else other) for known, value, other in cells]
    known = KnownTokens(kind, pa.array([known for known, _, _ in cells], pa.bool_()))
    assert value_bytes(pa.array(tokens, pa.string()), known).to_pylist() == [_typed(t) for t in tokens]


def test_lengths_become_the_varints_protobuf_writes() -> None:
    lengths = [0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**28 - 1, 2**28, 2**35, 2**62]
    assert varints(np.array(lengths, dtype=np.int64)).to_pylist() == [_varint(n) for n in lengths]
    short = [0, 1, 5, 127]  # every one a single byte: the fast path
    assert varints(np.array(short, dtype=np.int64)).to_pylist() == [_varint(n) for n in short]
    assert varints(np.array([], dtype=np.int64)).to_pylist() == []


def test_a_large_string_value_keeps_its_bytes_under_a_multibyte_length() -> None:
    big = "é" * 100_000
    (record,) = snapshot_records(["v"], [pa.array([_token(big)], pa.string())]).to_pylist()
    assert record == snapshot_record({"v": big}, ())
