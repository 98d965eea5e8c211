"""The multipart seam's conformance suite: every destination (local, S3, S3 under a prefix) behaves the same.

Parts are real-sized (S3's 5 MiB floor is enforced by moto_server as by S3, and by the local
destination on purpose), so what passes here completes on S3 too.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from resources.destinations.base import REVISION_NOT_COMPUTED, Destination, DestinationError
from resources.destinations.multipart import (
    MERGES_IN_MEMORY,
    MIN_PART_SIZE,
    Assembling,
    CopyRange,
    Fresh,
    FreshSlice,
    MultipartError,
    begin,
    plan_parts,
    write_plan,
    write_planned,
)
from resources.destinations.s3 import MiB

pytestmark = pytest.mark.s3


def _blob(size: int, seed: int) -> bytes:
    """Distinct, position-dependent bytes (so a misplaced range cannot compare equal by accident)."""
    unit = bytes((seed * 31 + i) % 251 for i in range(251))
    return (unit * (size // len(unit) + 1))[:size]


def _data(dest: Destination, key: str) -> bytes:
    got = dest.get(key)
    assert got is not None, f"{key} is missing"
    return got.data


def test_parts_written_out_of_order_complete_in_number_order(dest: Destination) -> None:
    a, b, c = _blob(MIN_PART_SIZE, 1), _blob(MIN_PART_SIZE + 7, 2), _blob(1234, 3)
    upload = begin(dest, "t/epoch=1/snapshot.jsonl")
    assert upload.write_part(3, c).size == 1234
    upload.write_part(1, a)
    upload.write_part(2, b)
    assert dest.get("t/epoch=1/snapshot.jsonl") is None  # nothing visible before complete
    result = upload.complete([1, 2, 3])
    got = dest.get("t/epoch=1/snapshot.jsonl")
    assert got is not None and got.data == a + b + c
    assert (result.uri, result.size, result.revision) == (dest.uri("t/epoch=1/snapshot.jsonl"), len(got.data),
                                                           got.revision)
    assert [(i.key, i.size) for i in dest.list("")] == [("t/epoch=1/snapshot.jsonl", len(got.data))]


def test_completing_without_a_revision_publishes_the_same_object(dest: Destination) -> None:
    """`complete(revision=False)` (an artifact, whose revision nobody compares): the same bytes under
    the key; the result's revision is the destination's token when it comes with the completion (S3's
    ETag, equal to what `get` reports), else REVISION_NOT_COMPUTED (a local object, whose sha256 would
    have to be read back); `get` still reports the real revision."""
    a, b = _blob(MIN_PART_SIZE, 5), _blob(999, 6)
    upload = begin(dest, "t/epoch=1/snapshot.protobuf")
    upload.write_part(1, a)
    upload.write_part(2, b)
    with Assembling(upload) as job:
        result = job.complete([1, 2], revision=False)
    got = dest.get("t/epoch=1/snapshot.protobuf")
    assert got is not None and got.data == a + b and got.revision
    assert (result.uri, result.size) == (dest.uri("t/epoch=1/snapshot.protobuf"), len(a + b))
    assert result.revision in (got.revision, REVISION_NOT_COMPUTED)
    assert (result.revision == REVISION_NOT_COMPUTED) == dest.uri("k").startswith("file:"), result.revision
    assert [i.key for i in dest.list("")] == ["t/epoch=1/snapshot.protobuf"]  # no staging left behind


def test_part_numbers_may_have_gaps_and_a_rewritten_part_replaces_the_first(dest: Destination) -> None:
    upload = begin(dest, "gaps.bin")
    upload.write_part(10, _blob(MIN_PART_SIZE, 9))
    upload.write_part(10, _blob(MIN_PART_SIZE, 4))  # a retried task attempt
    upload.write_part(700, b"tail")
    upload.complete([10, 700])
    assert _data(dest, "gaps.bin") == _blob(MIN_PART_SIZE, 4) + b"tail"


def test_a_stream_is_read_to_its_end(dest: Destination, tmp_path: Path) -> None:
    source = tmp_path / "part.bin"
    source.write_bytes(_blob(MIN_PART_SIZE + 3, 5))
    upload = begin(dest, "streamed.bin")
    with open(source, "rb") as stream:
        assert upload.write_part(1, stream).size == MIN_PART_SIZE + 3
    upload.complete([1])
    assert _data(dest, "streamed.bin") == source.read_bytes()


def test_copy_part_reuses_ranges_of_an_existing_object(dest: Destination) -> None:
    old = _blob(13 * MiB, 6)
    dest.put("epoch=1/snapshot-old.jsonl", old)
    upload = begin(dest, "epoch=1/snapshot-new.jsonl")
    assert upload.copy_part(1, "epoch=1/snapshot-old.jsonl", 2 * MiB, 6 * MiB).size == 6 * MiB
    upload.write_part(2, _blob(MIN_PART_SIZE, 7))
    upload.copy_part(3, "epoch=1/snapshot-old.jsonl", 13 * MiB - 10, 10)  # a small last part
    upload.complete([1, 2, 3])
    assert _data(dest, "epoch=1/snapshot-new.jsonl") == old[2 * MiB:8 * MiB] + _blob(MIN_PART_SIZE, 7) + old[-10:]
    assert upload.read_range("epoch=1/snapshot-old.jsonl", 5, 20) == old[5:25]


def test_complete_replaces_an_existing_object(dest: Destination) -> None:
    dest.put("same.bin", b"old bytes")
    upload = begin(dest, "same.bin")
    upload.write_part(1, b"new bytes")
    upload.complete([1])
    assert _data(dest, "same.bin") == b"new bytes"


def test_no_parts_make_an_empty_object(dest: Destination) -> None:
    result = begin(dest, "empty.pb").complete([])
    assert result.size == 0 and _data(dest, "empty.pb") == b""


def test_a_small_part_before_the_last_is_refused_naming_it_and_the_upload_stays_open(dest: Destination) -> None:
    upload = begin(dest, "small.bin")
    upload.write_part(1, _blob(MIN_PART_SIZE, 1))
    upload.write_part(2, b"too small")
    upload.write_part(3, b"last")
    with pytest.raises(MultipartError, match=r"part 2 has 9 bytes; every part but the last needs at least 5242880"):
        upload.complete([1, 2, 3])
    assert dest.get("small.bin") is None
    upload.write_part(2, _blob(MIN_PART_SIZE, 2))  # fixed: the same upload completes
    upload.complete([1, 2, 3])
    assert _data(dest, "small.bin") == _blob(MIN_PART_SIZE, 1) + _blob(MIN_PART_SIZE, 2) + b"last"


@pytest.mark.parametrize("numbers, message", [
    ([1, 2], r"parts \[2\] were never written"),
    ([2, 1], "part numbers must ascend, got 1 after 2"),
    ([0], "part number 0 is outside 1..10000"),
    ([10_001], "part number 10001 is outside 1..10000"),
])
def test_complete_refuses_a_bad_part_list(dest: Destination, numbers: list[int], message: str) -> None:
    upload = begin(dest, "bad.bin")
    upload.write_part(1, _blob(MIN_PART_SIZE, 1))
    with pytest.raises(MultipartError, match=message):
        upload.complete(numbers)
    assert dest.get("bad.bin") is None
    upload.abort()


def test_bad_part_numbers_and_ranges_are_refused_when_written(dest: Destination) -> None:
    dest.put("src.bin", b"0123456789")
    upload = begin(dest, "x.bin")
    with pytest.raises(MultipartError, match="part number 10001 is outside"):
        upload.write_part(10_001, b"x")
    with pytest.raises(MultipartError, match="empty or negative"):
        upload.copy_part(1, "src.bin", 3, 0)
    with pytest.raises(DestinationError):
        upload.copy_part(1, "src.bin", 5, 10)  # beyond the object's end
    with pytest.raises(DestinationError):
        upload.copy_part(1, "no/such/object", 0, 1)
    upload.abort()


def test_abort_drops_every_part_and_is_idempotent(dest: Destination) -> None:
    upload = begin(dest, "aborted.bin")
    upload.write_part(1, _blob(MIN_PART_SIZE, 1))
    upload.abort()
    upload.abort()
    with pytest.raises(DestinationError):
        upload.complete([1])
    with pytest.raises(DestinationError):
        upload.write_part(2, b"late")
    assert dest.get("aborted.bin") is None and list(dest.list("")) == []


def test_a_crashed_runs_upload_is_aborted_once_stale_and_a_fresh_one_is_kept(dest: Destination) -> None:
    """What a run killed between its first part and `complete` leaves behind is collected by age.

    moto_server reports every upload as initiated on 2010-11-10 (a fixed date), so against it the
    "recent upload is kept" half holds only for the local destination, whose age is its own mtime.
    """
    left = begin(dest, "epoch=1/left.bin")
    left.write_part(1, _blob(MIN_PART_SIZE, 2))
    if dest.uri("x").startswith("file://"):
        assert dest.abort_stale_uploads("epoch=1/", 3600) == ()  # could be a run still writing: kept
        left.write_part(2, b"still open")
    aborted = dest.abort_stale_uploads("epoch=1/", -1)
    assert len(aborted) == 1 and dest.abort_stale_uploads("epoch=1/", -1) == ()
    with pytest.raises(DestinationError):
        left.complete([1])
    assert dest.get("epoch=1/left.bin") is None


def test_assembling_aborts_when_the_block_fails(dest: Destination) -> None:
    with pytest.raises(RuntimeError, match="task failed"), Assembling(begin(dest, "failed.bin")) as job:
        job.upload.write_part(1, b"part")
        raise RuntimeError("task failed")
    with pytest.raises(DestinationError):
        job.upload.complete([1])
    with Assembling(begin(dest, "ok.bin")) as job:
        job.upload.write_part(1, b"part")
        job.complete([1])
    assert _data(dest, "ok.bin") == b"part"


def test_staged_pieces_are_sources_for_parts_and_vanish_with_the_upload(dest: Destination) -> None:
    upload = begin(dest, "t/staged.jsonl")
    small = upload.stage("piece-00001", b"small piece\n")
    head = upload.stage("piece-00002", _blob(MIN_PART_SIZE, 3))
    assert [i.key for i in dest.list("t/")] == [small.key, head.key]  # beside the object, named by the upload
    cut = MIN_PART_SIZE - small.length  # part 1: the small piece topped up from the head; part 2: the rest
    upload.write_part(1, upload.read_range(small.key, 0, small.length) + upload.read_range(head.key, 0, cut))
    upload.copy_part(2, head.key, cut, head.length - cut)
    upload.complete([1, 2])
    assert _data(dest, "t/staged.jsonl") == b"small piece\n" + _blob(MIN_PART_SIZE, 3)
    assert [i.key for i in dest.list("t/")] == ["t/staged.jsonl"]
    aborted = begin(dest, "t/other.jsonl")
    aborted.stage("piece-00001", b"x")
    aborted.abort()
    assert [i.key for i in dest.list("t/")] == ["t/staged.jsonl"]
    with pytest.raises(MultipartError, match="must be non-empty and contain no '/'"):
        begin(dest, "t/x").stage("a/b", b"")


_WRITE_IN_ANOTHER_PROCESS = """
import pickle, sys
upload = pickle.loads(sys.stdin.buffer.read())
upload.write_part(2, bytes(range(256)) * 40)
"""


def test_the_handle_travels_to_another_process_that_writes_a_part(dest: Destination) -> None:
    """What a Spark task does: unpickle the handle and write, with a client built where it runs."""
    upload = begin(dest, "travelled.bin")
    upload.write_part(1, _blob(MIN_PART_SIZE, 8))
    shipped = pickle.dumps(upload)
    assert b"testing" not in shipped  # no credential travels with it
    subprocess.run([sys.executable, "-c", _WRITE_IN_ANOTHER_PROCESS], input=shipped, check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.getcwd()})
    upload.complete([1, 2])
    assert _data(dest, "travelled.bin") == _blob(MIN_PART_SIZE, 8) + bytes(range(256)) * 40


def test_a_plan_of_fresh_pieces_and_ranges_executes_to_the_pieces_concatenated(dest: Destination) -> None:
    old = _blob(20 * MiB, 11)
    dest.put("prev.jsonl", old)
    fresh = {0: _blob(MiB, 12), 2: _blob(6 * MiB, 13), 5: _blob(100, 14)}
    pieces = [Fresh(MiB), CopyRange("prev.jsonl", 0, 7 * MiB), Fresh(6 * MiB),
              CopyRange("prev.jsonl", 7 * MiB, 2 * MiB), CopyRange("prev.jsonl", 9 * MiB, 3 * MiB), Fresh(100),
              CopyRange("prev.jsonl", 15 * MiB, 3 * MiB)]
    expected = fresh[0] + old[:7 * MiB] + fresh[2] + old[7 * MiB:12 * MiB] + fresh[5] + old[15 * MiB:18 * MiB]

    def supply(segment: FreshSlice) -> bytes:
        return fresh[segment.piece][segment.offset:segment.offset + segment.length]

    plan = plan_parts(pieces)
    upload = begin(dest, "new.jsonl")
    for part in plan:
        write_planned(upload, part, supply)
    result = upload.complete([p.number for p in plan])
    assert result.size == len(expected) and _data(dest, "new.jsonl") == expected

    again = write_plan(begin(dest, "again.jsonl"), plan, supply, threads=4)  # parts in flight together
    assert again.size == len(expected) and _data(dest, "again.jsonl") == expected


def test_a_plan_of_merged_parts_holds_only_a_few_of_them_in_memory_however_many_threads_write(
        dest: Destination) -> None:
    """A snapshot whose bucket pieces are all under S3's floor is nothing but merged parts (parquet at
    about 10M rows): the process that completes it must not hold one buffer per thread."""
    piece = 3 * MiB  # two pieces make a part of 6 MiB
    upload = begin(dest, "merged.parquet")
    pieces = [upload.stage(f"piece-{i:05d}", _blob(piece, 20 + i)) for i in range(16)]
    plan = plan_parts(pieces)
    assert len(plan) == 8 and all(len(part.segments) == 2 for part in plan)
    tracemalloc.start()
    try:
        write_plan(upload, plan, threads=8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = MERGES_IN_MEMORY * (2 * piece + piece)  # a part's buffer and the segment being copied into it
    assert peak < held + 4 * MiB, f"{peak / MiB:.1f} MiB held while merging, at most {held / MiB:.0f} expected"
    assert _data(dest, "merged.parquet") == b"".join(_blob(piece, 20 + i) for i in range(16))
