"""Statistics from the index alone: counts, bytes, the merged distinct-keys sketch, re-sync flags."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from resources.buffer import BufferReader, ChangeBuffer
from resources.buffer.hll import HyperLogLog
from resources.buffer.index import INDEX_NAME, IndexState
from resources.subscribers.events import ChangeEvent, ResyncBegin, ResyncEnd, SnapshotRow, TxEnd
from snapshot_assets.archive.changes import Action
from tests.buffer.helpers import SIMPLE_SCHEMA, initial_load, insert, lsn, tx

T = "public.t"


def test_hll_estimate_within_a_few_percent_on_10k_keys_across_segments(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100)):
            buf.append(event)
        position = 100
        for segment in range(10):  # 10 segments of 1500 changes; keys overlap between segments
            for i in range(1500):
                ident = segment * 1000 + i  # 10k distinct keys in total, 15k changes
                buf.append(ChangeEvent(lsn(position + 1), Action.UPDATE, new={"id": ident, "v": "x"}))
                position += 1
                buf.append(TxEnd(lsn(position)))
            buf.seal()
        distinct = len({s * 1000 + i for s in range(10) for i in range(1500)})
        stats = buf.stats(lsn(100))
    assert stats.changes == 15_000 and stats.segments == 10
    assert abs(stats.distinct_keys_estimate - distinct) / distinct < 0.03
    # a merge, not a sum: the sum of per-segment estimates would be ~1.5x too high
    index = IndexState.from_bytes((tmp_path / T / INDEX_NAME).read_bytes())
    single = [HyperLogLog.from_text(m.hll).estimate() for m in index.segments if m.kind == "changes"]
    assert sum(single) > 1.4 * distinct


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(0, 10**12), max_size=3000), st.sets(st.integers(0, 10**12), max_size=3000))
def test_hll_merge_is_union_and_text_round_trips(a: set[int], b: set[int]) -> None:
    sa, sb, sab = HyperLogLog(), HyperLogLog(), HyperLogLog()
    sa.update(map(str, a))
    sb.update(map(str, b))
    sab.update(map(str, a | b))
    merged = HyperLogLog.from_text(sa.to_text())
    merged.merge_text(sb.to_text())
    assert merged.estimate() == sab.estimate()
    assert HyperLogLog.from_text(sab.to_text()).estimate() == sab.estimate()
    n = len(a | b)
    assert abs(sab.estimate() - n) <= max(3, 0.05 * n)


def test_stats_since_a_position(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 1, "v": "a"}]):
            buf.append(event)
        for position, ids in ((200, (1, 2)), (300, (3,)), (400, (4, 5, 6))):
            for event in tx(lsn(position), *ids):
                buf.append(event)
            buf.seal()
        everything = buf.stats(None)
        since_200 = buf.stats(lsn(200))
        nothing = buf.stats(lsn(400))
    assert (everything.changes, everything.segments, everything.resync_pending) == (6, 3, True)
    assert (since_200.changes, since_200.segments, since_200.resync_pending) == (4, 2, False)
    assert (since_200.first_position, since_200.last_position) == (lsn(300), lsn(400))
    assert since_200.distinct_keys_estimate == 4
    assert since_200.bytes == sum(r.bytes for r in buf.all_segments()[2:]) > 0
    assert since_200.oldest_change_age_s is not None and 0 <= since_200.oldest_change_age_s < 60
    assert (nothing.changes, nothing.distinct_keys_estimate, nothing.oldest_change_age_s) == (0, 0, None)
    assert everything.durable_position == lsn(400)


def test_seal_latency_is_recorded_and_visible_to_readers(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as buf:
        for event in initial_load(SIMPLE_SCHEMA, lsn(100)):
            buf.append(event)
        buf.append(insert(lsn(200), 1))
        time.sleep(0.05)
        buf.append(TxEnd(lsn(200)))
        buf.seal()
    stats = BufferReader(tmp_path, T).stats(None)
    assert stats.seals == 1
    assert stats.last_seal_latency_s is not None and 0.05 <= stats.last_seal_latency_s < 5
    assert stats.avg_seal_latency_s == stats.last_seal_latency_s


def test_resync_markers_and_pending_flag(tmp_path: Path) -> None:
    with ChangeBuffer(tmp_path, T, seal_interval=3600.0) as buf:
        for event in [*initial_load(SIMPLE_SCHEMA, lsn(100), [{"id": 1, "v": "a"}]), *tx(lsn(200), 2)]:
            buf.append(event)
        buf.append(ResyncBegin("journal lost"))
        assert BufferReader(tmp_path, T).stats(lsn(200)).resync_pending  # visible while in progress
        assert buf.durable_position() == lsn(200)  # the open transaction was sealed first
        buf.append(SnapshotRow({"id": 7, "v": "z"}))
        buf.append(ResyncEnd(lsn(250), 1))
        for event in tx(lsn(300), 8):
            buf.append(event)
        buf.seal()
        marker = buf.latest_resync()
        assert marker is not None
        assert (marker.begin_position, marker.end_position, marker.reason, marker.rows) == (
            lsn(200), lsn(250), "journal lost", 1)
        assert marker.segment is not None and buf.segment_ref(marker.segment).kind == "snapshot"
        assert buf.stats(lsn(200)).resync_pending and not buf.stats(lsn(250)).resync_pending
        assert [r.to_position for r in buf.segments(lsn(250), lsn(300))] == [lsn(300)]
    reader = BufferReader(tmp_path, T)
    assert reader.latest_resync() == marker
    assert not reader.stats(lsn(250)).resync_pending
