"""Encodes and decodes courier's messages (protos/courier.proto) by hand.

The bytes are exactly protobuf's wire format for the messages in
``protos/courier.proto``, so any gRPC client generated from that file can talk
to a courier server. Encoding by hand lets large out-of-band buffers be joined
into the message with a single copy and decoded as zero-copy ``memoryview``
slices, which the protobuf runtime cannot do for ``bytes`` fields.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Sequence, Tuple

# CallResponse.Status values.
OK = 0
EXCEPTION = 1
UNKNOWN_METHOD = 2
SERIALIZATION_ERROR = 3

_VARINT = 0
_LENGTH_DELIMITED = 2
_FIXED64 = 1
_FIXED32 = 5

_SMALL_VARINTS = [bytes([n]) for n in range(128)]


class Response:
    """A decoded ``CallResponse``; see protos/courier.proto for the fields."""

    __slots__ = ('status', 'pickle', 'buffers', 'message', 'exception_type',
                 'traceback', 'methods', 'buffer_sizes', 'result_id')

    def __init__(self, status: int = OK, pickle: Any = b'', buffers: Sequence[Any] = (),
                 message: str = '', exception_type: str = '', traceback: str = '',
                 methods: Sequence[str] = (), buffer_sizes: Sequence[int] = (),
                 result_id: int = 0):
        self.status = status
        self.pickle = pickle
        self.buffers = buffers
        self.message = message
        self.exception_type = exception_type
        self.traceback = traceback
        self.methods = methods
        self.buffer_sizes = buffer_sizes
        self.result_id = result_id


class Request:
    """A decoded ``CallRequest``; ``pickle`` and ``buffers`` are slices of the message."""

    __slots__ = ('method', 'pickle', 'buffers', 'buffer_sizes')

    def __init__(self, method: str, pickle: Any, buffers: List[Any],
                 buffer_sizes: List[int]):
        self.method = method
        self.pickle = pickle
        self.buffers = buffers
        self.buffer_sizes = buffer_sizes


def encode_request(method: str, pickle: Any, buffers: Sequence[memoryview] = (),
                   buffer_sizes: Sequence[int] = ()) -> bytes:
    """Returns the ``CallRequest`` bytes; ``buffers`` are copied once, into the result."""
    parts: List[Any] = []
    _append_bytes(parts, 1, method.encode())
    _append_bytes(parts, 2, pickle)
    for buffer in buffers:
        _append_bytes(parts, 3, buffer, keep_empty=True)
    _append_packed(parts, 4, buffer_sizes)
    return b''.join(parts)


def decode_request(data: Any) -> Request:
    """Decodes ``CallRequest`` bytes without copying the pickle or buffers.

    Raises:
      ValueError: ``data`` is not a well-formed ``CallRequest``.
    """
    request = Request('', memoryview(b''), [], [])
    for number, wire_type, value in _fields(data):
        if number == 1:
            request.method = _text(value, wire_type)
        elif number == 2:
            request.pickle = _bytes(value, wire_type)
        elif number == 3:
            request.buffers.append(_bytes(value, wire_type))
        elif number == 4:
            _extend_varints(request.buffer_sizes, value, wire_type)
    return request


def decode_call_stream_start(data: Any) -> Request:
    """Decodes the first message of a ``CallStream``: a ``Chunk`` whose data is an encoded
    ``CallRequest``, as protos/courier.proto describes it (what typed clients send), or that
    ``CallRequest`` itself, unwrapped (what courier's own clients send, which every courier
    server takes).

    A ``Chunk`` has field 1 only, where a ``CallRequest`` of a stream also has its pickle
    (field 2) and buffer sizes (field 4): that tells one from the other.

    Raises:
      ValueError: ``data`` is neither.
    """
    fields = list(_fields(data))
    if len(fields) == 1 and fields[0][:2] == (1, _LENGTH_DELIMITED):
        return decode_request(fields[0][2])
    return decode_request(data)


def encode_response(response: Response) -> bytes:
    """Returns the ``CallResponse`` bytes; buffers are copied once, into the result."""
    parts: List[Any] = []
    if response.status:
        parts += (b'\x08', _varint(response.status))
    _append_bytes(parts, 2, response.pickle)
    for buffer in response.buffers:
        _append_bytes(parts, 3, buffer, keep_empty=True)
    _append_bytes(parts, 4, response.message.encode())
    _append_bytes(parts, 5, response.exception_type.encode())
    _append_bytes(parts, 6, response.traceback.encode())
    for method in response.methods:
        _append_bytes(parts, 7, method.encode(), keep_empty=True)
    _append_packed(parts, 8, response.buffer_sizes)
    if response.result_id:
        parts += (b'\x48', _varint(response.result_id))
    return b''.join(parts)


def decode_response(data: Any) -> Response:
    """Decodes ``CallResponse`` bytes; ``pickle`` and ``buffers`` are slices of ``data``.

    Raises:
      ValueError: ``data`` is not a well-formed ``CallResponse``.
    """
    response = Response(pickle=memoryview(b''), buffers=[], methods=[], buffer_sizes=[])
    for number, wire_type, value in _fields(data):
        if number == 1:
            response.status = _int(value, wire_type)
        elif number == 2:
            response.pickle = _bytes(value, wire_type)
        elif number == 3:
            response.buffers.append(_bytes(value, wire_type))
        elif number == 4:
            response.message = _text(value, wire_type)
        elif number == 5:
            response.exception_type = _text(value, wire_type)
        elif number == 6:
            response.traceback = _text(value, wire_type)
        elif number == 7:
            response.methods.append(_text(value, wire_type))
        elif number == 8:
            _extend_varints(response.buffer_sizes, value, wire_type)
        elif number == 9:
            response.result_id = _int(value, wire_type)
    return response


def encode_chunk(data: Any) -> bytes:
    """Returns the ``Chunk`` bytes holding ``data`` (copied once)."""
    parts: List[Any] = []
    _append_bytes(parts, 1, data)
    return b''.join(parts)


def decode_chunk(data: Any) -> memoryview:
    """Returns the data of ``Chunk`` bytes, a slice of ``data``.

    Raises:
      ValueError: ``data`` is not a well-formed ``Chunk``.
    """
    chunk = memoryview(b'')
    for number, wire_type, value in _fields(data):
        if number == 1:
            chunk = _bytes(value, wire_type)
    return chunk


def encode_fetch_request(result_id: int) -> bytes:
    """Returns the ``FetchRequest`` bytes."""
    return b'\x08' + _varint(result_id) if result_id else b''


def decode_fetch_request(data: Any) -> int:
    """Returns the ``result_id`` of ``FetchRequest`` bytes.

    Raises:
      ValueError: ``data`` is not a well-formed ``FetchRequest``.
    """
    result_id = 0
    for number, wire_type, value in _fields(data):
        if number == 1:
            result_id = _int(value, wire_type)
    return result_id


def encode_method_list(methods: Sequence[str]) -> bytes:
    """Returns the ``ListMethodsResponse`` bytes."""
    parts: List[Any] = []
    for method in methods:
        _append_bytes(parts, 1, method.encode(), keep_empty=True)
    return b''.join(parts)


def decode_method_list(data: Any) -> List[str]:
    """Decodes ``ListMethodsResponse`` bytes.

    Raises:
      ValueError: ``data`` is not a well-formed ``ListMethodsResponse``.
    """
    return [_text(value, wire_type) for number, wire_type, value in _fields(data)
            if number == 1]


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _append_bytes(parts: List[Any], number: int, value: Any, keep_empty: bool = False) -> None:
    size = value.nbytes if isinstance(value, memoryview) else len(value)
    if size or keep_empty:
        parts += (_SMALL_VARINTS[number << 3 | _LENGTH_DELIMITED], _varint(size), value)


def _append_packed(parts: List[Any], number: int, values: Sequence[int]) -> None:
    if values:
        packed = b''.join(_varint(value) for value in values)
        parts += (_SMALL_VARINTS[number << 3 | _LENGTH_DELIMITED], _varint(len(packed)), packed)


def _extend_varints(out: List[int], value: Any, wire_type: int) -> None:
    """Appends a repeated varint field's values, packed or not (parsers accept both)."""
    if wire_type == _VARINT:
        out.append(value)
        return
    packed = _bytes(value, wire_type)
    pos = 0
    while pos < len(packed):
        number, pos = _read_varint(packed, pos)
        out.append(number)


def _int(value: Any, wire_type: int) -> int:
    if wire_type != _VARINT:
        raise ValueError(f'expected a varint field, got wire type {wire_type}')
    return value


def _read_varint(data: memoryview, pos: int) -> Tuple[int, int]:
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise ValueError('message ends inside a varint')
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 128:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError('varint longer than 10 bytes')


def _fields(data: Any) -> Iterator[Tuple[int, int, Any]]:
    """Yields ``(field number, wire type, value)``; values are ints or memoryviews."""
    view = memoryview(data).cast('B')
    pos = 0
    end = len(view)
    while pos < end:
        key, pos = _read_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError('field number 0 is invalid')
        if wire_type == _VARINT:
            value, pos = _read_varint(view, pos)
        elif wire_type == _LENGTH_DELIMITED:
            size, pos = _read_varint(view, pos)
            if pos + size > end:
                raise ValueError(f'field {number} claims {size} bytes but only '
                                 f'{end - pos} remain')
            value = view[pos:pos + size]
            pos += size
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
            if pos > end:
                raise ValueError(f'message ends inside fixed-width field {number}')
            continue  # No courier field has a fixed-width type; skip unknown ones.
        else:
            raise ValueError(f'unsupported wire type {wire_type} for field {number}')
        yield number, wire_type, value


def _bytes(value: Any, wire_type: int) -> memoryview:
    if wire_type != _LENGTH_DELIMITED:
        raise ValueError(f'expected a length-delimited field, got wire type {wire_type}')
    return value


def _text(value: Any, wire_type: int) -> str:
    return str(_bytes(value, wire_type), 'utf-8')
