"""Crash recovery at open, retention, and the ranges the buffer refuses to answer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from resources.buffer import (
    BufferCorrupt,
    BufferReader,
    ChangeBuffer,
    RangeNotAvailable,
    ResyncInWindow,
    WriterLockHeld,
)
from resources.subscribers.events import Event, ResyncBegin, ResyncEnd, SnapshotRow
from tests.buffer.helpers import SIMPLE_SCHEMA, buffer_rows, initial_load, lsn, tx

T = "public.t"


def fill(root: Path, positions: tuple[int, ...] = (200, 300, 400)) -> None:
    """A buffer with an initial load at 100 and one sealed segment per position."""
    with ChangeBuffer(root, T, seal_interval=3600.0) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 0, "v": "a"}]):
            buf.append(event)
        for p in positions:
            for event in tx(lsn(p), p, p + 1):
                buf.append(event)
            buf.seal()


def index_path(root: Path) -> Path:
    return root / T / "index.json"


def test_index_rebuilt_after_deleting_it(tmp_path: Path) -> None:
    fill(tmp_path)
    original = BufferReader(tmp_path, T)
    before = (original.durable_position(), original.all_segments(), original.latest_resync())
    index_path(tmp_path).unlink()
    assert (BufferReader(tmp_path, T).durable_position(), BufferReader(tmp_path, T).all_segments()) == before[:2]
    with ChangeBuffer(tmp_path, T) as buf:
        assert buf.recovery.rebuilt
        assert (buf.durable_position(), buf.all_segments(), buf.latest_resync()) == before
        assert buf.stats(lsn(100)).changes == 6
        for event in tx(lsn(500), 9):  # seqs continue where they were
            buf.append(event)
        buf.seal()
        assert buf.all_segments()[-1].first_seq == 8
    assert index_path(tmp_path).exists()


def test_crash_between_segment_rename_and_index_write(tmp_path: Path) -> None:
    fill(tmp_path, (200, 300))
    stale_index = index_path(tmp_path).read_bytes()
    with ChangeBuffer(tmp_path, T) as buf:
        for event in tx(lsn(400), 7, 8):
            buf.append(event)
        buf.seal()
    index_path(tmp_path).write_bytes(stale_index)  # as if killed right after the rename
    assert BufferReader(tmp_path, T).durable_position() == lsn(400)  # readers reconcile too
    assert index_path(tmp_path).read_bytes() == stale_index  # ... without writing
    with ChangeBuffer(tmp_path, T) as buf:
        assert buf.recovery.adopted == ("segments/000000000004-changes.parquet",)
        assert buf.durable_position() == lsn(400)
        assert buf.stats(lsn(300)).changes == 2
    assert [r["seq"] for r in buffer_rows(tmp_path, T)] == list(range(1, 8))


def test_leftover_temporaries_are_removed(tmp_path: Path) -> None:
    fill(tmp_path, (200,))
    litter = [tmp_path / T / "segments" / ".tmp-1234-000000000009-changes.parquet",
              tmp_path / T / ".tmp-abcd-index.json"]
    for path in litter:
        path.write_bytes(b"partial")
    with ChangeBuffer(tmp_path, T) as buf:
        assert sorted(buf.recovery.removed_temporaries) == sorted(
            str(p.relative_to(tmp_path / T)) for p in litter)
        assert buf.durable_position() == lsn(200)
    assert not any(p.exists() for p in litter)


def test_missing_segment_is_reported_not_papered_over(tmp_path: Path) -> None:
    fill(tmp_path)
    (tmp_path / T / "segments" / "000000000003-changes.parquet").unlink()
    with pytest.raises(BufferCorrupt, match="names segments that are gone"):
        ChangeBuffer(tmp_path, T)
    index_path(tmp_path).unlink()
    with pytest.raises(BufferCorrupt, match="seq gap"):
        ChangeBuffer(tmp_path, T)


def test_one_writer_per_table(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T), pytest.raises(WriterLockHeld):
        ChangeBuffer(tmp_path, T)
    ChangeBuffer(tmp_path, T).close()  # released on close


def test_ordering_mismatch_is_refused(tmp_path: Path) -> None:
    fill(tmp_path, (200,))
    with pytest.raises(BufferCorrupt, match="ordering 'lsn'"):
        ChangeBuffer(tmp_path, T, ordering="sequence")


def test_truncate_below_deletes_covered_segments_and_keeps_the_newest(tmp_path: Path) -> None:
    fill(tmp_path)
    with ChangeBuffer(tmp_path, T) as buf:
        assert buf.truncate_below(lsn(300)) == ["segments/000000000001-snapshot.parquet",
                                                "segments/000000000002-changes.parquet",
                                                "segments/000000000003-changes.parquet"]
        assert [r.to_position for r in buf.all_segments()] == [lsn(400)]
        assert [r.to_position for r in buf.segments(lsn(300), lsn(400))] == [lsn(400)]
        with pytest.raises(RangeNotAvailable, match="truncated"):
            buf.segments(lsn(200), lsn(400))
        assert buf.truncate_below(lsn(400)) == []  # the newest segment is the durable anchor
        marker = buf.latest_resync()
        assert marker is not None and marker.segment is None and marker.end_position == lsn(100)
        with pytest.raises(RangeNotAvailable, match="only 0/00000190 is durable"):
            buf.truncate_below(lsn(500))
    index_path(tmp_path).unlink()  # even the last segment alone rebuilds the durable state
    with ChangeBuffer(tmp_path, T) as buf:
        assert (buf.durable_position(), buf.stats(None).changes) == (lsn(400), 2)


def test_crash_between_truncate_index_write_and_deletes(tmp_path: Path) -> None:
    fill(tmp_path)
    segments = tmp_path / T / "segments"
    keep = tmp_path / "saved"
    shutil.copytree(segments, keep)
    with ChangeBuffer(tmp_path, T) as buf:
        buf.truncate_below(lsn(300))
    for saved in keep.iterdir():  # as if killed before the deletes
        if not (segments / saved.name).exists():
            shutil.copy(saved, segments / saved.name)
    with ChangeBuffer(tmp_path, T) as buf:
        assert len(buf.recovery.deleted_leftovers) == 3 and not buf.recovery.adopted
        assert [r.to_position for r in buf.all_segments()] == [lsn(400)]
    assert sorted(p.name for p in segments.iterdir()) == ["000000000004-changes.parquet"]


def test_ranges_the_buffer_cannot_answer(tmp_path: Path) -> None:
    fill(tmp_path, (200, 300))
    with ChangeBuffer(tmp_path, T) as buf:
        with pytest.raises(RangeNotAvailable, match="not durable yet"):
            buf.segments(lsn(200), lsn(301))
        with pytest.raises(ValueError, match="backwards"):
            buf.segments(lsn(300), lsn(200))
        with pytest.raises(ResyncInWindow, match="ended at 0/00000064"):
            buf.segments(lsn(50), lsn(300))
        assert buf.segments(lsn(300), lsn(300)) == []
        resync: list[Event] = [ResyncBegin("again"), SnapshotRow({"id": 1, "v": "b"}), ResyncEnd(lsn(350), 1)]
        for event in resync:
            buf.append(event)
        with pytest.raises(ResyncInWindow):
            buf.segments(lsn(200), lsn(350))


def test_crash_during_a_resync_leaves_the_previous_state(tmp_path: Path) -> None:
    fill(tmp_path, (200,))
    buf = ChangeBuffer(tmp_path, T, row_group_rows=2)
    buf.append(ResyncBegin("again"))
    for i in range(7):
        buf.append(SnapshotRow({"id": i, "v": "s"}))
    assert BufferReader(tmp_path, T).stats(lsn(200)).resync_pending
    buf._storage.unlock_writer()  # abandon it, as a killed process would
    with ChangeBuffer(tmp_path, T) as fresh:
        assert fresh.durable_position() == lsn(200)
        assert not fresh.stats(lsn(200)).resync_pending
        assert [r.kind for r in fresh.all_segments()] == ["snapshot", "changes"]
    assert not BufferReader(tmp_path, T).stats(lsn(200)).resync_pending  # cleared on disk too


def test_release_below_is_a_request_the_writer_honours(tmp_path: Path) -> None:
    fill(tmp_path)
    reader = BufferReader(tmp_path, T)
    assert reader.release_below(lsn(300)) == 3  # nothing deleted by the reader itself
    assert reader.release_below(lsn(200)) == 2  # an older request never moves it back
    assert len(reader.all_segments()) == 4
    with ChangeBuffer(tmp_path, T) as buf:  # honoured at open ...
        assert [r.to_position for r in buf.all_segments()] == [lsn(400)]
        reader.release_below(lsn(400))
        for event in tx(lsn(500), 9):  # ... and after every seal
            buf.append(event)
        buf.seal()
        assert [r.to_position for r in buf.all_segments()] == [lsn(500)]
        assert buf.stats(None).low_water == lsn(400)
    assert [r.to_position for r in reader.all_segments()] == [lsn(500)]
