"""Decoder for PostgreSQL's built-in `pgoutput` logical replication messages, protocol version 1.

Written from the "Logical Replication Message Formats" chapter of the PostgreSQL manual, so no
extension or third-party decoder is needed on either side. Only what protocol version 1 sends
without the `binary`, `streaming` or `messages` options is accepted; anything else is a
`PgOutputError`, never a silent skip, because a misread message would corrupt the archive.

Column values stay text (`str`), `None` for SQL NULL, or `UNCHANGED` for a TOASTed value the
server did not resend: type conversion belongs to `pgtypes`, so the initial copy and the stream
share one converter.
"""

from __future__ import annotations

import datetime as _dt
import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

_PG_EPOCH: Final = _dt.datetime(2000, 1, 1, tzinfo=_dt.UTC)

REPLICA_IDENTITY_KEY: Final = 1  # RelationColumn.flags bit: the column is part of the replica identity


class PgOutputError(ValueError):
    """A message that is not valid pgoutput protocol version 1 (or uses an option we never request)."""


class Unchanged(enum.Enum):
    """The type of `UNCHANGED`: an unchanged TOASTed value the server did not send ('u')."""

    TOAST = "unchanged-toast"


UNCHANGED: Final = Unchanged.TOAST

Value = str | None | Unchanged
TupleData = tuple[Value, ...]
OldKind = Literal["K", "O"]


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a committed transaction: `final_lsn` is the LSN of its commit record."""

    final_lsn: int
    commit_time: _dt.datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction: `commit_lsn` (the commit record) and `end_lsn` (just past it)."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: _dt.datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """The replication origin a transaction came from (sent after Begin when it has one)."""

    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_identity(self) -> bool:
        """Part of the replica identity (every column under REPLICA IDENTITY FULL)."""
        return bool(self.flags & REPLICA_IDENTITY_KEY)


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape as the stream will encode it; sent before its first change and after DDL."""

    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeMessage:
    """A non-built-in type referenced by a later Relation (domains, enums, composites...)."""

    oid: int
    namespace: str
    name: str


# The row messages are NamedTuples rather than frozen dataclasses: one is built per change, and a
# frozen dataclass's __init__ (object.__setattr__ per field) costs several times more.
class Insert(NamedTuple):
    relation_oid: int
    new: TupleData


class Update(NamedTuple):
    """`old` is the old key ('K', when the identity changed) or the whole old row ('O', FULL)."""

    relation_oid: int
    old_kind: OldKind | None
    old: TupleData | None
    new: TupleData


class Delete(NamedTuple):
    relation_oid: int
    old_kind: OldKind
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A `pg_logical_emit_message` record (only sent with the `messages` option; decoded, ignored)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = (Begin | Commit | Origin | Relation | TypeMessage | Insert | Update | Delete | Truncate
           | LogicalMessage)

_TEXT, _NULL, _UNCHANGED_TOAST, _BINARY = b"t"[0], b"n"[0], b"u"[0], b"b"[0]
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_UINT64 = struct.Struct("!Q")
_INT64 = struct.Struct("!q")


def _utf8(data: bytes, what: str) -> str:
    """`data` as text; the server's encoding is UTF-8 (checked at connect), so anything else is damage."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PgOutputError(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


class _Reader:
    """A cursor over one message's bytes that raises `PgOutputError` instead of reading past the end."""

    __slots__ = ("_buf", "_pos")

    def __init__(self, payload: bytes) -> None:
        self._buf = payload
        self._pos = 0

    def _take(self, size: int) -> int:
        start = self._pos
        end = start + size
        if end > len(self._buf):
            raise PgOutputError(f"message truncated: needs {end} bytes, has {len(self._buf)}")
        self._pos = end
        return start

    def length(self, what: str) -> int:
        """An Int32 length or count of `what`, checked against the bytes left in the message.

        The message is the bound: a length prefix can never make the decoder read (or expect)
        more than the server sent, and a negative one is damage, not "no data".
        """
        value = self.int32()
        left = self.left()
        if not 0 <= value <= left:
            raise PgOutputError(f"{what} {value} is outside 0..{left}, the bytes left in the message (truncated or "
                                "damaged)")
        return value

    def byte(self) -> int:
        return self._buf[self._take(1)]

    def char(self) -> str:
        return chr(self.byte())

    def int16(self) -> int:
        return int(_INT16.unpack_from(self._buf, self._take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack_from(self._buf, self._take(4))[0])

    def oid(self) -> int:
        return int(_UINT32.unpack_from(self._buf, self._take(4))[0])

    def lsn(self) -> int:
        return int(_UINT64.unpack_from(self._buf, self._take(8))[0])

    def timestamp(self) -> _dt.datetime:
        """A PostgreSQL timestamp: microseconds since 2000-01-01 00:00 UTC."""
        micros = int(_INT64.unpack_from(self._buf, self._take(8))[0])
        try:
            return _PG_EPOCH + _dt.timedelta(microseconds=micros)
        except OverflowError:
            raise PgOutputError(f"timestamp of {micros} microseconds since 2000 lies outside the years 1-9999") \
                from None

    def cstring(self) -> str:
        end = self._buf.find(b"\x00", self._pos)
        if end < 0:
            raise PgOutputError(f"unterminated string at byte {self._pos}")
        text = _utf8(self._buf[self._pos:end], f"string at byte {self._pos}")
        self._pos = end + 1
        return text

    def raw(self, size: int) -> bytes:
        start = self._take(size)
        return self._buf[start:start + size]

    def left(self) -> int:
        return len(self._buf) - self._pos

    def done(self) -> None:
        if self._pos != len(self._buf):
            raise PgOutputError(f"{len(self._buf) - self._pos} unexpected trailing bytes")


def _tuple_at(buf: bytes, pos: int) -> tuple[TupleData, int]:
    """TupleData at `pos`: Int16 count, then per column 'n' (null), 'u' (unchanged TOAST) or 't' +
    Int32 length + text. Returns the values and the position after them.

    The hot loop of the decoder (one pass per column of every change), so it reads the buffer
    directly, without a reader object or a call per field.
    """
    size = len(buf)
    values: list[Value] = []
    append = values.append
    length_at = _INT32.unpack_from
    try:
        (count,) = _INT16.unpack_from(buf, pos)
        pos += 2
        for _ in range(count):
            kind = buf[pos]
            if kind == _TEXT:
                (length,) = length_at(buf, pos + 1)
                start, pos = pos + 5, pos + 5 + length
                if length < 0 or pos > size:
                    raise PgOutputError(f"column {len(values) + 1} length {length} is outside 0.."
                                        f"{max(0, size - start)}, the bytes left in the message (truncated or "
                                        "damaged)")
                try:
                    append(buf[start:pos].decode("utf-8"))
                except UnicodeDecodeError:
                    append(_utf8(buf[start:pos], f"column {len(values) + 1}"))
            elif kind == _NULL:
                append(None)
                pos += 1
            elif kind == _UNCHANGED_TOAST:
                append(UNCHANGED)
                pos += 1
            elif kind == _BINARY:
                raise PgOutputError("binary tuple data ('b') received, but the binary option was never requested")
            else:
                raise PgOutputError(f"unknown tuple data kind {chr(kind)!r}")
    except (struct.error, IndexError):
        raise PgOutputError("message truncated inside tuple data") from None
    return tuple(values), pos


def _begin(r: _Reader) -> Begin:
    return Begin(final_lsn=r.lsn(), commit_time=r.timestamp(), xid=r.int32() & 0xFFFFFFFF)


def _commit(r: _Reader) -> Commit:
    return Commit(flags=r.byte(), commit_lsn=r.lsn(), end_lsn=r.lsn(), commit_time=r.timestamp())


def _origin(r: _Reader) -> Origin:
    return Origin(lsn=r.lsn(), name=r.cstring())


def _relation(r: _Reader) -> Relation:
    oid, namespace, name, identity = r.oid(), r.cstring(), r.cstring(), r.char()
    count = r.int16()
    if count < 0:
        raise PgOutputError(f"relation {oid} has a negative column count {count}")
    columns = tuple(
        RelationColumn(flags=r.byte(), name=r.cstring(), type_oid=r.oid(), type_modifier=r.int32())
        for _ in range(count)
    )
    return Relation(oid=oid, namespace=namespace, name=name, replica_identity=identity, columns=columns)


def _type(r: _Reader) -> TypeMessage:
    return TypeMessage(oid=r.oid(), namespace=r.cstring(), name=r.cstring())


_TUPLE_NEW, _TUPLE_KEY = b"N"[0], b"K"[0]


def _submessage(payload: bytes, pos: int, allowed: bytes, what: str) -> int:
    """The byte that says which tuple follows (checked against `allowed`)."""
    if pos >= len(payload):
        raise PgOutputError(f"message truncated: needs {pos + 1} bytes, has {len(payload)}")
    kind = payload[pos]
    if kind not in allowed:
        raise PgOutputError(f"{what}: expected one of {allowed.decode()!r}, got {chr(kind)!r}")
    return kind


def _row_change(payload: bytes) -> Insert | Update | Delete:
    """Insert ('I'), Update ('U') or Delete ('D'): one per changed row, so decoded straight from
    the payload (no reader object, no call per field)."""
    if len(payload) < 5:
        raise PgOutputError(f"message truncated: needs 5 bytes, has {len(payload)}")
    (oid,) = _UINT32.unpack_from(payload, 1)
    tag = payload[0]
    message: Insert | Update | Delete
    if tag == _INSERT:
        _submessage(payload, 5, b"N", "insert")
        new, end = _tuple_at(payload, 6)
        message = Insert(oid, new)
    elif tag == _DELETE:
        kind = _submessage(payload, 5, b"KO", "delete")
        old, end = _tuple_at(payload, 6)
        message = Delete(oid, "K" if kind == _TUPLE_KEY else "O", old)
    else:
        kind = _submessage(payload, 5, b"KON", "update")
        if kind == _TUPLE_NEW:
            new, end = _tuple_at(payload, 6)
            message = Update(oid, None, None, new)
        else:
            old, end = _tuple_at(payload, 6)
            _submessage(payload, end, b"N", "update new tuple")
            new, end = _tuple_at(payload, end + 1)
            message = Update(oid, "K" if kind == _TUPLE_KEY else "O", old, new)
    if end != len(payload):
        raise PgOutputError(f"{len(payload) - end} unexpected trailing bytes")
    return message


def _truncate(r: _Reader) -> Truncate:
    count = r.int32()
    options = r.byte()
    if not 0 <= count <= r.left() // 4:
        raise PgOutputError(f"truncate relation count {count} is outside 0..{r.left() // 4}, "
                            "what the bytes left in the message hold")
    oids = tuple(r.oid() for _ in range(count))
    return Truncate(relation_oids=oids, cascade=bool(options & 1), restart_identity=bool(options & 2))


def _logical_message(r: _Reader) -> LogicalMessage:
    transactional, lsn, prefix = bool(r.byte() & 1), r.lsn(), r.cstring()
    return LogicalMessage(transactional=transactional, lsn=lsn, prefix=prefix,
                          content=r.raw(r.length("logical message content length")))


_DECODERS: dict[str, Callable[[_Reader], Message]] = {
    "B": _begin, "C": _commit, "O": _origin, "R": _relation, "Y": _type, "T": _truncate, "M": _logical_message,
}
_INSERT, _UPDATE, _DELETE = b"I"[0], b"U"[0], b"D"[0]

# Messages of protocol versions 2+ (streaming of in-progress transactions, two-phase commit): we
# only ever request version 1, so receiving one means a server/option mismatch, not data to skip.
_NEWER_PROTOCOL = {"S": "Stream Start", "E": "Stream Stop", "c": "Stream Commit", "A": "Stream Abort",
                   "b": "Begin Prepare", "P": "Prepare", "K": "Commit Prepared",
                   "r": "Rollback Prepared", "p": "Stream Prepare"}


def decode(payload: bytes) -> Message:
    """Decode one pgoutput message (the payload of one XLogData frame)."""
    if not payload:
        raise PgOutputError("empty message")
    if payload[0] in (_INSERT, _UPDATE, _DELETE):
        return _row_change(payload)
    tag = chr(payload[0])
    decoder = _DECODERS.get(tag)
    if decoder is None:
        newer = _NEWER_PROTOCOL.get(tag)
        detail = f" ({newer}, not part of protocol version 1)" if newer else ""
        raise PgOutputError(f"unknown pgoutput message type {tag!r}{detail}")
    reader = _Reader(payload)
    reader.byte()
    message = decoder(reader)
    reader.done()
    return message
