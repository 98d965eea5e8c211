"""A re-base whose changes would overgrow a bucket cuts that bucket into parts and keeps the others.

The case users have: an append-only table (snowflake ids, beyond 2^53) whose new rows all land in
the last bucket. The oracle is the table itself: every format of every snapshot equals the
single-process writer's bytes for the table, and the next re-base on the split state does too.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from resources.destinations.base import Destination
from resources.destinations.local import LocalDestination
from snapshot_assets.archive.changes import Action
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.keys import snapshot_key
from snapshot_assets.archive.versions import VERSIONS, snapshot_versions_key
from snapshot_assets.spark.assemble import assemble
from snapshot_assets.spark.bases import BufferSnapshotBase
from snapshot_assets.spark.bucket_split import Growth, overgrowing
from snapshot_assets.spark.parts import BuiltArtifact, Reuse
from snapshot_assets.spark.pieces import Targets
from snapshot_assets.spark.snapshot import build_snapshot
from snapshot_assets.spark.state import MAX_GROWTH, Bucket, StateBase
from tests.spark.test_buckets import BYTE_FORMATS, CODEC, KEYS, buffer_with, expected_bytes, table_after

TARGET = 16 * 1024
ALL = (*BYTE_FORMATS, "parquet")
INITIAL = 1500
#: Appends past the last key (about 8 targets of jsonl), an update early in the table, a delete
#: and an update among the appended rows; then, on the split state, updates across the new parts.
WAVES = [
    [(Action.INSERT, i) for i in range(INITIAL, INITIAL + 1200)] + [(Action.UPDATE, 3), (Action.DELETE, INITIAL - 1)],
    [(Action.UPDATE, i) for i in range(INITIAL - 10, INITIAL + 1200, 37)] + [(Action.DELETE, INITIAL + 600)],
]


def _state(n: int, rows: int, jsonl: int) -> StateBase:
    buckets = tuple(Bucket(None if i == 0 else bytes([i]), f"/b{i}", rows, {"jsonl": jsonl}) for i in range(n))
    return StateBase("/s", "0/1", n * rows, KEYS, buckets, ("jsonl",))


def test_only_a_bucket_that_may_pass_the_limit_is_cut_into_parts_of_about_the_target() -> None:
    state = _state(3, 100, TARGET)
    limit = MAX_GROWTH * TARGET
    assert overgrowing(state, {0: Growth(5, limit - TARGET)}, TARGET) == {}  # exactly at the limit: kept
    assert overgrowing(state, {2: Growth(9, limit - TARGET + 1)}, TARGET) == {2: MAX_GROWTH + 1}
    assert overgrowing(state, {1: Growth(9, 10 * TARGET), 2: Growth(1, 10)}, TARGET) == {1: 11}
    assert overgrowing(state, {1: Growth(40, 0)}, TARGET) == {}  # deletes only: nothing grows
    empty = _state(1, 0, 0)
    assert overgrowing(empty, {0: Growth(1, 5 * TARGET)}, TARGET) == {0: 5}  # the changes alone overgrow it
    protobuf_only = StateBase("/s", "0/1", 0, KEYS, state.buckets, ("protobuf",))
    assert overgrowing(protobuf_only, {2: Growth(1, 100 * TARGET)}, TARGET) == {}  # no jsonl: no measure


def _previous_keys(prefix: str, epoch: int, position: str, formats: tuple[str, ...]) -> dict[str, str]:
    keys = {fid: snapshot_key(prefix, epoch, position, FORMATS[fid].extension) for fid in formats}
    keys[VERSIONS] = snapshot_versions_key(prefix, epoch, position)
    return keys


def _chain(spark: Any, tmp_path: Path, dest: Destination, prefix: str, formats: tuple[str, ...], *,
           sends: bool) -> list[BuiltArtifact]:
    """The initial snapshot, the re-base of the appends (which splits), and a re-base on the split
    state; each assembled into `dest` and checked against the table; with `sends`, the tasks send
    their pieces into `dest` themselves (the cluster's way)."""
    reader, positions = buffer_with(tmp_path / "buffer", INITIAL, WAVES)
    resync = reader.latest_resync()
    assert resync is not None and resync.segment is not None
    built: list[BuiltArtifact] = []
    base: Any = BufferSnapshotBase(reader.segment_ref(resync.segment))
    for n, position in enumerate(positions):
        epoch = n + 1
        targets = Targets((dest,), prefix, epoch) if sends else None
        previous = _previous_keys(prefix, n, positions[n - 1], formats) if n else None
        segments = reader.segments(positions[n - 1], position) if n else []
        snap = build_snapshot(spark, base, segments, position, KEYS, formats, tmp_path / f"staging{epoch}",
                              tmp_path / "state" / f"epoch={epoch}", previous_keys=previous, bucket_bytes=TARGET,
                              targets=targets)
        assemble(snap, [dest], prefix, epoch)
        table = table_after(INITIAL, WAVES[:n])
        for fid in formats:
            got = dest.get(snapshot_key(prefix, epoch, position, FORMATS[fid].extension))
            assert got is not None, fid
            if fid in BYTE_FORMATS:
                assert got.data == expected_bytes(fid, table), (epoch, fid)
            else:
                rows = pq.read_table(io.BytesIO(got.data)).sort_by("id").select(list(CODEC.names)).to_pylist()
                assert rows == [table[i] for i in sorted(table)], epoch
        base = snap.details["state"]
        built.append(snap)
    return built


def _assert_split(first: StateBase, second: BuiltArtifact) -> None:
    """The appends' bucket was cut into parts near the target; every bucket before it was kept."""
    state: StateBase = second.details["state"]
    assert second.details["mode"] == "incremental"  # not re-bucketed from the whole state
    kept = len(first.buckets) - 1
    assert state.buckets[1:kept] == first.buckets[1:kept]  # untouched: the same rows files, sizes, index
    assert state.buckets[0].path != first.buckets[0].path  # the early update's bucket: rewritten in its bounds
    parts = state.buckets[kept:]
    assert len(parts) >= 6 and parts[0].lower == first.buckets[-1].lower
    assert max(b.sizes["jsonl"] for b in parts) <= 2.5 * TARGET, [b.sizes["jsonl"] for b in parts]
    assert second.details["rewritten"] == len(parts) + 1  # the parts and the bucket of the early update
    for fid in BYTE_FORMATS:  # the kept buckets are a range of the previous object
        assert any(isinstance(p, Reuse) for p in second.formats[fid].parts), fid


def test_appends_split_the_last_bucket_and_the_rest_is_kept(spark: Any, tmp_path: Path) -> None:
    first, second, third = _chain(spark, tmp_path, LocalDestination(tmp_path / "archive"), "t/", ALL, sends=False)
    _assert_split(first.details["state"], second)
    assert third.details["mode"] == "incremental"
    assert len(third.details["state"].buckets) == len(second.details["state"].buckets)  # in balance now


@pytest.mark.slow
@pytest.mark.s3
def test_a_split_on_s3_numbers_the_sent_and_copied_parts_by_the_new_buckets(spark: Any, tmp_path: Path,
                                                                            s3_bucket: str, moto_server: str) -> None:
    """The tasks send the parts' pieces into the destination's multipart uploads and the kept
    buckets are copied from the previous object: the part numbers follow the new bucket list."""
    from resources.destinations.s3 import S3Destination

    dest = S3Destination(s3_bucket, endpoint_url=moto_server, path_style=True)
    first, second, _ = _chain(spark, tmp_path, dest, "t/", BYTE_FORMATS, sends=True)
    _assert_split(first.details["state"], second)


def test_a_part_of_a_split_bucket_is_never_taken_from_the_previous_object(tmp_path: Path) -> None:
    """A part has no range in the previous object (its start is None): without a fresh piece the
    build fails rather than copying some other bytes."""
    from snapshot_assets.spark.parts import bucket_pieces

    fresh = tmp_path / "piece"
    fresh.write_bytes(b"x" * 7)
    pieces = bucket_pieces("jsonl", [5, 7, 3], {1: fresh}, [0, None, 5], "prev")
    assert pieces == [Reuse("prev", 0, 5, 0), fresh, Reuse("prev", 5, 3, 2)]
    with pytest.raises(RuntimeError, match="bucket 1 of jsonl has neither a fresh piece nor a previous object"):
        bucket_pieces("jsonl", [5, 7, 3], {}, [0, None, 5], "prev")
