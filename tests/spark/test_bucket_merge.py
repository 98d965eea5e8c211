"""A bucket with its changes merged in: the splice and the sorted merge give the rows a model gives
(stored rows minus changed keys, plus changed images, in sk order), whichever the bucket takes."""

from __future__ import annotations

from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshot_assets.archive.keys import key_json
from snapshot_assets.archive.sortkey import sort_keys
from snapshot_assets.spark import bucket_merge

SCHEMA = pa.schema([("key", pa.string()), ("sk", pa.binary()), ("row", pa.string()), ("pb", pa.binary()),
                    ("ver", pa.string())])
#: Composite keys as tables have them: a snowflake-sized bigint (past 2^53, negatives too) and text.
Key = tuple[int, str]


def table(rows: dict[Key, str | None]) -> pa.Table:
    """Rows as a bucket holds them: canonical key JSON, the archive's own sort key, in sk order."""
    keys = pa.array([key_json(k) for k in rows], pa.string())
    data = pa.table({"key": keys, "sk": sort_keys(keys), "row": list(rows.values()),
                     "pb": [None if v is None else v.encode() for v in rows.values()],
                     "ver": [f"v{i}" for i in range(len(rows))]}, schema=SCHEMA)
    return data.sort_by("sk")


def model(old: dict[Key, str | None], changes: dict[Key, str | None]) -> list[tuple[str, str]]:
    rows = {**old, **changes}
    kept = table({k: v for k, v in rows.items() if v is not None})
    return list(zip(kept.column("key").to_pylist(), kept.column("row").to_pylist(), strict=True))


def key_rows(rows: pa.Table) -> list[tuple[str, str]]:
    return list(zip(rows.column("key").to_pylist(), rows.column("row").to_pylist(), strict=True))


def simple(rows: dict[int, str | None]) -> pa.Table:
    return table({(k, "t"): v for k, v in rows.items()})


keys = st.tuples(st.sampled_from([-(2**63), -(2**53) - 1, 0, 1, 2**53 + 1, 2**62 + 7, 2**63 - 1])
                 | st.integers(-(2**63), 2**63 - 1), st.sampled_from(["", "a", "a\x00", "é", "Z"]))
stored = st.dictionaries(keys, st.text(max_size=5), max_size=300)
changed = st.dictionaries(keys, st.one_of(st.none(), st.text(max_size=5)), max_size=40)


@pytest.mark.parametrize("splice_rows_per_change", [0, 10**9], ids=["spliced", "sorted"])
@settings(max_examples=200, deadline=None)
@given(old=stored, changes=changed)
def test_both_merges_give_the_models_rows(splice_rows_per_change: int, old: dict[Key, str],
                                          changes: dict[Key, str | None]) -> None:
    with mock.patch.object(bucket_merge, "SPLICE_ROWS_PER_CHANGE", splice_rows_per_change):
        rows = bucket_merge.merged(table(dict(old)), table(changes))
    assert key_rows(rows) == model(dict(old), changes)
    assert [b.num_rows for b in bucket_merge.batches(rows, 7)] == [min(7, rows.num_rows - i)
                                                                    for i in range(0, rows.num_rows, 7)]


def test_a_bucket_with_few_changes_is_spliced_without_a_sort() -> None:
    old = simple({k: f"r{k}" for k in range(0, 10_000, 2)})
    changes = simple({3: "new", 4: "updated", 9_998: None})
    with mock.patch.object(bucket_merge.pc, "is_in", side_effect=AssertionError("the sorted merge ran")):
        rows = bucket_merge.merged(old, changes)
    assert rows.num_rows == 5_000
    assert rows.slice(1, 4).column("row").to_pylist() == ["r2", "new", "updated", "r6"]
    assert rows.column("key")[-1].as_py() == key_json((9_996, "t"))


@pytest.mark.parametrize("why", ["unsorted changes", "a stored sk under another key"])
def test_what_the_splice_cannot_place_goes_to_the_sorted_merge(why: str) -> None:
    stored_rows = {k: f"r{k}" for k in range(1_000)}
    old = simple(stored_rows)
    if why == "unsorted changes":
        changes = simple({5: "a", 7: "b"}).take([1, 0])
        expected = key_rows(simple({**stored_rows, 5: "a", 7: "b"}))
    else:  # the sort key of (5, "t") under another key: the sorted merge keeps both, the changed one after
        changes = simple({5: "a"}).set_column(0, "key", pa.array(["other"]))
        expected = key_rows(old)
        expected.insert(6, ("other", "a"))
    assert bucket_merge._spliced(old.cast(changes.schema), changes) is None
    assert key_rows(bucket_merge.merged(old, changes)) == expected
