from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventPage(_message.Message):
    __slots__ = ("metadata", "events")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    metadata: PageMetadata
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, metadata: _Optional[_Union[PageMetadata, _Mapping]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class PageMetadata(_message.Message):
    __slots__ = ("writer_id", "page_sequence", "start_time", "end_time", "event_count", "page_size_bytes", "format_version", "compression", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    writer_id: str
    page_sequence: int
    start_time: int
    end_time: int
    event_count: int
    page_size_bytes: int
    format_version: str
    compression: str
    tags: _containers.ScalarMap[str, str]
    def __init__(self, writer_id: _Optional[str] = ..., page_sequence: _Optional[int] = ..., start_time: _Optional[int] = ..., end_time: _Optional[int] = ..., event_count: _Optional[int] = ..., page_size_bytes: _Optional[int] = ..., format_version: _Optional[str] = ..., compression: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("event_id", "timestamp", "payload", "attributes", "sequence")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    timestamp: int
    payload: bytes
    attributes: _containers.ScalarMap[str, str]
    sequence: int
    def __init__(self, event_id: _Optional[str] = ..., timestamp: _Optional[int] = ..., payload: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, str]] = ..., sequence: _Optional[int] = ...) -> None: ...
