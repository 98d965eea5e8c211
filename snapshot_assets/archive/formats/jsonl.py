"""laredo's `jsonl` format: one Go-encoded JSON object per line (archive-format.md section 4).

Snapshot lines are rows; diff lines are `{"action","key","new"?,"old"?}` (Go sorts struct-less map
keys, and laredo's `omitempty` drops a nil or empty image). Bytes are Go's `encoding/json` output
exactly (see `gojson`), so an artifact written here is byte-identical to laredo's for the same rows.

Reading keeps integers exact (also beyond 2^53) where laredo's Go reader would round them to
doubles. Type mappings on a round trip are JSON's: an integral float below 1e21 comes back as an int
(Go writes `42.0` as `42`; a double beyond 2^53 comes back as the int of the shortest decimal Go
wrote, e.g. 4.059822926890535e16 as 40598229268905350, which converts back to the same double),
bytes/datetime/date come back as their base64/RFC 3339/ISO strings, a Decimal as the int or float
its text parses to, a tuple as a list, a lone surrogate as U+FFFD.

Lines are limited to 16 MiB including the newline, laredo's reader buffer: the writer refuses a row
that would not fit (instead of producing an artifact laredo cannot read) and the reader refuses a
longer line (instead of buffering an unbounded amount of a damaged file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Change, Row, as_row
from snapshot_assets.archive.errors import CorruptArtifact, EncodeError
from snapshot_assets.archive.keys import go_json_value, row_key, written_key

#: laredo's bufio.Scanner buffer: the longest line (newline included) its reader accepts.
MAX_LINE_BYTES = 16 * 1024 * 1024


def _encode_line(text: str, row_key: Callable[[], str]) -> bytes:
    data = text.encode("utf-8") + b"\n"
    if len(data) > MAX_LINE_BYTES:
        raise EncodeError(
            f"encoded line is {len(data)} bytes; laredo's jsonl reader accepts at most "
            f"{MAX_LINE_BYTES} (16 MiB)",
            row_key=row_key(),
        )
    return data


class JsonlSnapshotWriter:
    """Writes each row as one line as soon as it arrives (nothing is buffered here)."""

    def __init__(self, out: BinaryIO, key_fields: Sequence[str]) -> None:
        self._out = out
        self._key_fields = tuple(key_fields)

    def write(self, row: Row) -> None:
        def key() -> str:
            return row_key(row, self._key_fields)

        self._out.write(_encode_line(gojson.encode_row(row, key), key))

    def close(self) -> None:
        self._out.flush()


def diff_line(change: Change, key_fields: Sequence[str], old_text: str | None = None,
              new_text: str | None = None, written: str | None = None) -> bytes:
    """One change's line in a jsonl diff, newline included. `old_text`/`new_text`: the Go-JSON
    texts the images were decoded from (None: encode the image here). Images travel through the
    archive as such texts (`gojson.encode_row`'s, the state's and the buffer's), so a diff's line
    splices them instead of encoding each image again. `written`: the line's key (`written_key` with
    `go_json_value`) when the caller computed it."""
    def key() -> str:
        return change.key

    members = []
    if change.old:
        members.append(("old", old_text if old_text is not None else gojson.encode_row(change.old, key)))
    if change.new:
        members.append(("new", new_text if new_text is not None else gojson.encode_row(change.new, key)))
    text = written_key(change, key_fields, go_json_value) if written is None else written
    members += [("action", gojson.quote(change.action.value)), ("key", gojson.quote(text))]
    return _encode_line(gojson.encode_object(members), lambda: text)


class JsonlDiffWriter:
    """Writes each change as one line, in the order given (readers apply them in file order).

    The `key` is laredo's RowKey of the change's image as Go's JSON decoder reads it back (every
    number a float64: id 1000000 keys as `1e+06`, 2^53+1 as `9.007199254740992e+15`), which is
    what laredo's reader computes from the same row in a jsonl snapshot.
    """

    def __init__(self, out: BinaryIO, key_fields: Sequence[str]) -> None:
        self._out = out
        self._key_fields = tuple(key_fields)

    def write(self, change: Change) -> None:
        self._out.write(diff_line(change, self._key_fields))

    def close(self) -> None:
        self._out.flush()


def _lines(src: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(line number, content) of every non-empty line; `\\n` or `\\r\\n` endings, as Go's ScanLines."""
    number = 0
    while line := src.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise CorruptArtifact(f"jsonl line {number} is longer than {MAX_LINE_BYTES} bytes (16 MiB)")
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        if line:
            yield number, line


def _objects(src: BinaryIO) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, decoded object) for every line, which must hold one JSON object."""
    for number, line in _lines(src):
        try:
            value = gojson.loads(line)
        except CorruptArtifact as exc:
            raise CorruptArtifact(f"jsonl line {number}: {exc}") from None
        if not isinstance(value, dict):
            raise CorruptArtifact(f"jsonl line {number}: expected a JSON object, got {type(value).__name__}")
        yield number, value


def _change(number: int, obj: dict[str, Any]) -> Change:
    """A diff line as a Change, checked the way Go's typed unmarshal checks it."""
    action, key = obj.get("action"), obj.get("key", "")
    if not isinstance(action, str):
        raise CorruptArtifact(f"jsonl line {number}: 'action' must be a string, got {action!r}")
    if not isinstance(key, str):
        raise CorruptArtifact(f"jsonl line {number}: 'key' must be a string, got {key!r}")
    images = {}
    for name in ("old", "new"):
        image = obj.get(name)
        if image is not None and not isinstance(image, dict):
            raise CorruptArtifact(f"jsonl line {number}: {name!r} must be an object, got {image!r}")
        images[name] = as_row(image)
    try:
        parsed = Change.parse_action(action)
    except ValueError as exc:
        raise CorruptArtifact(f"jsonl line {number}: {exc}") from None
    return Change(parsed, key, images["old"], images["new"])


class JsonlFormat:
    """laredo's jsonl artifacts (format id `jsonl`, extension `.jsonl`)."""

    format_id = "jsonl"
    extension = ".jsonl"

    key_value = staticmethod(go_json_value)

    def snapshot_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> JsonlSnapshotWriter:
        return JsonlSnapshotWriter(out, key_fields)

    def diff_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> JsonlDiffWriter:
        return JsonlDiffWriter(out, key_fields)

    def read_snapshot(self, src: BinaryIO) -> Iterator[Row]:
        for _number, row in _objects(src):
            yield row

    def read_diff(self, src: BinaryIO) -> Iterator[Change]:
        for number, obj in _objects(src):
            yield _change(number, obj)
