"""The per-writer log on disk: what recovery keeps after a torn tail or an empty last segment, and
which segments a flushed mark lets go."""

from __future__ import annotations

from pathlib import Path

from resources.capture.log import WriterLog, encode_record
from resources.proto.prism.snapshotter.page_pb2 import Event


def _events(first: int, count: int) -> list[Event]:
    return [Event(event_id=f"w:{s}", timestamp=1000 + s, payload=bytes([s]) * 10, sequence=s)
            for s in range(first, first + count)]


def _append(log: WriterLog, events: list[Event]) -> None:
    segment = log.append(b"".join(encode_record(e) for e in events), events[0].sequence)
    segment.sync_through(segment.written)


def test_torn_tail_is_cut_and_sequences_continue(tmp_path: Path) -> None:
    log = WriterLog(tmp_path, "w")
    _append(log, _events(0, 3))
    assert log.current is not None
    whole = log.current.written
    log.current.write(encode_record(_events(3, 1)[0])[:-4])  # a record whose fsync never finished
    path = log.current.path
    recovered = WriterLog(tmp_path, "w").recover()
    assert [e.sequence for e in recovered.events] == [0, 1, 2] and recovered.next_sequence == 3
    assert path.stat().st_size == whole


def test_empty_last_segment_is_dropped_and_marks_delete_only_flushed_segments(tmp_path: Path) -> None:
    log = WriterLog(tmp_path, "w")
    _append(log, _events(0, 2))
    log.rotate()
    _append(log, _events(2, 2))
    log.rotate()
    (tmp_path / "w" / "seg-00000000000000000004.log").touch()  # created, then the crash
    log = WriterLog(tmp_path, "w")
    recovered = log.recover()
    assert [e.sequence for e in recovered.events] == [0, 1, 2, 3]
    assert not (tmp_path / "w" / "seg-00000000000000000004.log").exists()
    _append(log, _events(4, 1))  # the new segment starts where the sequences continue
    log.mark_flushed(2, 5)
    assert sorted(p.name for p in (tmp_path / "w").glob("seg-*")) == [
        "seg-00000000000000000002.log", "seg-00000000000000000004.log"]
    log.mark_flushed(5, 5)
    assert sorted(p.name for p in (tmp_path / "w").glob("seg-*")) == ["seg-00000000000000000004.log"]  # current
    assert WriterLog(tmp_path, "w").recover().events == []
