from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PublishRequest(_message.Message):
    __slots__ = ("topic", "payload", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    payload: bytes
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, topic: _Optional[str] = ..., payload: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("message_id", "sequence")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    sequence: int
    def __init__(self, message_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class BatchPublishRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[PublishRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[PublishRequest, _Mapping]]] = ...) -> None: ...

class BatchPublishResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[PublishResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[PublishResponse, _Mapping]]] = ...) -> None: ...

class PublishStreamResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[PublishResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[PublishResponse, _Mapping]]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("payload", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, payload: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...
