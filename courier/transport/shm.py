"""Large buffers between processes of one host through shared memory, not the socket.

On a Unix socket whose two sides agreed to it in the hello, an out-of-band buffer of
:data:`MIN_BYTES` or more travels as a memfd (an anonymous file in memory, never a name
in /dev/shm) passed with SCM_RIGHTS: the sender writes it once and seals it, and the
receiver maps it read-only, so the bytes never cross the socket. The kernel frees the
memory when the last process holding the file or a mapping of it lets go, also when that
process crashes or is killed.

Two things make a value sent to many readers cost one copy:

- A read-only buffer (``array.setflags(write=False)``, a received array) is written
  into shared memory once per object while the object lives: every later send of the
  same object passes the same file, and every reader maps the same pages.
- A buffer that is a whole received mapping (an argument or result passed on as it
  came, as a cache does) goes on as the file it came in, without any copy.

``COURIER_SHARED_MEMORY=0`` (read when courier is imported, on either side) turns this
off: buffers then travel through the socket as before. ``COURIER_SHARED_MEMORY_MIN_BYTES``
sets the threshold.
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

_SUPPORTED = hasattr(os, 'memfd_create') and hasattr(fcntl, 'F_ADD_SEALS')  # Linux.
# Whether this process offers and accepts shared memory on Unix sockets.
ENABLED = _SUPPORTED and os.environ.get('COURIER_SHARED_MEMORY', '1').strip().lower() not in (
    '0', 'false', 'off', 'no')
# Buffers from this size on travel through shared memory; smaller ones through the socket.
MIN_BYTES = max(1, int(os.environ.get('COURIER_SHARED_MEMORY_MIN_BYTES', 1 << 20)))
# A buffer size in a frame's table with this bit set travels as the next received descriptor.
SHARED_BIT = 1 << 63
# The most descriptors one message carries (the kernel's SCM_MAX_FD): later buffers of a
# frame with more travel through the socket.
MAX_DESCRIPTORS = 253
ANCILLARY_SPACE = socket.CMSG_SPACE(MAX_DESCRIPTORS * 4)

_SEALS = (fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
          if _SUPPORTED else 0)
# Received mappings whose file stays open, so that they can be passed on without a copy.
# Beyond it a mapping keeps no descriptor (a process holding thousands of received arrays
# must not run out of descriptors), and passing it on copies it once.
_MAX_HELD_FILES = 256
_WRITE_STEP = 1 << 30


class Memfd:
    """An open memfd, closed once nothing refers to it (or at :meth:`close`)."""

    __slots__ = ('fd', '__weakref__')

    def __init__(self, fd: int):
        self.fd = fd

    def close(self, _close=os.close) -> None:  # os may be gone when the interpreter exits.
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)

    def __del__(self):
        self.close()


class Descriptors:
    """The first part of a frame whose buffers travel in shared memory: the files to pass
    along with its first bytes (:func:`courier.transport.frames.send`)."""

    __slots__ = ('files', 'ancillary')

    def __init__(self, files: List[Memfd]):
        self.files = files  # Holds them open until the frame is sent or dropped.
        self.ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array('i', [file.fd for file in files]).tobytes())]


def share(buffers: Sequence[Any]) -> Tuple[List[Any], Optional[Descriptors]]:
    """Returns the frame's buffers with those of :data:`MIN_BYTES` or more replaced by the
    size (with :data:`SHARED_BIT`) of the shared memory holding them, and the files to pass
    (None when every buffer goes through the socket)."""
    shared: List[Any] = []
    files: List[Memfd] = []
    for buffer in buffers:
        view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        if view.nbytes < MIN_BYTES or len(files) >= MAX_DESCRIPTORS:
            shared.append(buffer)
            continue
        files.append(_file_holding(view))
        shared.append(view.nbytes | SHARED_BIT)
    if not files:
        return list(buffers), None
    return shared, Descriptors(files)


def take_descriptors(ancillary: List[tuple], into: List[int]) -> None:
    """Appends the descriptors that ``recvmsg`` passed in ``ancillary`` to ``into``."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            descriptors = array.array('i')
            descriptors.frombytes(data[:len(data) - len(data) % descriptors.itemsize])
            into.extend(descriptors)


def receive(fd: int, size: int) -> memoryview:
    """Maps ``size`` bytes of the received memfd ``fd`` read-only (taking ``fd`` over).

    Raises:
      ValueError: ``fd`` is not a sealed file of at least ``size`` bytes, as courier's
        sender makes them (its content could then change, or shrink under the mapping).
    """
    file = Memfd(fd)
    if size <= 0:
        raise ValueError('the peer passed shared memory for an empty buffer')
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        length = os.fstat(fd).st_size
    except OSError as error:
        raise ValueError(f'the peer passed a descriptor that is not a memfd ({error})') from None
    if seals & _SEALS != _SEALS or length < size:
        raise ValueError(f'the peer passed shared memory that is not sealed or too small '
                         f'({length} bytes for a buffer of {size}, seals {seals:#x})')
    try:
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except OSError:  # Out of mappings (vm.max_map_count): a private copy instead.
        copy = bytearray(size)
        view = memoryview(copy)
        done = 0
        while done < size:
            done += os.preadv(fd, [view[done:]], done)
        return view.toreadonly()
    _received.hold(mapping, file)
    return memoryview(mapping)


class _Received:
    """The files of live received mappings, by mapping: what is passed on without a copy."""

    def __init__(self):
        self._files: Dict[int, Tuple[weakref.ref, Memfd]] = {}

    def hold(self, mapping: mmap.mmap, file: Memfd) -> None:
        if len(self._files) >= _MAX_HELD_FILES:
            return  # The mapping alone keeps the memory; the file closes now.
        key = id(mapping)
        self._files[key] = (weakref.ref(mapping, lambda _, key=key: self._files.pop(key, None)),
                            file)

    def file_of(self, mapping: Any, size: int) -> Optional[Memfd]:
        entry = self._files.get(id(mapping))
        if entry is None or entry[0]() is not mapping or len(mapping) != size:
            return None
        return entry[1]


class _Placed:
    """The shared memory of read-only buffers sent before, by exporting object, while it lives."""

    def __init__(self):
        self._lock = threading.Lock()
        self.writing = threading.Lock()  # Held while a buffer is looked up and placed.
        self._files: Dict[int, Tuple[weakref.ref, int, Memfd]] = {}

    def get(self, owner: Any, size: int) -> Optional[Memfd]:
        entry = self._files.get(id(owner))
        if entry is None or entry[0]() is not owner or entry[1] != size:
            return None
        return entry[2]

    def put(self, owner: Any, size: int, file: Memfd) -> None:
        key = id(owner)
        try:
            reference = weakref.ref(owner, lambda _, key=key: self._forget(key))
        except TypeError:  # Not weakly referable (bytes): it cannot be told apart later.
            return
        with self._lock:
            self._files[key] = (reference, size, file)

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._files.get(key)
            if entry is not None and entry[0]() is None:
                del self._files[key]


_received = _Received()
_placed = _Placed()


def _file_holding(view: memoryview) -> Memfd:
    """The sealed memfd holding ``view``'s bytes: the one it was received in or placed in
    before, else a new one."""
    owner = _root(view.obj)
    if isinstance(owner, mmap.mmap):
        file = _received.file_of(owner, view.nbytes)
        if file is not None:
            return file
    if not view.readonly:
        return _write(view)
    exporter = view.obj
    with _placed.writing:  # Many callers of one new value at once: one writes, all share.
        file = _placed.get(exporter, view.nbytes)
        if file is None:
            file = _write(view)
            _placed.put(exporter, view.nbytes, file)
    return file


def _write(view: memoryview) -> Memfd:
    file = Memfd(os.memfd_create('courier', os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
    data = view.cast('B') if view.format != 'B' or view.ndim != 1 else view
    size = data.nbytes
    os.ftruncate(file.fd, size)
    done = 0
    while done < size:
        done += os.pwrite(file.fd, data[done:done + _WRITE_STEP], done)
    fcntl.fcntl(file.fd, fcntl.F_ADD_SEALS, _SEALS)
    return file


def _root(obj: Any) -> Any:
    """The object that owns the memory ``obj`` exports (numpy bases, memoryviews followed)."""
    for _ in range(32):
        if isinstance(obj, memoryview):
            obj = obj.obj
        elif type(obj).__module__ == 'numpy' and getattr(obj, 'base', None) is not None:
            obj = obj.base
        else:
            break
    return obj


def _reset_after_fork() -> None:
    # A child inherits no threads holding the lock, and keeps the parent's files: its own.
    _placed._lock = threading.Lock()  # pylint: disable=protected-access
    _placed.writing = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
