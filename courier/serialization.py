"""Turns Python values into pickle bytes plus out-of-band buffers, and back.

Values travel as pickle protocol 5: large binary data (numpy arrays, bytearrays,
``pickle.PickleBuffer``) is handed over as separate out-of-band buffers instead of
being copied into the pickle stream. Plain ``pickle`` is tried first; cloudpickle
is the fallback for what plain pickle cannot handle (lambdas, local classes).

A value can also travel compressed (``dumps(..., compress=True)``, what
``courier.Client(address, compress=True)`` asks for): the pickle and its buffers
become one zlib message (only stored, not compressed, when they are small),
which :func:`loads` recognizes by its first bytes. Transports carry it like any
other pickle; a server answers a compressed call with a compressed result.
"""

from __future__ import annotations

import functools
import io
import marshal
import pickle
import struct
import types
import zlib
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from courier import errors

PROTOCOL = 5

# Buffers smaller than this go in-band: a separate buffer costs more than copying it.
INBAND_LIMIT = 16 * 1024

# A compressed message: this prefix (never the start of a pickle), the number of buffers, the
# length of the pickle and of each buffer, then zlib's compression of them all, concatenated.
COMPRESSED_PREFIX = b'\xffCZ1'
_COMPRESSED_FIRST_BYTE = COMPRESSED_PREFIX[0]
# Smaller values are only stored in a compressed message: compressing them saves less than it
# costs.
COMPRESS_MIN_BYTES = 64 * 1024
_COMPRESS_LEVEL = 1  # fast: large payloads are mostly numbers

# How deep _find_culprit looks into containers and object attributes.
_MAX_CULPRIT_DEPTH = 8

# The pickles of what many calls carry: no arguments, and a result of None. They are made
# once: `dumps_arguments` and `dumps` return them without pickling, `loads` knows them.
NO_ARGUMENTS = pickle.dumps(((), {}), protocol=PROTOCOL)
_NONE = pickle.dumps(None, protocol=PROTOCOL)
_ARGUMENT_NAMES = ('args', 'kwargs')

# What a value is, in error messages: "the result of 'add'", or as a pair ('the result of',
# 'add'), which is put together only when a message needs it (callers pass one per call).
What = Union[str, Tuple[str, str]]


def dumps(value: Any, what: What, top_names: Optional[Sequence[str]] = None, *,
          compress: bool = False) -> Tuple[bytes, List[memoryview]]:
    """Pickles ``value``; returns the pickle stream and its out-of-band buffers.

    Args:
      value: What to pickle.
      what: Describes ``value`` in error messages (see :data:`What`).
      top_names: Names of the elements of a tuple ``value``, used to point at the
        offending part in error messages (e.g. ``('args', 'kwargs')``).
      compress: Compress a large value (see the module docstring).

    Raises:
      errors.SerializationError: neither pickle nor cloudpickle can pickle it.
    """
    if value is None and not compress:
        return _NONE, []
    buffers = _OutOfBand()
    try:
        data = pickle.dumps(value, protocol=PROTOCOL, buffer_callback=buffers.keep)
    except Exception:  # pylint: disable=broad-except
        buffers.clear()
        try:
            data = cloudpickle_dumps(value, protocol=PROTOCOL, buffer_callback=buffers.keep)
        except Exception as error:  # pylint: disable=broad-except
            raise errors.SerializationError(
                _describe_failure(value, _text(what), top_names, error)) from error
    if compress:
        return _compressed(data, buffers)
    return data, buffers


def dumps_arguments(args: tuple, kwargs: dict, method: str, compress: bool = False
                    ) -> Tuple[bytes, List[memoryview]]:
    """Pickles the ``(args, kwargs)`` of a call of ``method``, as :func:`dumps` does; a call
    without arguments costs no pickling."""
    if not args and not kwargs and not compress:
        return NO_ARGUMENTS, []
    return dumps((args, kwargs), ('the arguments of', method), _ARGUMENT_NAMES,
                 compress=compress)


def cloudpickle_dumps(value: Any, protocol: int = PROTOCOL,
                      buffer_callback: Optional[Callable[[pickle.PickleBuffer], Any]] = None
                      ) -> bytes:
    """``cloudpickle.dumps``, except that code sent by value keeps its file name.

    cloudpickle 3.1 names the file of every code object it sends by value (the functions of a
    script's ``__main__``) ``<dynamic-code>``, so a traceback where it runs would show neither the
    script nor the failing line. Code travels here as ``marshal`` makes it, which is exact and
    complete (a receiver runs the same Python, as cloudpickle requires anyway).
    """
    file = io.BytesIO()
    _code_keeping_pickler()(file, protocol=protocol, buffer_callback=buffer_callback).dump(value)
    return file.getvalue()


@functools.lru_cache(maxsize=None)
def _code_keeping_pickler() -> type:
    import cloudpickle  # pylint: disable=import-outside-toplevel

    class CodeKeepingPickler(cloudpickle.Pickler):
        """cloudpickle's pickler, with code objects as marshal's bytes."""

        def reducer_override(self, obj):
            if type(obj) is types.CodeType:  # pylint: disable=unidiomatic-typecheck
                try:
                    return marshal.loads, (marshal.dumps(obj),)
                except ValueError:  # a constant marshal cannot write: cloudpickle's way
                    pass
            return super().reducer_override(obj)

    return CodeKeepingPickler


def is_compressed(data: Any) -> bool:
    """Whether ``data`` (a message :func:`dumps` made) is compressed."""
    # A pickle starts with 0x80: one index answers for nearly every message.
    return (len(data) >= len(COMPRESSED_PREFIX) and data[0] == COMPRESSED_PREFIX[0]
            and bytes(data[:len(COMPRESSED_PREFIX)]) == COMPRESSED_PREFIX)


def _compressed(data: bytes, buffers: List[memoryview]) -> Tuple[bytes, List[memoryview]]:
    parts = [data, *buffers]
    sizes = [len(data)] + [buffer.nbytes for buffer in buffers]
    # Small messages are only stored, which costs nothing but keeps the format: a server
    # compresses its results for a client whose calls come compressed.
    level = _COMPRESS_LEVEL if sum(sizes) >= COMPRESS_MIN_BYTES else 0
    compressor = zlib.compressobj(level)
    blob = b''.join([compressor.compress(part) for part in parts] + [compressor.flush()])
    header = struct.pack(f'<I{len(sizes)}Q', len(buffers), *sizes)
    return COMPRESSED_PREFIX + header + blob, []


def _decompressed(data: Any) -> Tuple[memoryview, List[memoryview]]:
    view = memoryview(data)[len(COMPRESSED_PREFIX):]
    (count,) = struct.unpack_from('<I', view)
    sizes = struct.unpack_from(f'<{count + 1}Q', view, 4)
    whole = memoryview(bytearray(zlib.decompress(view[4 + 8 * (count + 1):])))
    if len(whole) != sum(sizes):
        raise ValueError(f'the compressed message holds {len(whole)} bytes, its header says '
                         f'{sum(sizes)}')
    parts, start = [], 0
    for size in sizes:
        parts.append(whole[start:start + size])
        start += size
    return parts[0], parts[1:]  # the buffers are writable, like received ones


def loads(data: Any, buffers: Sequence[Any], what: What) -> Any:
    """Unpickles what :func:`dumps` produced (``what``: as for :func:`dumps`).

    Raises:
      errors.SerializationError: the data cannot be unpickled here, e.g. it names
        a class or module this process cannot import.
    """
    if data == _NONE:
        return None
    if data == NO_ARGUMENTS:
        return (), {}
    try:
        # A pickle starts with 0x80: its first byte rules out compression without a call.
        if data and data[0] == _COMPRESSED_FIRST_BYTE and is_compressed(data):
            data, buffers = _decompressed(data)
        return pickle.loads(data, buffers=buffers)
    except Exception as error:  # pylint: disable=broad-except
        raise errors.SerializationError(
            f'cannot unpickle {_text(what)}: {type(error).__name__}: {error}. Every class '
            f'sent over courier must be importable on the receiving side.') from error


def type_name(value: Any) -> str:
    """Returns the qualified name of ``value``'s type, as error messages show it."""
    cls = type(value)
    if cls.__module__ == 'builtins':
        return cls.__qualname__
    return f'{cls.__module__}.{cls.__qualname__}'


def _text(what: What) -> str:
    return what if isinstance(what, str) else f'{what[0]} {what[1]!r}'


class _OutOfBand(list):
    """The out-of-band buffers of one pickle; ``keep`` is its ``buffer_callback`` (a bound
    method: cheaper to make per pickle than a closure)."""

    __slots__ = ()

    def keep(self, buffer: pickle.PickleBuffer) -> bool:
        """Keeps a large contiguous buffer out-of-band (returns False); others go in-band."""
        try:
            raw = buffer.raw()
        except (BufferError, ValueError):  # Not contiguous: pickle it in-band.
            return True
        if raw.nbytes < INBAND_LIMIT:
            return True
        self.append(raw)
        return False


def _describe_failure(value: Any, what: str, top_names: Optional[Sequence[str]],
                      error: Exception) -> str:
    path, culprit = _find_culprit(value, '', 0)
    if top_names and isinstance(value, tuple) and path.startswith('['):
        index, _, rest = path[1:].partition(']')
        if index.isdigit() and int(index) < len(top_names):
            path = top_names[int(index)] + rest
    where = f' at {path}' if path else ''
    return (f'cannot pickle {what}: the object of type {type_name(culprit)}{where} '
            f'cannot be pickled ({type(error).__name__}: {error})')


def _find_culprit(value: Any, path: str, depth: int) -> Tuple[str, Any]:
    """Returns the path to and the innermost part of ``value`` that fails to pickle."""
    if depth >= _MAX_CULPRIT_DEPTH:
        return path, value
    if isinstance(value, dict):
        children = ((f'{path}[{key!r}]', child) for key, child in value.items())
    elif isinstance(value, (list, tuple)):
        children = ((f'{path}[{index}]', child) for index, child in enumerate(value))
    elif isinstance(getattr(value, '__dict__', None), dict) and not isinstance(value, type):
        children = ((f'{path}.{name}', child) for name, child in vars(value).items())
    else:
        return path, value
    for child_path, child in children:
        if not _picklable(child):
            return _find_culprit(child, child_path, depth + 1)
    return path, value


def _picklable(value: Any) -> bool:
    try:
        cloudpickle_dumps(value, buffer_callback=lambda _: False)
    except Exception:  # pylint: disable=broad-except
        return False
    return True
