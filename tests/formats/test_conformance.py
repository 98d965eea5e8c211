"""One conformance suite every registered format passes (laredo's formattest, extended).

Whatever the encoding, a format must: report its id and extension, round-trip laredo's snapshot and
diff cases, write and read an empty artifact, stream (no list of every row, on either side),
refuse NaN/Infinity and unsupported values with an EncodeError naming the column and the row key,
and turn damaged input into a CorruptArtifact.
"""

from __future__ import annotations

import io
import math
import tempfile
import tracemalloc
from collections.abc import Iterator
from typing import Any, BinaryIO

import pytest

from snapshot_assets.archive.changes import Action, Change, Row
from snapshot_assets.archive.errors import CorruptArtifact, EncodeError
from snapshot_assets.archive.formats import FORMATS, Format
from snapshot_assets.archive.formats import parquet as parquet_format


@pytest.fixture(params=sorted(FORMATS))
def fmt(request: pytest.FixtureRequest) -> Format:
    return FORMATS[request.param]


def write_snapshot(fmt: Format, rows: Any, out: BinaryIO | None = None) -> BinaryIO:
    out = out if out is not None else io.BytesIO()
    writer = fmt.snapshot_writer(out)
    for row in rows:
        writer.write(row)
    writer.close()
    out.seek(0)
    return out


def write_diff(fmt: Format, changes: Any, out: BinaryIO | None = None) -> BinaryIO:
    out = out if out is not None else io.BytesIO()
    writer = fmt.diff_writer(out)
    for change in changes:
        writer.write(change)
    writer.close()
    out.seek(0)
    return out


# laredo's formattest cases (snapshotter/formattest/formattest.go).
LAREDO_ROWS: list[Row] = [
    {"id": "1", "name": "alice", "score": 42.0, "active": True},
    {"id": "2", "name": "bob", "score": 0.0, "active": False, "note": None},
]
LAREDO_CHANGES = [
    Change(Action.INSERT, "3", new={"id": "3", "name": "carol"}),
    Change(Action.UPDATE, "1", old={"id": "1", "name": "alice"}, new={"id": "1", "name": "alice2"}),
    Change(Action.DELETE, "2", old={"id": "2", "name": "bob"}),
]


def test_meta(fmt: Format) -> None:
    assert fmt.format_id and FORMATS[fmt.format_id] is fmt
    assert fmt.extension.startswith(".") and len(fmt.extension) > 1


def test_snapshot_round_trip(fmt: Format) -> None:
    got = list(fmt.read_snapshot(write_snapshot(fmt, LAREDO_ROWS)))
    assert got == LAREDO_ROWS
    assert "note" not in got[0] and got[1]["note"] is None  # absent and null stay different


def test_diff_round_trip(fmt: Format) -> None:
    assert list(fmt.read_diff(write_diff(fmt, LAREDO_CHANGES))) == LAREDO_CHANGES


def test_diff_round_trip_with_truncate_and_image_shapes(fmt: Format) -> None:
    changes = [
        Change(Action.TRUNCATE),
        Change(Action.INSERT, "7", new={"id": 7, "tags": ["a"], "meta": {"k": 1}}),
        Change(Action.DELETE, "8", old={"id": 8}),  # a narrower image than the insert's
        Change(Action.UPDATE, "7", old={"id": 7}, new={"id": 7, "tags": None}),
    ]
    assert list(fmt.read_diff(write_diff(fmt, changes))) == changes


def test_empty_images_read_back_as_absent(fmt: Format) -> None:
    got = list(fmt.read_diff(write_diff(fmt, [Change(Action.INSERT, "1", old={}, new={"id": 1})])))
    assert got == [Change(Action.INSERT, "1", new={"id": 1})]


def test_empty_artifacts(fmt: Format) -> None:
    snapshot, diff = write_snapshot(fmt, []), write_diff(fmt, [])
    if fmt.format_id in ("jsonl", "protobuf"):
        assert snapshot.getvalue() == diff.getvalue() == b""  # type: ignore[attr-defined]
    assert list(fmt.read_snapshot(snapshot)) == []
    assert list(fmt.read_diff(diff)) == []


def test_rows_without_columns(fmt: Format) -> None:
    assert list(fmt.read_snapshot(write_snapshot(fmt, [{}, {}]))) == [{}, {}]


def test_writers_leave_the_stream_open(fmt: Format) -> None:
    out = io.BytesIO()
    write_snapshot(fmt, LAREDO_ROWS, out)
    write_diff(fmt, LAREDO_CHANGES, io.BytesIO())
    assert not out.closed


def test_rows_are_captured_at_write_time(fmt: Format) -> None:
    row: Row = {"id": 1, "name": "before"}
    out = io.BytesIO()
    writer = fmt.snapshot_writer(out)
    writer.write(row)
    row["name"] = "after"  # a caller reusing its dict must not rewrite what was written
    writer.close()
    out.seek(0)
    assert list(fmt.read_snapshot(out)) == [{"id": 1, "name": "before"}]


class OneWayStream(io.RawIOBase):
    """A source that cannot seek, like an HTTP body."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(min(len(buffer), 1000))  # short reads, too
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_reads_from_a_non_seekable_stream(fmt: Format) -> None:
    snapshot = write_snapshot(fmt, LAREDO_ROWS).read()
    diff = write_diff(fmt, LAREDO_CHANGES).read()
    assert list(fmt.read_snapshot(io.BufferedReader(OneWayStream(snapshot)))) == LAREDO_ROWS
    assert list(fmt.read_diff(OneWayStream(diff))) == LAREDO_CHANGES  # type: ignore[arg-type]


# --- streaming --------------------------------------------------------------------------------

STREAM_ROWS = 50_000


def stream_rows() -> Iterator[Row]:
    for i in range(STREAM_ROWS):
        yield {"id": i, "name": f"user-{i}", "score": i * 0.5, "active": i % 2 == 0, "note": None if i % 3 else "x"}


def traced_peak(action: Any) -> tuple[Any, int]:
    tracemalloc.reset_peak()
    result = action()
    return result, tracemalloc.get_traced_memory()[1]


@pytest.mark.slow
def test_streams_50k_rows_without_materializing(fmt: Format, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parquet writer keeps its spool in memory up to a budget (32 MiB) by design; shrink the
    # budget so this test measures streaming rather than that budget.
    monkeypatch.setattr(parquet_format, "SPOOL_MEMORY_BYTES", 1 << 20)
    write_snapshot(fmt, [{"id": 0}])  # warm up: lazy imports must not count as row memory
    list(fmt.read_snapshot(write_snapshot(fmt, [{"id": 0}])))

    with tempfile.TemporaryFile() as out:
        tracemalloc.start()
        try:
            _, materialized = traced_peak(lambda: len(list(stream_rows())))
            _, write_peak = traced_peak(lambda: write_snapshot(fmt, stream_rows(), out))
            (count, ids), read_peak = traced_peak(lambda: count_and_sum_ids(fmt.read_snapshot(out)))
        finally:
            tracemalloc.stop()
    assert (count, ids) == (STREAM_ROWS, STREAM_ROWS * (STREAM_ROWS - 1) // 2)
    # Holding every row would take `materialized` bytes; a streaming writer/reader holds a batch at most.
    assert write_peak < materialized / 2, (write_peak, materialized)
    assert read_peak < materialized / 2, (read_peak, materialized)


def count_and_sum_ids(rows: Iterator[Row]) -> tuple[int, int]:
    count = total = 0
    for row in rows:
        count += 1
        total += row["id"]
    return count, total


def test_readers_are_lazy(fmt: Format) -> None:
    rows = fmt.read_snapshot(write_snapshot(fmt, ({"id": i} for i in range(20_000))))
    assert next(rows) == {"id": 0}  # the first row arrives without the reader draining the rest
    assert sum(1 for _ in rows) == 19_999


# --- refusing what cannot be encoded ----------------------------------------------------------

BAD_VALUES = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": -math.inf,
    "nested-nan": {"inner": [1.0, float("nan")]},
    "object": object(),
    "nested-function": {"inner": [lambda: 0]},  # not even picklable
}


@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
def test_snapshot_refuses_unencodable_values_naming_column_and_row(fmt: Format, bad: str) -> None:
    rows = [{"id": 6, "score": 1.0}, {"id": 7, "name": "x", "score": BAD_VALUES[bad]}]
    with pytest.raises(EncodeError) as caught:
        write_snapshot(fmt, rows)
    assert (caught.value.column, caught.value.row_key) == ("score", "7")
    assert "'score'" in str(caught.value) and "'7'" in str(caught.value)


@pytest.mark.parametrize("image", ["old", "new"])
def test_diff_refuses_nan_naming_column_and_change_key(fmt: Format, image: str) -> None:
    bad = {"id": 9, "score": float("nan")}
    change = Change(Action.UPDATE, "9", **{"old": {"id": 9}, "new": {"id": 9}, image: bad})
    with pytest.raises(EncodeError) as caught:
        write_diff(fmt, [change])
    assert (caught.value.column, caught.value.row_key) == ("score", "9")


def test_row_key_uses_the_key_fields(fmt: Format) -> None:
    writer = fmt.snapshot_writer(io.BytesIO(), key_fields=("tenant", "id"))
    with pytest.raises(EncodeError, match=r"row key '\[acme 1\]'"):
        writer.write({"tenant": "acme", "id": 1, "v": float("inf")})
        writer.close()


# --- damaged input ----------------------------------------------------------------------------


def test_garbage_is_corrupt(fmt: Format) -> None:
    with pytest.raises(CorruptArtifact):
        list(fmt.read_snapshot(io.BytesIO(b"\xff\xfe this is not an artifact \x00\x01\x02")))
    with pytest.raises(CorruptArtifact):
        list(fmt.read_diff(io.BytesIO(b"\xff\xfe this is not an artifact \x00\x01\x02")))


@pytest.mark.parametrize("drop", [2, 37, 1010])  # jsonl: never a whole number of lines
def test_truncated_artifact_is_corrupt(fmt: Format, drop: int) -> None:
    rows = [{"id": i, "name": f"user-{i}"} for i in range(100)]
    data = write_snapshot(fmt, rows).read()
    assert len(data) > drop
    with pytest.raises(CorruptArtifact):
        list(fmt.read_snapshot(io.BytesIO(data[:-drop])))
