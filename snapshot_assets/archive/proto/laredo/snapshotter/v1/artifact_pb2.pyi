from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotRow(_message.Message):
    __slots__ = ("row",)
    ROW_FIELD_NUMBER: _ClassVar[int]
    row: _struct_pb2.Struct
    def __init__(self, row: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class DiffChange(_message.Message):
    __slots__ = ("action", "key", "old", "new")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    action: str
    key: str
    old: _struct_pb2.Struct
    new: _struct_pb2.Struct
    def __init__(self, action: _Optional[str] = ..., key: _Optional[str] = ..., old: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., new: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
