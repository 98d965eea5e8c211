import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SyncMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SYNC_MODE_UNSPECIFIED: _ClassVar[SyncMode]
    SYNC_MODE_FULL_SNAPSHOT: _ClassVar[SyncMode]
    SYNC_MODE_DELTA: _ClassVar[SyncMode]
    SYNC_MODE_DELTA_FROM_SNAPSHOT: _ClassVar[SyncMode]
    SYNC_MODE_REPLAY_ARCHIVE: _ClassVar[SyncMode]
SYNC_MODE_UNSPECIFIED: SyncMode
SYNC_MODE_FULL_SNAPSHOT: SyncMode
SYNC_MODE_DELTA: SyncMode
SYNC_MODE_DELTA_FROM_SNAPSHOT: SyncMode
SYNC_MODE_REPLAY_ARCHIVE: SyncMode

class SyncRequest(_message.Message):
    __slots__ = ("schema", "table", "last_known_sequence", "last_snapshot_id", "client_id", "last_known_source_position", "filters")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    LAST_KNOWN_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_KNOWN_SOURCE_POSITION_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    schema: str
    table: str
    last_known_sequence: int
    last_snapshot_id: str
    client_id: str
    last_known_source_position: str
    filters: _containers.RepeatedCompositeFieldContainer[FieldPredicate]
    def __init__(self, schema: _Optional[str] = ..., table: _Optional[str] = ..., last_known_sequence: _Optional[int] = ..., last_snapshot_id: _Optional[str] = ..., client_id: _Optional[str] = ..., last_known_source_position: _Optional[str] = ..., filters: _Optional[_Iterable[_Union[FieldPredicate, _Mapping]]] = ...) -> None: ...

class FieldPredicate(_message.Message):
    __slots__ = ("field", "equals", "prefix")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    EQUALS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    IN_FIELD_NUMBER: _ClassVar[int]
    field: str
    equals: _struct_pb2.Value
    prefix: str
    def __init__(self, field: _Optional[str] = ..., equals: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., prefix: _Optional[str] = ..., **kwargs) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("handshake", "snapshot_begin", "snapshot_row", "snapshot_end", "journal_entry", "schema_change", "heartbeat", "go_away")
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BEGIN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ROW_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_END_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_ENTRY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_CHANGE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    GO_AWAY_FIELD_NUMBER: _ClassVar[int]
    handshake: SyncHandshake
    snapshot_begin: SnapshotBegin
    snapshot_row: SnapshotRow
    snapshot_end: SnapshotEnd
    journal_entry: ReplicationJournalEntry
    schema_change: SchemaChangeNotification
    heartbeat: Heartbeat
    go_away: GoAway
    def __init__(self, handshake: _Optional[_Union[SyncHandshake, _Mapping]] = ..., snapshot_begin: _Optional[_Union[SnapshotBegin, _Mapping]] = ..., snapshot_row: _Optional[_Union[SnapshotRow, _Mapping]] = ..., snapshot_end: _Optional[_Union[SnapshotEnd, _Mapping]] = ..., journal_entry: _Optional[_Union[ReplicationJournalEntry, _Mapping]] = ..., schema_change: _Optional[_Union[SchemaChangeNotification, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., go_away: _Optional[_Union[GoAway, _Mapping]] = ...) -> None: ...

class SyncHandshake(_message.Message):
    __slots__ = ("mode", "server_current_sequence", "journal_oldest_sequence", "resume_from_sequence", "columns", "snapshot_id")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SERVER_CURRENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_OLDEST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    mode: SyncMode
    server_current_sequence: int
    journal_oldest_sequence: int
    resume_from_sequence: int
    columns: _containers.RepeatedCompositeFieldContainer[ColumnDefinition]
    snapshot_id: str
    def __init__(self, mode: _Optional[_Union[SyncMode, str]] = ..., server_current_sequence: _Optional[int] = ..., journal_oldest_sequence: _Optional[int] = ..., resume_from_sequence: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[ColumnDefinition, _Mapping]]] = ..., snapshot_id: _Optional[str] = ...) -> None: ...

class SnapshotBegin(_message.Message):
    __slots__ = ("snapshot_id", "sequence", "row_count")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    sequence: int
    row_count: int
    def __init__(self, snapshot_id: _Optional[str] = ..., sequence: _Optional[int] = ..., row_count: _Optional[int] = ...) -> None: ...

class SnapshotRow(_message.Message):
    __slots__ = ("row",)
    ROW_FIELD_NUMBER: _ClassVar[int]
    row: _struct_pb2.Struct
    def __init__(self, row: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class SnapshotEnd(_message.Message):
    __slots__ = ("sequence", "rows_sent")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ROWS_SENT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    rows_sent: int
    def __init__(self, sequence: _Optional[int] = ..., rows_sent: _Optional[int] = ...) -> None: ...

class ReplicationJournalEntry(_message.Message):
    __slots__ = ("sequence", "source_position", "timestamp", "action", "old_values", "new_values")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_POSITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    OLD_VALUES_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    source_position: str
    timestamp: _timestamp_pb2.Timestamp
    action: str
    old_values: _struct_pb2.Struct
    new_values: _struct_pb2.Struct
    def __init__(self, sequence: _Optional[int] = ..., source_position: _Optional[str] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[str] = ..., old_values: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., new_values: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class SchemaChangeNotification(_message.Message):
    __slots__ = ("sequence", "old_columns", "new_columns")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OLD_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    NEW_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    old_columns: _containers.RepeatedCompositeFieldContainer[ColumnDefinition]
    new_columns: _containers.RepeatedCompositeFieldContainer[ColumnDefinition]
    def __init__(self, sequence: _Optional[int] = ..., old_columns: _Optional[_Iterable[_Union[ColumnDefinition, _Mapping]]] = ..., new_columns: _Optional[_Iterable[_Union[ColumnDefinition, _Mapping]]] = ...) -> None: ...

class ColumnDefinition(_message.Message):
    __slots__ = ("ordinal_position", "column_name", "data_type", "not_null", "is_primary_key", "primary_key_ordinal")
    ORDINAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    COLUMN_NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    NOT_NULL_FIELD_NUMBER: _ClassVar[int]
    IS_PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_ORDINAL_FIELD_NUMBER: _ClassVar[int]
    ordinal_position: int
    column_name: str
    data_type: str
    not_null: bool
    is_primary_key: bool
    primary_key_ordinal: int
    def __init__(self, ordinal_position: _Optional[int] = ..., column_name: _Optional[str] = ..., data_type: _Optional[str] = ..., not_null: _Optional[bool] = ..., is_primary_key: _Optional[bool] = ..., primary_key_ordinal: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("current_sequence", "server_time")
    CURRENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    current_sequence: int
    server_time: _timestamp_pb2.Timestamp
    def __init__(self, current_sequence: _Optional[int] = ..., server_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GoAway(_message.Message):
    __slots__ = ("reason", "drain_deadline_unix_ms")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    drain_deadline_unix_ms: int
    def __init__(self, reason: _Optional[str] = ..., drain_deadline_unix_ms: _Optional[int] = ...) -> None: ...
