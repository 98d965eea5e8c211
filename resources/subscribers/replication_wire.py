"""What the laredo client and the fan-out server share on the wire, besides framing.

One place for the RPC path, the status codes both transports speak, and the conversions between
this project's model (rows, columns, changes) and laredo's messages. The client and the server
import these instead of each keeping a copy, so they cannot drift apart.

Rows travel as `google.protobuf.Struct`, whose numbers are doubles; the conversions are the
protobuf artifact format's (`snapshot_assets.archive.formats.protobuf`): an integer within ±2^53
is sent as a number and read back as an `int`, a larger one travels as its exact decimal string.
"""

from __future__ import annotations

import datetime as _dt
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from resources.subscribers.events import Column, TableSchema
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.formats.protobuf import fill_row, struct_to_dict

SERVICE = "laredo.replication.v1.LaredoReplicationService"
SYNC_METHOD = "Sync"
#: The HTTP path (Connect) and the gRPC method name are the same string.
SYNC_PATH = f"/{SERVICE}/{SYNC_METHOD}"
DEFAULT_PORT = 4002


class Code(enum.StrEnum):
    """RPC status codes, spelled as the Connect protocol spells them (gRPC's names, lower case)."""

    CANCELED = "canceled"
    UNKNOWN = "unknown"
    INVALID_ARGUMENT = "invalid_argument"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    ABORTED = "aborted"
    OUT_OF_RANGE = "out_of_range"
    UNIMPLEMENTED = "unimplemented"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"
    DATA_LOSS = "data_loss"
    UNAUTHENTICATED = "unauthenticated"

    @classmethod
    def parse(cls, text: str) -> Code:
        """The code named `text` (either spelling of cancel); anything unknown is UNKNOWN, as Connect says."""
        normalized = text.strip().lower()
        if normalized == "cancelled":
            return cls.CANCELED
        try:
            return cls(normalized)
        except ValueError:
            return cls.UNKNOWN

    @property
    def wire_name(self) -> str:
        """The upper-case name operators know from gRPC tooling (`NOT_FOUND`)."""
        return self.name


#: Codes that describe the request itself: retrying the same request cannot succeed.
PERMANENT_CODES = frozenset({
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.PERMISSION_DENIED,
    Code.UNAUTHENTICATED,
    Code.UNIMPLEMENTED,
    Code.FAILED_PRECONDITION,
    Code.OUT_OF_RANGE,
})


class StatusError(Exception):
    """An RPC ended with a status: raised by transports (client) and by handlers (server).

    It is transport-neutral so one handler serves Connect and gRPC, and one client loop reads
    both; the subscriber turns it into a `SourceError` that names the table.
    """

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.wire_name}: {message}" if message else code.wire_name)
        self.code = code
        self.message = message

    @property
    def transient(self) -> bool:
        return self.code not in PERMANENT_CODES


# --- rows ---------------------------------------------------------------------------------------


def row_to_struct(target: struct_pb2.Struct, row: Mapping[str, Any], describe: Callable[[], str]) -> None:
    """Fill `target` with `row`; a value no Struct can hold names its column and `describe()`."""
    fill_row(target, row, describe)


def struct_to_row(struct: struct_pb2.Struct) -> Row:
    """A Struct as a row dict, integral numbers within ±2^53 as exact ints."""
    return struct_to_dict(struct)


# --- columns ------------------------------------------------------------------------------------


def column_to_proto(column: Column) -> pb.ColumnDefinition:
    return pb.ColumnDefinition(
        ordinal_position=column.ordinal,
        column_name=column.name,
        data_type=column.type,
        not_null=not column.nullable,
        is_primary_key=column.primary_key,
        primary_key_ordinal=column.primary_key_ordinal,
    )


def column_from_proto(definition: pb.ColumnDefinition) -> Column:
    return Column(
        name=definition.column_name,
        type=definition.data_type,
        nullable=not definition.not_null,
        primary_key=definition.is_primary_key,
        ordinal=definition.ordinal_position,
        primary_key_ordinal=definition.primary_key_ordinal,
    )


def schema_from_columns(table: str, definitions: Iterable[pb.ColumnDefinition]) -> TableSchema:
    """The table schema of handshake/schema-change columns, in ordinal order."""
    columns = sorted((column_from_proto(d) for d in definitions), key=lambda c: c.ordinal)
    return TableSchema(table=table, columns=tuple(columns))


def columns_to_proto(columns: Sequence[Column]) -> list[pb.ColumnDefinition]:
    return [column_to_proto(c) for c in columns]


# --- timestamps ---------------------------------------------------------------------------------


_UNIX_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def timestamp_to_datetime(ts: timestamp_pb2.Timestamp) -> _dt.datetime:
    """The UTC datetime of `ts`; one outside the years 1-9999 (damage, or a hostile server) is a
    ValueError naming it, not the OverflowError or OSError of the platform's time functions."""
    try:
        return _UNIX_EPOCH + _dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)
    except OverflowError:
        raise ValueError(f"timestamp of {ts.seconds} s + {ts.nanos} ns since 1970 lies outside the "
                         "years 1-9999") from None


def datetime_to_timestamp(target: timestamp_pb2.Timestamp, value: _dt.datetime) -> None:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)
    target.FromDatetime(value)


# --- changes ------------------------------------------------------------------------------------


def parse_action(text: str) -> Action:
    """The action of a journal entry; an unknown one raises ValueError naming it."""
    try:
        return Action(text)
    except ValueError:
        raise ValueError(f"unknown journal action {text!r}; expected one of "
                         f"{', '.join(a.value for a in Action)}") from None


def entry_images(entry: pb.ReplicationJournalEntry, action: Action) -> tuple[Row | None, Row | None]:
    """(old, new) of a journal entry, checked against what its action must carry.

    INSERT and UPDATE must carry a non-empty `new_values`, DELETE a non-empty `old_values` (the
    identity); a TRUNCATE carries neither. A missing image is a malformed entry (ValueError), never
    a change with a hole in it.
    """
    old = struct_to_row(entry.old_values) if entry.HasField("old_values") else None
    new = struct_to_row(entry.new_values) if entry.HasField("new_values") else None
    old = old or None
    new = new or None
    if action in (Action.INSERT, Action.UPDATE) and new is None:
        raise ValueError(f"{action.value} entry {entry.sequence} carries no new_values object")
    if action is Action.DELETE and old is None:
        raise ValueError(f"DELETE entry {entry.sequence} carries no old_values object (the row identity)")
    if action is Action.TRUNCATE:
        return None, None
    return old, new
