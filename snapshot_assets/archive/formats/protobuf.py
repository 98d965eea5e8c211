"""laredo's `protobuf` format: varint-delimited `SnapshotRow` / `DiffChange` messages (section 5).

An artifact is (unsigned varint length, message bytes) pairs back to back, no header or footer; an
empty artifact is zero bytes. Messages are serialized deterministically (map keys sorted) so equal
rows give equal bytes and the spec's vectors are reproduced exactly.

Rows travel as `google.protobuf.Struct`, whose numbers are doubles. laredo silently rounds integers
beyond ±2^53 into them; this format never changes a value, so it maps Python values to `Value` as:

- str, bool, None -> string_value, bool_value, null_value;
- float, and int within ±2^53 -> number_value;
- int beyond ±2^53 -> string_value holding its exact decimal text (the proto3 JSON convention for
  int64; `keys.typed_key` folds such strings back to the integer);
- Decimal -> string_value of its decimal text (exact; a double could not hold it);
- bytes -> base64 string_value, datetime -> RFC 3339 string_value, date -> `YYYY-MM-DD` (Go's JSON
  renderings, from `gojson`);
- dict -> struct_value, list/tuple -> list_value.

Reading maps back: an integral number_value within ±2^53 becomes an int (`{"id": 1}` round-trips as
int 1), any other number a float (NaN or ±Inf, which a Go writer can produce, are passed through),
strings stay strings. A truncated or undecodable stream is a CorruptArtifact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, TypeVar

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError, Message

from snapshot_assets.archive import gojson
from snapshot_assets.archive.changes import Change, Row, as_row
from snapshot_assets.archive.errors import CorruptArtifact
from snapshot_assets.archive.formats import struct_wire
from snapshot_assets.archive.gojson import MAX_SAFE_INT, Kind, UnsupportedValue
from snapshot_assets.archive.keys import row_key, written_key
from snapshot_assets.archive.proto.laredo.snapshotter.v1.artifact_pb2 import DiffChange, SnapshotRow

#: Protobuf's own ceiling on one message; a larger length prefix can only be damage.
MAX_MESSAGE_BYTES = 2**31 - 1

# --- Python -> Struct --------------------------------------------------------------------------


def _set_string(target: struct_pb2.Value, text: str) -> None:
    try:
        target.string_value = text
    except UnicodeEncodeError:  # lone surrogates: protobuf strings must be valid UTF-8
        target.string_value = gojson.valid_text(text)


def _set_int(target: struct_pb2.Value, value: int) -> None:
    if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        target.number_value = value
    else:
        target.string_value = gojson.int_text(value)


def _set_list(target: struct_pb2.Value, items: list[Any] | tuple[Any, ...]) -> None:
    values = target.list_value.values
    target.list_value.SetInParent()  # an empty list is still a list, not an unset value
    for item in items:
        set_value(values.add(), item)


def _set_struct(target: struct_pb2.Value, obj: Mapping[Any, Any]) -> None:
    fill_struct(target.struct_value, gojson.object_items(obj))


_SETTERS: dict[Kind, Callable[[struct_pb2.Value, Any], None]] = {
    Kind.NULL: lambda target, _value: setattr(target, "null_value", struct_pb2.NULL_VALUE),
    Kind.BOOL: lambda target, value: setattr(target, "bool_value", bool(value)),
    Kind.INT: _set_int,
    Kind.FLOAT: lambda target, value: setattr(target, "number_value", float(value)),
    Kind.STRING: lambda target, value: _set_string(target, str(value)),
    Kind.BYTES: lambda target, value: _set_string(target, gojson.bytes_text(value)),
    Kind.DATETIME: lambda target, value: _set_string(target, gojson.time_text(value)),
    Kind.DATE: lambda target, value: _set_string(target, gojson.date_text(value)),
    Kind.DECIMAL: lambda target, value: _set_string(target, gojson.decimal_text(value)),
    Kind.OBJECT: _set_struct,
    Kind.ARRAY: _set_list,
}


def set_value(target: struct_pb2.Value, value: Any) -> None:
    """Store `value` in `target` (see the module docstring for the mapping)."""
    _SETTERS[gojson.kind_of(value)](target, value)


def _entry(struct: struct_pb2.Struct, key: str) -> struct_pb2.Value:
    try:
        return struct.fields[key]
    except UnicodeEncodeError:  # lone surrogates in a key
        return struct.fields[gojson.valid_text(key)]


def fill_struct(target: struct_pb2.Struct, items: Iterator[tuple[str, Any]]) -> None:
    """Store (key, value) pairs in `target`, which is marked present even when there are none."""
    target.SetInParent()
    for key, value in items:
        set_value(_entry(target, key), value)


def fill_row(target: struct_pb2.Struct, row: Mapping[str, Any], row_key: Callable[[], str]) -> None:
    """`fill_struct` for a whole row: a value that cannot be stored names its column and row."""
    target.SetInParent()
    column = ""
    try:
        for column, value in gojson.object_items(row):
            set_value(_entry(target, column), value)
    except UnsupportedValue as exc:
        raise exc.in_row(str(column), row_key()) from None


# --- Struct -> Python --------------------------------------------------------------------------


def _number(value: float) -> int | float:
    if value.is_integer() and -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        return int(value)
    return value


def to_python(value: struct_pb2.Value) -> Any:
    """The Python value of a Struct `Value` (an unset kind reads as None, as Go's AsInterface does)."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return _number(value.number_value)
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return struct_to_dict(value.struct_value)
    if kind == "list_value":
        return [to_python(item) for item in value.list_value.values]
    return None


def struct_to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    return {key: to_python(item) for key, item in struct.fields.items()}


def _as_go(value: struct_pb2.Value) -> Any:
    """What Go's `structpb.Value.AsInterface` returns: numbers stay float64, strings stay strings."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return value.number_value
    if kind == "struct_value":
        return {key: _as_go(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_as_go(item) for item in value.list_value.values]
    return to_python(value)


def go_struct_value(value: Any) -> Any:
    """What laredo's Go reader holds for `value` once this format stored it in a Struct `Value`:
    a float64 for every number, the decimal string written for an integer beyond 2^53 or a
    Decimal, the text written for bytes and times (the same `set_value` the writers use)."""
    target = struct_pb2.Value()
    set_value(target, value)
    return _as_go(target)


# --- framing -----------------------------------------------------------------------------------


_varint = struct_wire.varint


class _Frames:
    """Reads (varint length, bytes) frames from any stream, in chunks: no per-byte reads on the
    source, no trust in a length prefix beyond protobuf's 2 GiB ceiling, short reads tolerated."""

    _CHUNK = 1 << 16

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self._buf = b""
        self._pos = 0
        self.offset = 0  # bytes of the artifact consumed so far, for error messages

    def _more(self) -> bool:
        chunk = self._src.read(self._CHUNK)
        if not chunk:
            return False
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _byte(self) -> int | None:
        if self._pos == len(self._buf) and not self._more():
            return None
        byte = self._buf[self._pos]
        self._pos += 1
        self.offset += 1
        return byte

    def _length(self) -> int | None:
        """The next length prefix, or None at a clean end of the artifact."""
        start = self.offset
        value = shift = 0
        while True:
            byte = self._byte()
            if byte is None:
                if self.offset == start:
                    return None
                raise CorruptArtifact(f"protobuf artifact truncated inside a length prefix at byte {start}")
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 64:
                raise CorruptArtifact(f"protobuf artifact has an over-long length prefix at byte {start}")
        if value > MAX_MESSAGE_BYTES:
            raise CorruptArtifact(f"protobuf length prefix {value} at byte {start} exceeds 2 GiB "
                                  f"(the {MAX_MESSAGE_BYTES}-byte message limit)")
        return value

    def _take(self, n: int) -> bytes:
        parts = [self._buf[self._pos : self._pos + n]]
        self._pos += len(parts[0])
        got = len(parts[0])
        while got < n:
            chunk = self._src.read(min(n - got, 1 << 24))
            if not chunk:
                raise CorruptArtifact(
                    f"protobuf artifact truncated: message at byte {self.offset} needs {n} bytes, "
                    f"only {got} remain"
                )
            parts.append(chunk)
            got += len(chunk)
        self.offset += n
        return b"".join(parts)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """(offset of the message, message bytes) for every frame."""
        while (length := self._length()) is not None:
            offset = self.offset
            yield offset, self._take(length)


_M = TypeVar("_M", bound=Message)


def _messages(src: BinaryIO, message_type: type[_M]) -> Iterator[_M]:
    for offset, data in _Frames(src):
        message = message_type()
        try:
            message.ParseFromString(data)
        except DecodeError as exc:
            raise CorruptArtifact(f"protobuf message at byte {offset} is not a "
                                  f"{message_type.DESCRIPTOR.name}: {exc}") from None
        yield message


def _image(message: DiffChange, name: str) -> Row | None:
    if not message.HasField(name):
        return None
    return as_row(struct_to_dict(getattr(message, name)))


# --- the format --------------------------------------------------------------------------------


def snapshot_record(row: Row, key_fields: Sequence[str]) -> bytes:
    """One row's record in a protobuf snapshot: the delimited SnapshotRow, exactly what the writer
    appends (the Spark state keeps it so a snapshot concatenates records instead of re-encoding)."""
    try:  # the bytes written directly (struct_wire.py); the message classes only for what it refuses
        data = struct_wire.field(1, struct_wire.row_struct(row, lambda: row_key(row, key_fields)))
    except struct_wire.NotPlain:
        message = SnapshotRow()
        fill_row(message.row, row, lambda: row_key(row, key_fields))
        data = message.SerializeToString(deterministic=True)
    return _varint(len(data)) + data


class ProtobufSnapshotWriter:
    """Writes one delimited SnapshotRow per row as it arrives."""

    def __init__(self, out: BinaryIO, key_fields: Sequence[str]) -> None:
        self._out = out
        self._key_fields = tuple(key_fields)

    def write(self, row: Row) -> None:
        self._out.write(snapshot_record(row, self._key_fields))

    def close(self) -> None:
        self._out.flush()


def _diff_message(change: Change, key: str) -> bytes:
    """`diff_record`'s message through the protobuf runtime (what struct_wire refuses)."""
    message = DiffChange(action=change.action.value)
    if change.old:
        fill_row(message.old, change.old, lambda: change.key)
    if change.new:
        fill_row(message.new, change.new, lambda: change.key)
    message.key = key
    return message.SerializeToString(deterministic=True)


def diff_record(change: Change, key_fields: Sequence[str], new_record: bytes | None = None,
                key: str | None = None, old_record: bytes | None = None) -> bytes:
    """One change's record in a protobuf diff: the delimited DiffChange (fields in number order;
    proto3 leaves out an empty action or key, and an image that is absent or empty).

    `new_record`: the `snapshot_record` of the change's new image, when the caller made it (a diff's
    new image enters the state with it): a SnapshotRow is field 1 holding the Struct, and the
    DiffChange's `new` is field 4 holding the same Struct, so its bytes are reused, not encoded again.
    `old_record` likewise for the old image (`old` is field 3). `key`: the record's key
    (`written_key` with `go_struct_value`) when the caller computed it.
    """
    key = gojson.valid_text(written_key(change, key_fields, go_struct_value) if key is None else key)
    try:
        data = b"".join((
            struct_wire.field(1, struct_wire.encode_text(change.action.value)) if change.action.value else b"",
            struct_wire.field(2, struct_wire.encode_text(key)) if key else b"",
            (_as_field(old_record, _OLD_TAG) if old_record is not None else
             struct_wire.field(3, struct_wire.row_struct(change.old, lambda: change.key))) if change.old else b"",
            (_as_field(new_record, _NEW_TAG) if new_record is not None else
             struct_wire.field(4, struct_wire.row_struct(change.new, lambda: change.key))) if change.new else b""))
    except struct_wire.NotPlain:
        data = _diff_message(change, key)
    return _varint(len(data)) + data


# SnapshotRow.row (field 1), DiffChange.old (field 3) and .new (field 4): all length-delimited Structs.
_ROW_TAG, _OLD_TAG, _NEW_TAG = 0x0A, 0x1A, 0x22


def _as_field(record: bytes, tag: int) -> bytes:
    """The Struct a delimited SnapshotRow holds, as field `tag` of another message (same payload)."""
    start = 0
    while record[start] & 0x80:  # the record's own length prefix
        start += 1
    if record[start + 1] != _ROW_TAG:
        raise ValueError("not a delimited SnapshotRow")
    return bytes((tag,)) + record[start + 2:]


class ProtobufDiffWriter:
    """Writes one delimited DiffChange per change, in the order given; empty images are omitted.

    The `key` is laredo's RowKey of the change's image as stored in a Struct and read back by Go
    (`go_struct_value`): an id within 2^53 is a double (1000000 keys as `1e+06`), an id beyond it
    the decimal string this format writes (`9007199254740993`), exactly what laredo's reader
    computes from the same row in a protobuf snapshot.
    """

    def __init__(self, out: BinaryIO, key_fields: Sequence[str]) -> None:
        self._out = out
        self._key_fields = tuple(key_fields)

    def write(self, change: Change) -> None:
        self._out.write(diff_record(change, self._key_fields))

    def close(self) -> None:
        self._out.flush()


class ProtobufFormat:
    """laredo's protobuf artifacts (format id `protobuf`, extension `.pb`)."""

    format_id = "protobuf"
    extension = ".pb"

    key_value = staticmethod(go_struct_value)

    def snapshot_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> ProtobufSnapshotWriter:
        return ProtobufSnapshotWriter(out, key_fields)

    def diff_writer(self, out: BinaryIO, key_fields: Sequence[str] = ("id",)) -> ProtobufDiffWriter:
        return ProtobufDiffWriter(out, key_fields)

    def read_snapshot(self, src: BinaryIO) -> Iterator[Row]:
        for message in _messages(src, SnapshotRow):
            yield struct_to_dict(message.row)

    def read_diff(self, src: BinaryIO) -> Iterator[Change]:
        for message in _messages(src, DiffChange):
            try:
                action = Change.parse_action(message.action)
            except ValueError as exc:
                raise CorruptArtifact(f"protobuf diff: {exc}") from None
            yield Change(action, message.key, _image(message, "old"), _image(message, "new"))
