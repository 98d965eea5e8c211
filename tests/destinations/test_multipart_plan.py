"""plan_parts as a property: any list of pieces becomes parts that S3 accepts and that concatenate to the pieces.

Sizes are scaled down (a `min_part` of a few bytes) so hypothesis explores the merging and splitting
rules across thousands of shapes in a second; the rules do not depend on the scale.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resources.destinations.multipart import (
    MIN_PART_SIZE,
    CopyRange,
    Fresh,
    FreshSlice,
    MultipartError,
    Piece,
    PlannedPart,
    check_parts,
    plan_parts,
)

OBJECTS = {"prev": bytes(range(200)), "other": bytes(reversed(range(200)))}


def _fresh_bytes(index: int, size: int) -> bytes:
    return bytes((index * 7 + i) % 256 for i in range(size))


def _piece_bytes(index: int, piece: Piece) -> bytes:
    if isinstance(piece, CopyRange):
        return OBJECTS[piece.key][piece.start:piece.start + piece.length]
    return _fresh_bytes(index, piece.size)


def _part_bytes(part: PlannedPart, pieces: list[Piece]) -> bytes:
    out = b""
    for segment in part.segments:
        if isinstance(segment, CopyRange):
            out += OBJECTS[segment.key][segment.start:segment.start + segment.length]
        else:
            piece = pieces[segment.piece]
            assert isinstance(piece, Fresh) and segment.offset + segment.length <= piece.size
            out += _fresh_bytes(segment.piece, piece.size)[segment.offset:segment.offset + segment.length]
    return out


@st.composite
def copy_ranges(draw: st.DrawFn) -> CopyRange:
    key = draw(st.sampled_from(sorted(OBJECTS)))
    start = draw(st.integers(0, 199))
    return CopyRange(key, start, draw(st.integers(0, 200 - start)))


pieces_strategy = st.lists(st.one_of(st.builds(Fresh, st.integers(0, 60)), copy_ranges()), max_size=30)


@settings(max_examples=600, deadline=None)
@given(pieces=pieces_strategy, min_part=st.integers(1, 20), spare=st.integers(0, 40))
def test_any_pieces_become_valid_parts_that_concatenate_to_the_pieces(pieces: list[Piece], min_part: int,
                                                                      spare: int) -> None:
    max_part = 2 * min_part + spare
    plan = plan_parts(pieces, min_part=min_part, max_part=max_part)

    assert [p.number for p in plan] == list(range(1, len(plan) + 1))
    check_parts([(p.number, p.size) for p in plan], "plan", min_part=min_part)  # what S3 checks at completion
    assert all(0 < p.size <= max_part for p in plan)
    expected = b"".join(_piece_bytes(i, p) for i, p in enumerate(pieces))
    assert b"".join(_part_bytes(p, pieces) for p in plan) == expected

    # Merged (fetched and re-uploaded) bytes stay bounded: a mixed part is under 2 * min_part, and a big
    # piece gives at most min_part of its head to one.
    assert all(p.size < 2 * min_part for p in plan if len(p.segments) > 1)
    merged, offset = [], 0
    for part in plan:
        if len(part.segments) > 1:
            merged.append((offset, offset + part.size))
        offset += part.size
    offset = 0
    for piece in pieces:
        if piece.size >= 2 * min_part:
            given_away = sum(max(0, min(end, offset + piece.size) - max(start, offset)) for start, end in merged)
            assert given_away <= min_part
        offset += piece.size


def test_adjacent_ranges_of_one_object_become_one_server_side_copy() -> None:
    mib = 1024 * 1024
    buckets = [CopyRange("prev", i * 2 * mib, 2 * mib) for i in range(5)]  # five small, contiguous buckets
    plan = plan_parts(buckets)
    assert [p.copy for p in plan] == [CopyRange("prev", 0, 10 * mib)]


def test_a_big_fresh_piece_keeps_parts_of_its_own_for_its_producer_to_write() -> None:
    plan = plan_parts([CopyRange("prev", 0, 100), Fresh(3 * MIN_PART_SIZE), Fresh(10)])
    # the small range borrows the fresh piece's head; the rest of it stands alone
    assert plan[0].segments == (CopyRange("prev", 0, 100), FreshSlice(1, 0, MIN_PART_SIZE - 100))
    assert plan[1].segments == (FreshSlice(1, MIN_PART_SIZE - 100, 2 * MIN_PART_SIZE + 100),)
    assert plan[2].segments == (FreshSlice(2, 0, 10),)


def test_nothing_to_write_plans_no_parts() -> None:
    assert plan_parts([]) == () and plan_parts([Fresh(0), CopyRange("prev", 5, 0)]) == ()


def test_too_many_parts_and_bad_pieces_are_refused() -> None:
    with pytest.raises(MultipartError, match="need 4 parts from number 1, beyond the 3 S3 allows"):
        plan_parts([Fresh(10)] * 4, min_part=10, max_part=20, max_parts=3)
    assert [p.number for p in plan_parts([Fresh(10)] * 2, min_part=10, max_part=20, first_number=7)] == [7, 8]
    with pytest.raises(MultipartError, match="piece 1: negative size -1"):
        plan_parts([Fresh(1), Fresh(-1)])
    with pytest.raises(MultipartError, match="piece 0: invalid range"):
        plan_parts([CopyRange("prev", -1, 5)])
