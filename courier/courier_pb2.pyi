from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallRequest(_message.Message):
    __slots__ = ("method", "pickle", "buffers", "buffer_sizes")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PICKLE_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_SIZES_FIELD_NUMBER: _ClassVar[int]
    method: str
    pickle: bytes
    buffers: _containers.RepeatedScalarFieldContainer[bytes]
    buffer_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, method: _Optional[str] = ..., pickle: _Optional[bytes] = ..., buffers: _Optional[_Iterable[bytes]] = ..., buffer_sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("status", "pickle", "buffers", "message", "exception_type", "traceback", "methods", "buffer_sizes", "result_id")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[CallResponse.Status]
        EXCEPTION: _ClassVar[CallResponse.Status]
        UNKNOWN_METHOD: _ClassVar[CallResponse.Status]
        SERIALIZATION_ERROR: _ClassVar[CallResponse.Status]
    OK: CallResponse.Status
    EXCEPTION: CallResponse.Status
    UNKNOWN_METHOD: CallResponse.Status
    SERIALIZATION_ERROR: CallResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PICKLE_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_SIZES_FIELD_NUMBER: _ClassVar[int]
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    status: CallResponse.Status
    pickle: bytes
    buffers: _containers.RepeatedScalarFieldContainer[bytes]
    message: str
    exception_type: str
    traceback: str
    methods: _containers.RepeatedScalarFieldContainer[str]
    buffer_sizes: _containers.RepeatedScalarFieldContainer[int]
    result_id: int
    def __init__(self, status: _Optional[_Union[CallResponse.Status, str]] = ..., pickle: _Optional[bytes] = ..., buffers: _Optional[_Iterable[bytes]] = ..., message: _Optional[str] = ..., exception_type: _Optional[str] = ..., traceback: _Optional[str] = ..., methods: _Optional[_Iterable[str]] = ..., buffer_sizes: _Optional[_Iterable[int]] = ..., result_id: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("result_id",)
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    result_id: int
    def __init__(self, result_id: _Optional[int] = ...) -> None: ...

class ListMethodsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMethodsResponse(_message.Message):
    __slots__ = ("methods",)
    METHODS_FIELD_NUMBER: _ClassVar[int]
    methods: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, methods: _Optional[_Iterable[str]] = ...) -> None: ...
