"""The encoded size of a diff in one format, computed by Spark without writing the diff.

Why: the re-base triggers `max_diff_bytes` / `max_diff_fraction` judge the diff that would be
written. The buffer's own bytes (compressed change segments, every intermediate change of a hot
key) say little about that: a key updated 1,000 times is one line of the diff, and an UPDATE's
line carries both complete images. So the size is that of the net changes (`window.net_window`,
NET_DDL rows), encoded as the format's writer would encode them, summed where the rows are:

- jsonl: exactly, as one Spark SQL aggregate. A diff line is Go's `{"action":A,"key":K,"new":N,
  "old":O}` + newline with `new`/`old` left out when empty (laredo's `omitempty`), the images are
  the Go-JSON texts the writer copies byte for byte, and `key` is the change key quoted the way Go
  quotes strings (HTML-safe escapes), so each line's byte length is arithmetic on octet lengths
  and counts of escaped characters. No row leaves the executors, nothing is decoded.
- any other format (protobuf, parquet): each task encodes its changes with the format's own diff
  writer into a sink that only counts bytes, and returns the count. Protobuf artifacts are the
  tasks' messages concatenated, so the sum is exact; for parquet, whose artifact is one file, the
  sum of the tasks' files is an estimate (one footer and row-group layout per task).

A TRUNCATE in the window adds its line, encoded by the driver with the real writer (one change).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from snapshot_assets.archive.changes import Action, Change
from snapshot_assets.archive.formats import get_format
from snapshot_assets.spark.effects import decode_row

_SIZE_DDL = "bytes BIGINT"
_SIZE_ARROW = pa.schema([("bytes", pa.int64())])

# Go's encoding/json string escapes (archive/gojson.py `quote`), as Java regular expressions over
# the characters each one widens: a two-byte escape adds 1 byte, a `\u00XX` escape of a one-byte
# character adds 5, of U+2028/U+2029 (three bytes in UTF-8) adds 3. Lone surrogates cannot occur:
# Spark strings are valid UTF-8.
_WIDENED = (
    ('["\\\\\\x08\\t\\n\\f\\r]', 1),
    ("[\\x00-\\x07\\x0b\\x0e-\\x1f<>&]", 5),
    ("[\\u2028\\u2029]", 3),
)
_EMPTY_IMAGES = ("{}", "null")  # decoded as an empty or missing image: the writer omits the member


def quoted_bytes(text: Column) -> Column:
    """The byte length of `text` as a Go JSON string literal (quotes included)."""
    size = F.octet_length(text) + F.lit(2)
    for pattern, extra in _WIDENED:
        escaped = F.length(text) - F.length(F.regexp_replace(text, pattern, ""))
        size = size + escaped * F.lit(extra)
    return size


def _member_bytes(name: str, image: Column) -> Column:
    """`,"name":<image>` when the writer writes the image, else nothing."""
    written = image.isNotNull() & ~image.isin(*_EMPTY_IMAGES)
    return F.when(written, F.lit(len(f',"{name}":')) + F.octet_length(image)).otherwise(F.lit(0))


def jsonl_line_bytes() -> Column:
    """The byte length of a NET_DDL row's jsonl diff line, newline included."""
    fixed = len('{"action":') + len(',"key":') + len("}\n")
    return (F.lit(fixed) + quoted_bytes(F.col("action")) + quoted_bytes(F.col("change_key"))
            + _member_bytes("new", F.col("new")) + _member_bytes("old", F.col("old")))


class _CountingSink(io.RawIOBase):
    """A binary stream that keeps only the number of bytes written to it."""

    def __init__(self) -> None:
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.count += size
        return size

    def tell(self) -> int:
        return self.count


def _encoded_bytes(changes: Iterable[Change], format_id: str, key_fields: Sequence[str]) -> int:
    sink = _CountingSink()
    writer = get_format(format_id).diff_writer(sink, key_fields)  # type: ignore[arg-type]
    wrote = False
    for change in changes:
        writer.write(change)
        wrote = True
    if wrote:  # an empty task writes no part at all
        writer.close()
    return sink.count


def _net_changes(batches: Iterable[Any]) -> Iterator[Change]:
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in ("action", "change_key", "old", "new")]
        for action, key, old, new in zip(*columns, strict=True):
            yield Change(Change.parse_action(action), key, decode_row(old), decode_row(new))


def _task_bytes(batches: Iterable[Any], format_id: str, key_fields: tuple[str, ...]) -> Iterator[Any]:
    size = _encoded_bytes(_net_changes(batches), format_id, key_fields)
    yield pa.RecordBatch.from_arrays([pa.array([size], pa.int64())], schema=_SIZE_ARROW)


def encoded_diff_bytes(net: DataFrame, truncated: bool, format_id: str, key_fields: Sequence[str]) -> int:
    """The bytes of the diff of `net` (NET_DDL rows; a TRUNCATE first when `truncated`) in `format_id`."""
    fields = tuple(key_fields)
    if format_id == "jsonl":
        total = net.select(F.sum(jsonl_line_bytes()).alias("bytes")).first()
    else:
        func = functools.partial(_task_bytes, format_id=format_id, key_fields=fields)
        total = (net.select("action", "change_key", "old", "new").mapInArrow(func, _SIZE_DDL)
                 .select(F.sum("bytes").alias("bytes")).first())
    size = int(total["bytes"] or 0) if total is not None else 0
    if truncated:
        size += _encoded_bytes([Change(Action.TRUNCATE)], format_id, fields)
    return size
