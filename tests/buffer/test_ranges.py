"""segments(from, to] returns exactly the changes with from < position <= to, for any stream and cut.

Random transaction streams (change-free transactions, position-less entries, transactions larger
than a row group), random seal points (forced seals mid-transaction included) and random range
ends, on transaction boundaries or between them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resources.buffer import ChangeBuffer
from resources.subscribers.events import TxEnd
from snapshot_assets.archive.positions import parse_lsn
from tests.buffer.helpers import SIMPLE_SCHEMA, initial_load, insert, lsn, read_refs

T = "public.t"
START = 1000


@dataclass(frozen=True)
class Tx:
    position: int
    ids: tuple[int, ...]
    unpositioned: tuple[bool, ...]  # entries sent without a position (never the last one)
    seal_inside: bool  # a forced seal in the middle of the transaction
    seal_after: bool


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Tx], int]:
    position, next_id, txs = START, 1, []
    for _ in range(draw(st.integers(1, 25))):
        position += draw(st.integers(1, 40))
        size = draw(st.integers(0, 7))
        ids = tuple(range(next_id, next_id + size))
        next_id += size
        flags = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        unpositioned = tuple(f and i < size - 1 for i, f in enumerate(flags))
        txs.append(Tx(position, ids, unpositioned, draw(st.booleans()), draw(st.booleans())))
    return txs, draw(st.sampled_from([2, 3, 1000]))


def build(root: str, txs: list[Tx], row_group_rows: int) -> ChangeBuffer:
    buf = ChangeBuffer(root, T, seal_interval=3600.0, row_group_rows=row_group_rows)
    for event in initial_load(SIMPLE_SCHEMA, lsn(START)):
        buf.append(event)
    for t in txs:
        for i, (ident, bare) in enumerate(zip(t.ids, t.unpositioned, strict=True)):
            buf.append(insert("" if bare else lsn(t.position), ident))
            if t.seal_inside and i == len(t.ids) // 2:
                buf.seal()
        buf.append(TxEnd(lsn(t.position)))
        if t.seal_after:
            buf.seal()
    buf.seal()
    return buf


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), data=st.data())
def test_segments_return_exactly_the_range(stream: tuple[list[Tx], int], data: st.DataObject) -> None:
    txs, row_group_rows = stream
    end = txs[-1].position
    with tempfile.TemporaryDirectory() as root:
        buf = build(root, txs, row_group_rows)
        try:
            assert buf.durable_position() == lsn(end)
            segs = [r for r in buf.all_segments() if r.kind == "changes"]
            # never a partial transaction in a sealed segment: every segment ends on a TxEnd, and
            # holds exactly the changes of the transactions in its range
            for seg in segs:
                assert seg.to_position in {lsn(t.position) for t in txs}
                expected = changes_in(txs, seg.from_position, seg.to_position)
                assert seg.changes == expected
            for _ in range(4):
                lo = data.draw(st.integers(START, end), label="from")
                hi = data.draw(st.integers(lo, end), label="to")
                got = [r["new"] for r in read_refs(buf.segments(lsn(lo), lsn(hi)))]
                want = [f'{{"id":{i},"v":"x"}}' for t in txs if lo < t.position <= hi for i in t.ids]
                assert got == want, (lo, hi)
        finally:
            buf.close()


def changes_in(txs: list[Tx], low: str | None, high: str) -> int:
    """How many changes the transactions in (low, high] hold."""
    lo = START if low is None else parse_lsn(low)
    hi = parse_lsn(high)
    assert lo is not None and hi is not None
    return sum(len(t.ids) for t in txs if lo < t.position <= hi)
