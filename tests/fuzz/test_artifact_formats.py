"""Fuzz the artifact readers (jsonl, protobuf, parquet): artifact objects are outside input.

Valid artifacts come from each format's own writer (snapshots and diffs of small random rows),
then are mutated as bytes; reading must yield rows/changes or raise CorruptArtifact. The bounds
(jsonl's 16 MiB line, protobuf's length-prefix ceiling) are checked with inputs that claim more.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.errors import CorruptArtifact
from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.formats.jsonl import MAX_LINE_BYTES
from snapshot_assets.archive.formats.protobuf import MAX_MESSAGE_BYTES
from snapshot_assets.archive.gojson import MAX_INT_DIGITS
from tests.fuzz.support import fuzz_settings, guarded, inputs, varint

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                       st.dictionaries(st.text(max_size=3), inner, max_size=2)),
                      max_leaves=4)
rows = st.dictionaries(st.sampled_from(["id", "name", "n", "tags"]), values, min_size=1, max_size=4)
changes = st.builds(Change, st.sampled_from(list(Action)), st.text(max_size=6), st.one_of(st.none(), rows),
                    st.one_of(st.none(), rows))


def _written(format_id: str, kind: str) -> st.SearchStrategy[bytes]:
    fmt = FORMATS[format_id]

    def encode(items: list[Any]) -> bytes:
        out = io.BytesIO()
        writer = fmt.snapshot_writer(out) if kind == "snapshot" else fmt.diff_writer(out)
        for item in items:
            writer.write(item)
        writer.close()
        return out.getvalue()

    return st.lists(rows if kind == "snapshot" else changes, max_size=4).map(encode)


def _reader(format_id: str, kind: str) -> Callable[[bytes], None]:
    fmt = FORMATS[format_id]
    read: Callable[[io.BytesIO], Iterator[Any]] = fmt.read_snapshot if kind == "snapshot" else fmt.read_diff

    def consume(data: bytes) -> None:
        for _ in read(io.BytesIO(data)):
            pass

    return consume


CASES = [(f, k) for f in ("jsonl", "protobuf") for k in ("snapshot", "diff")]


@pytest.mark.parametrize(("format_id", "kind"), CASES)
@fuzz_settings(250)
@given(data=st.data())
def test_row_formats_read_or_fail_cleanly(format_id: str, kind: str, data: st.DataObject) -> None:
    blob = data.draw(inputs(_written(format_id, kind)))
    guarded(lambda: _reader(format_id, kind)(blob), (CorruptArtifact,))


@pytest.mark.parametrize("kind", ["snapshot", "diff"])
@fuzz_settings(60)
@given(data=st.data())
def test_parquet_reads_or_fails_cleanly(kind: str, data: st.DataObject) -> None:
    blob = data.draw(inputs(_written("parquet", kind)))
    guarded(lambda: _reader("parquet", kind)(blob), (CorruptArtifact,))


def test_parquet_with_a_column_name_that_is_not_utf8_is_corrupt() -> None:
    """Found by the fuzz test above: Arrow raised UnicodeDecodeError while opening such a file."""
    out = io.BytesIO()
    writer = FORMATS["parquet"].snapshot_writer(out)
    writer.write({"id": 1, "zqxjk": "v"})
    writer.close()
    blob = out.getvalue()
    assert blob.count(b"zqxjk") >= 1
    error = guarded(lambda: _reader("parquet", "snapshot")(blob.replace(b"zqxjk", b"\xff" * 5)), (CorruptArtifact,))
    assert error is not None and "UTF-8" in str(error), error


@pytest.mark.parametrize("kind", ["snapshot", "diff"])
def test_parquet_with_a_text_value_that_is_not_utf8_is_corrupt(kind: str) -> None:
    """Found by the fuzz test above: a string value's bytes reached Python's decoder unchecked."""
    out = io.BytesIO()
    fmt = FORMATS["parquet"]
    if kind == "snapshot":
        snapshot = fmt.snapshot_writer(out)
        snapshot.write({"id": 1, "n": "zqxjkwvbyp"})
        snapshot.close()
    else:
        diff = fmt.diff_writer(out)
        diff.write(Change(Action.UPDATE, "zqxjkwvbyp", {"id": 1}, {"id": 1, "n": "zqxjkwvbyp"}))
        diff.close()
    blob = out.getvalue()
    assert blob.count(b"zqxjkwvbyp") >= 1
    error = guarded(lambda: _reader("parquet", kind)(blob.replace(b"zqxjkwvbyp", b"\xff" * 10)), (CorruptArtifact,))
    assert error is not None and "UTF8" in str(error).replace("-", ""), error


@pytest.mark.parametrize("kind", ["snapshot", "diff"])
def test_protobuf_refuses_a_huge_length_prefix_before_allocating(kind: str) -> None:
    for length in (2**40, MAX_MESSAGE_BYTES + 1, 2**63):
        error = guarded(lambda n=length: _reader("protobuf", kind)(varint(n) + b"\x0a\x00"), (CorruptArtifact,))
        assert error is not None and str(MAX_MESSAGE_BYTES) in str(error), error


def test_protobuf_refuses_a_deeply_nested_struct() -> None:
    value = b""
    for _ in range(200):  # Struct{fields: {"a": Value{struct_value: ...}}} nested 200 deep
        nested = b"\x2a" + varint(len(value)) + value  # Value.struct_value
        entry = b"\x0a\x01a\x12" + varint(len(nested)) + nested  # fields entry {"a": nested}
        value = b"\x0a" + varint(len(entry)) + entry
    message = b"\x0a" + varint(len(value)) + value
    error = guarded(lambda: _reader("protobuf", "snapshot")(varint(len(message)) + message), (CorruptArtifact,))
    assert error is not None


def test_jsonl_refuses_a_line_over_the_bound() -> None:
    line = b'{"id":"' + b"x" * MAX_LINE_BYTES + b'"}\n'
    error = guarded(lambda: _reader("jsonl", "snapshot")(line), (CorruptArtifact,))
    assert error is not None and str(MAX_LINE_BYTES) in str(error), error


def test_jsonl_refuses_deep_nesting() -> None:
    line = b'{"id":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    error = guarded(lambda: _reader("jsonl", "snapshot")(line), (CorruptArtifact,))
    assert error is not None and "line 1" in str(error), error


def test_jsonl_refuses_an_integer_longer_than_the_bound_without_converting_it() -> None:
    line = b'{"id":' + b"7" * (4 * MAX_INT_DIGITS) + b"}\n"  # quadratic int() would take minutes
    error = guarded(lambda: _reader("jsonl", "snapshot")(line), (CorruptArtifact,))
    assert error is not None and str(MAX_INT_DIGITS) in str(error), error


def test_jsonl_reads_the_widest_integer_exactly() -> None:
    value = -(10**MAX_INT_DIGITS - 1)
    rows: list[Any] = []
    line = b'{"id":-' + b"9" * MAX_INT_DIGITS + b"}\n"
    assert guarded(lambda: rows.extend(FORMATS["jsonl"].read_snapshot(io.BytesIO(line))), (CorruptArtifact,)) is None
    assert rows == [{"id": value}]
