"""A bucket with its changes merged in: the splice and the sorted merge give the rows a model gives
(stored rows minus changed keys, plus changed images, in sk order), whichever the bucket takes."""

from __future__ import annotations

from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.spark import bucket_merge

SCHEMA = pa.schema([("key", pa.string()), ("sk", pa.binary()), ("row", pa.string()), ("pb", pa.binary()),
                    ("ver", pa.string())])


def sk(key: int) -> bytes:
    return (key + 2**32).to_bytes(8, "big")  # order-preserving, like the archive's sort keys


def table(rows: dict[int, str | None]) -> pa.Table:
    keys = sorted(rows)
    return pa.table({"key": [str(k) for k in keys], "sk": [sk(k) for k in keys], "row": [rows[k] for k in keys],
                     "pb": [None if rows[k] is None else rows[k].encode() for k in keys],
                     "ver": [f"v{k}" for k in keys]}, schema=SCHEMA)


def model(old: dict[int, str | None], changes: dict[int, str | None]) -> list[dict[str, object]]:
    rows = {**old, **changes}
    return table({k: v for k, v in rows.items() if v is not None}).to_pylist()


stored = st.dictionaries(st.integers(0, 2000), st.text(max_size=5), max_size=300)
changed = st.dictionaries(st.integers(-5, 2005), st.one_of(st.none(), st.text(max_size=5)), max_size=40)


@pytest.mark.parametrize("splice_rows_per_change", [0, 10**9], ids=["spliced", "sorted"])
@settings(max_examples=200, deadline=None)
@given(old=stored, changes=changed)
def test_both_merges_give_the_models_rows(splice_rows_per_change: int, old: dict[int, str],
                                          changes: dict[int, str | None]) -> None:
    with mock.patch.object(bucket_merge, "SPLICE_ROWS_PER_CHANGE", splice_rows_per_change):
        rows = bucket_merge.merged(table(dict(old)), table(changes))
    assert rows.to_pylist() == model(dict(old), changes)
    assert [b.num_rows for b in bucket_merge.batches(rows, 7)] == [min(7, rows.num_rows - i)
                                                                    for i in range(0, rows.num_rows, 7)]


def test_a_bucket_with_few_changes_is_spliced_without_a_sort() -> None:
    old = table({k: f"r{k}" for k in range(0, 10_000, 2)})
    changes = table({3: "new", 4: "updated", 9_998: None})
    with mock.patch.object(bucket_merge.pc, "is_in", side_effect=AssertionError("the sorted merge ran")):
        rows = bucket_merge.merged(old, changes)
    assert rows.num_rows == 5_000
    assert rows.slice(1, 4).column("row").to_pylist() == ["r2", "new", "updated", "r6"]
    assert rows.column("key")[-1].as_py() == "9996"


@pytest.mark.parametrize("why", ["unsorted changes", "a stored sk under another key"])
def test_what_the_splice_cannot_place_goes_to_the_sorted_merge(why: str) -> None:
    old = table({k: f"r{k}" for k in range(0, 1_000)})
    if why == "unsorted changes":
        changes = table({5: "a", 7: "b"}).take([1, 0])
        expected = model({k: f"r{k}" for k in range(1_000)}, {5: "a", 7: "b"})
    else:
        changes = table({5: "a"}).set_column(0, "key", pa.array(["other"]))
        expected = sorted([r for r in table({k: f"r{k}" for k in range(1_000)}).to_pylist()]
                          + [{"key": "other", "sk": sk(5), "row": "a", "pb": b"a", "ver": "v5"}],
                          key=lambda r: (r["sk"], r["key"] != "5"))
    assert bucket_merge._spliced(old, changes) is None
    assert bucket_merge.merged(old, changes).to_pylist() == expected
