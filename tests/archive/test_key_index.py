"""The snapshot key index: for any key set and any placement of its entries, a key's block holds its row."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.key_index import KeyIndex, UnusableIndex, block_bytes_for, index_key
from snapshot_assets.archive.keys import typed_key
from snapshot_assets.archive.sortkey import sort_key

BIG = 2**53

key_values = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=BIG, max_value=BIG + 50),
                       st.text(max_size=6))
composite = st.tuples(st.text(max_size=4), st.integers(min_value=-(2**64), max_value=2**64))


def _records(format_id: str, rows: list[dict[str, Any]], key_fields: tuple[str, ...]) -> list[bytes]:
    """Each row's record in one format (a snapshot object is their concatenation)."""
    out = []
    for row in rows:
        buffer = io.BytesIO()
        writer = FORMATS[format_id].snapshot_writer(buffer, key_fields)
        writer.write(row)
        writer.close()
        out.append(buffer.getvalue())
    return out


def _check(keys: list[tuple[Any, ...]], key_fields: tuple[str, ...], marks: list[int], absent: list[tuple[Any, ...]],
           split: int) -> None:
    rows = sorted(({**dict(zip(key_fields, k, strict=True)), "v": i} for i, k in enumerate(keys)),
                  key=lambda r: sort_key(typed_key(r, key_fields)))
    marked = sorted({0, *(m % len(rows) for m in marks)})
    records = {fid: _records(fid, rows, key_fields) for fid in ("jsonl", "protobuf")}
    objects = {fid: b"".join(recs) for fid, recs in records.items()}
    # two "buckets" split at a marked row, each with bucket-relative offsets, as the state keeps them
    cut = marked[split % len(marked)]
    buckets, sizes = [], []
    for lo, hi in ((0, cut), (cut, len(rows))):
        chosen = [m for m in marked if lo <= m < hi]
        buckets.append((tuple(sort_key(typed_key(rows[m], key_fields)) for m in chosen),
                        {fid: tuple(sum(len(r) for r in recs[lo:m]) for m in chosen) for fid, recs in records.items()}))
        sizes.append({fid: sum(len(r) for r in recs[lo:hi]) for fid, recs in records.items()})
    index = KeyIndex.loads(KeyIndex.of_buckets(key_fields, "0/10", buckets, sizes).dumps(), "test")
    for fid, data in objects.items():
        assert index.sizes[fid] == len(data)
        for row in rows:
            key = typed_key(row, key_fields)
            block = index.block(sort_key(key), fid)
            assert block is not None
            start, length = block
            found = list(FORMATS[fid].read_snapshot(io.BytesIO(data[start:start + length])))
            assert key in {typed_key(r, key_fields) for r in found}, (fid, key)
        for key in absent:
            block = index.block(sort_key(key), fid)
            if block is not None:
                start, length = block
                found = FORMATS[fid].read_snapshot(io.BytesIO(data[start:start + length]))
                assert key not in {typed_key(r, key_fields) for r in found}


@settings(max_examples=150, deadline=None)
@given(st.sets(key_values, min_size=1, max_size=40), st.lists(st.integers(min_value=0), max_size=12),
       st.lists(key_values, max_size=5), st.integers(min_value=0))
def test_single_field_keys_are_in_their_block(keys: set[Any], marks: list[int], others: list[Any], split: int) -> None:
    absent = [(k,) for k in others if k not in keys]
    _check([(k,) for k in keys], ("id",), marks, absent, split)


@settings(max_examples=100, deadline=None)
@given(st.sets(composite, min_size=1, max_size=30), st.lists(st.integers(min_value=0), max_size=10),
       st.lists(composite, max_size=5), st.integers(min_value=0))
def test_composite_keys_are_in_their_block(keys: set[tuple[str, int]], marks: list[int],
                                           others: list[tuple[str, int]], split: int) -> None:
    _check(sorted(keys), ("tenant", "id"), marks, [k for k in others if k not in keys], split)


def test_a_key_before_every_entry_has_no_block() -> None:
    index = KeyIndex(("id",), "0/1", (sort_key([10]).hex(), sort_key([20]).hex()), {"jsonl": (0, 50)}, {"jsonl": 90})
    assert index.block(sort_key([5]), "jsonl") is None
    assert index.block(sort_key([10]), "jsonl") == (0, 50)
    assert index.block(sort_key([15]), "jsonl") == (0, 50)
    assert index.block(sort_key([99]), "jsonl") == (50, 40)


def test_unusable_index_objects_are_refused_by_name() -> None:
    with pytest.raises(UnusableIndex, match="not a key index"):
        KeyIndex.loads(b"{nope", "s3://b/t/epoch=1/snapshot-0_10.keyindex.json")
    with pytest.raises(UnusableIndex, match="version 99"):
        KeyIndex.loads(b'{"key_index_version": 99}', "x")
    bad = b'{"key_index_version":1,"key_fields":["id"],"position":"0/1","sizes":{},"sk":["00"],"offsets":{"jsonl":[]}}'
    with pytest.raises(UnusableIndex, match="differ in length"):
        KeyIndex.loads(bad, "x")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=12), st.binary(max_size=12))
def test_hex_orders_as_the_bytes(a: bytes, b: bytes) -> None:
    assert (a.hex() < b.hex()) == (a < b)


def test_index_key_and_block_size() -> None:
    assert index_key("users/", 3, "0/1A2B") == "users/epoch=3/snapshot-0_1A2B.keyindex.json"
    assert block_bytes_for(32 * 1024 * 1024) == 64 * 1024
    assert block_bytes_for(16 * 1024) == 1024
    assert block_bytes_for(100) == 256
