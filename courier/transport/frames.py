"""Frames of courier's framed protocol, and how they are sent and read on a socket.

The framed protocol carries courier's calls over Unix domain sockets on one host and over TCP
(optionally TLS) between hosts. A frame is a fixed header, a table of buffer sizes, a short text
(a method name, an auth token or an error message), a payload (usually a pickle) and then the
out-of-band buffers, back to back. Nothing is encoded beyond that, so a small call is one ``send``
and one ``recv`` on each side, and a large buffer goes from the sender's array to the socket and
from the socket into memory the receiver keeps, without copies in between.
"""

from __future__ import annotations

import collections
import functools
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any, List, Optional, Sequence

from courier.transport import _base
from courier.transport import shm

VERSION = 1
MAGIC = b'courier-local'

# Frame kinds.
HELLO = 1     # client -> server: status = mode, text = auth token, payload = MAGIC.
WELCOME = 2   # server -> client: the hello was accepted.
REFUSED = 3   # server -> client: status = reason, text = message; the server closes.
CALL = 4      # text = method, payload = pickle, buffers = out-of-band buffers.
RESPONSE = 5  # status = wire status; OK: payload = pickle; else payload = encoded wire.Response.
CANCEL = 6    # client -> server: the caller gave up on call_id.
LIST = 7      # client -> server: list the methods.
METHODS = 8   # server -> client: payload = encoded method list.
FAULT = 9     # either way: text = why the peer broke the protocol; the sender then closes.

# HELLO modes.
SYNC = 0       # one call at a time, answered in order: the server may run it inline.
PIPELINED = 1  # many calls in flight, answered in any order, matched by call_id.
CAPABILITIES = 0xF0  # HELLO mode bits that offer something: a server ignores those it lacks.
# Offered by a client that takes large buffers in shared memory (:mod:`.shm`); a WELCOME with it:
SHARED_MEMORY = 0x40  # both sides may send them. (0x80, an older form of it, is ignored.)
SAME_HOST = 0x20  # By TCP clients: the WELCOME names the server's host and Unix socket (.same_host)

# REFUSED reasons.
TOKEN_MISSING = 1
TOKEN_WRONG = 2
BAD_HELLO = 3
BUSY = 4  # The server is at a connection limit; the text says which.
TLS_REQUIRED = 5  # A TLS server got a plaintext hello (sent in plaintext).
TLS_REQUIRED_TEXT = ('the server requires TLS; pass tls=courier.TLSConfig(root_certificates=...) '
                     'to courier.Client')
# The message a REFUSED frame carries, and its client raises, for each token refusal.
REFUSALS = {TOKEN_MISSING: _base.NO_TOKEN, TOKEN_WRONG: _base.WRONG_TOKEN}

# kind, status, text length, buffer count, call id, payload length.
HEADER = struct.Struct('<BBxxIIQQ')

_MAX_IOVECS = 512  # Well below IOV_MAX (1024 on Linux).
_JOIN_LIMIT = 64 << 10  # Frames up to this size go out as one joined bytes object.
_READ_BUFFER = 64 << 10
# recvmsg's flags as plain ints: socket's flag enums cost microseconds per operation.
_DONTWAIT = int(socket.MSG_DONTWAIT)
_CLOEXEC = int(getattr(socket, 'MSG_CMSG_CLOEXEC', 0))
_TRUNCATED = int(socket.MSG_CTRUNC)
# Received buffers from this size on live in memory advised to use huge pages: the
# kernel then faults in 2 MiB at a time, several times faster for large arrays.
_HUGE_PAGE_THRESHOLD = 1 << 20
_RECYCLE_BYTES = 256 << 20
_TABLE_STRUCTS = [struct.Struct(f'<{n}Q') for n in range(9)]
# Bytes a connection may have in flight (the kernel caps it at net.core.wmem_max): large
# arrays then cross in a few big steps instead of hundreds of 200 KiB ones (~1.4x the MB/s).
_SEND_BUFFER = 4 << 20


class ProtocolViolation(Exception):
    """The peer sent something that is not a well-formed frame."""


class Limits:
    """The largest frame a reader accepts: an unauthenticated peer gets tiny limits.

    ``text``: bytes of text; ``payload``: bytes of payload and buffers together;
    ``buffers``: how many buffers.
    """

    __slots__ = ('text', 'payload', 'buffers')

    def __init__(self, text: int, payload: int, buffers: int):
        self.text = text
        self.payload = payload
        self.buffers = buffers


HELLO_LIMITS = Limits(text=4096, payload=64, buffers=0)
TRUSTED_LIMITS = Limits(text=_base.MAX_METHOD_BYTES, payload=1 << 62, buffers=1 << 20)
# The largest hello: what the server reads of a connection before it knows who calls.
HELLO_BYTES = HEADER.size + HELLO_LIMITS.text + HELLO_LIMITS.payload


class Frame:
    """One decoded frame; ``payload`` and ``buffers`` are writable objects the receiver owns."""

    __slots__ = ('kind', 'status', 'call_id', 'text', 'payload', 'buffers')

    def __init__(self, kind: int, status: int, call_id: int, text: bytes, payload: Any,
                 buffers: List[Any]):
        self.kind = kind
        self.status = status
        self.call_id = call_id
        self.text = text
        self.payload = payload
        self.buffers = buffers


def encode(kind: int, status: int = 0, call_id: int = 0, text: bytes = b'', payload: Any = b'',
           buffers: Sequence[Any] = (), shared: bool = False) -> List[Any]:
    """Returns the parts of a frame, to be sent back to back (see :func:`send`).

    ``shared``: the peer takes large buffers in shared memory (:mod:`.shm`); the first part
    is then the files to pass, if any buffer goes that way.
    """
    payload_size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    if not buffers:
        header = HEADER.pack(kind, status, len(text), 0, call_id, payload_size)
        if payload_size < _JOIN_LIMIT:
            return [header + text + payload]
        return [header + text, payload]
    descriptors = None
    if shared:
        buffers, descriptors = shm.share(buffers)
        if descriptors is not None:
            sizes = [buffer if buffer.__class__ is int else
                     buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
                     for buffer in buffers]
            table = struct.Struct(f'<{len(sizes)}Q').pack(*sizes)
            head = HEADER.pack(kind, status, len(text), len(sizes), call_id,
                               payload_size) + table + text
            return [descriptors, head, payload,
                    *(buffer for buffer in buffers if buffer.__class__ is not int)]
    sizes = [buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
             for buffer in buffers]
    count = len(sizes)
    table = (_TABLE_STRUCTS[count] if count < len(_TABLE_STRUCTS)
             else struct.Struct(f'<{count}Q')).pack(*sizes)
    head = HEADER.pack(kind, status, len(text), count, call_id, payload_size) + table + text
    if payload_size + sum(sizes) < _JOIN_LIMIT:
        return [b''.join((head, payload, *buffers))]
    return [head, payload, *buffers]


def send_frame(sock: socket.socket, kind: int, status: int = 0, call_id: int = 0,
               text: bytes = b'', payload: Any = b'', buffers: Sequence[Any] = (),
               shared: bool = False) -> None:
    """Sends one frame: :func:`encode` then :func:`send`, in one step for a small frame
    without buffers on a plain socket (most calls and answers): one ``sendall``."""
    if not buffers and sock.__class__ is socket.socket:
        size = payload.nbytes if payload.__class__ is memoryview else len(payload)
        if size < _JOIN_LIMIT:
            sock.sendall(HEADER.pack(kind, status, len(text), 0, call_id, size) + text + payload)
            return
    send(sock, encode(kind, status, call_id, text, payload, buffers, shared))


def send(sock: socket.socket, parts: Sequence[Any]) -> None:
    """Sends every byte of ``parts``, in order (on a plain or a TLS socket)."""
    if sock.__class__ is not socket.socket:  # TLS: no sendmsg; a record per part is fine.
        for part in parts:
            _send_tls(sock, part)
        return
    if len(parts) == 1:
        sock.sendall(parts[0])
        return
    ancillary = ()
    descriptors = parts[0]  # Passed with the frame's first bytes; holds its files till then.
    if descriptors.__class__ is shm.Descriptors:
        ancillary, parts = descriptors.ancillary, parts[1:]
    views = [view for view in (memoryview(part).cast('B') for part in parts) if view.nbytes]
    while views:
        sent = sock.sendmsg(views[:_MAX_IOVECS], ancillary)
        ancillary = ()
        while sent:
            if sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            else:
                views[0] = views[0][sent:]
                sent = 0


def enlarge_send_buffer(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
    except OSError:  # Not allowed here: the default works, only slower for large arrays.
        pass


def allocate(size: int) -> Any:
    """Returns ``size`` writable bytes the caller owns (not necessarily zeroed)."""
    if size < _HUGE_PAGE_THRESHOLD:
        return bytearray(size)
    return _recycler.take(size)


class _Recycler:
    """Hands out large receive buffers, reusing one when nothing else references it anymore.

    A process that receives arrays of one size again and again (parameters, batches)
    then writes into memory that is already mapped, instead of faulting in and
    zeroing fresh pages for every message. At most ``_RECYCLE_BYTES`` stay cached.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._buffers: List[mmap.mmap] = []

    def take(self, size: int) -> mmap.mmap:
        with self._lock:
            for buffer in self._buffers:
                # References: the list, the loop variable and getrefcount's argument.
                if len(buffer) == size and sys.getrefcount(buffer) == 3:
                    return buffer
        buffer = _fresh_memory(size)
        if size <= _RECYCLE_BYTES // 2:
            with self._lock:
                self._buffers.append(buffer)
                while sum(len(cached) for cached in self._buffers) > _RECYCLE_BYTES:
                    del self._buffers[0]
        return buffer

    def reset(self) -> None:
        self._lock = threading.Lock()


def _fresh_memory(size: int) -> mmap.mmap:
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    madvise = getattr(memory, 'madvise', None)
    huge_pages = getattr(mmap, 'MADV_HUGEPAGE', None)
    if madvise is not None and huge_pages is not None:
        try:
            madvise(huge_pages)
        except OSError:  # The kernel has no transparent huge pages: plain pages then.
            pass
    return memory


_recycler = _Recycler()
os.register_at_fork(after_in_child=_recycler.reset)


class FrameReader:
    """Reads frames from a stream socket (plain or TLS) through a reusable buffer.

    A frame may arrive in pieces over time: when the socket has nothing more for now,
    :meth:`read_frame` raises BlockingIOError and keeps what it read, and the next call
    goes on with the same frame. So a server reads frames on its event loop without ever
    waiting, and its workers wait for the rest of a frame only while it comes steadily
    (``patience``).
    """

    def __init__(self, sock: socket.socket):
        self._sock = sock
        # A TLS socket's (made by tls.wrap): each SSL read and write of a non-blocking one
        # holds it, as another thread may be using the socket; see _receive_tls.
        self._tls_lock: Optional[threading.Lock] = (
            sock.courier_lock if hasattr(sock, 'pending') else None)
        if self._tls_lock is not None:
            self._receive_waiting = self._receive_tls_waiting
            self._receive_now = self._receive_tls_now
        else:
            self._receive_waiting = sock.recv_into
            self._receive_now = functools.partial(sock.recv_into, nbytes=0,
                                                  flags=socket.MSG_DONTWAIT)
        self._receive_into = sock.recv_into
        # Descriptors the peer passed, in order (None: the connection passes none, see
        # take_descriptors); each buffer of a frame that travels in shared memory takes one.
        self._descriptors: Optional[collections.deque] = None
        self._buffer = _EMPTY  # Allocated at the first read: an idle connection holds none.
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._frame: Optional[_Partial] = None  # The frame being read, once its header is in.
        self._wait = True  # How the read in progress receives (see read_frame).
        self._receives_left = 0  # What a read that does not wait may still receive.
        # Seconds a read that waits gives a frame that is not whole to come on (None: no
        # bound): unless STEADY_BYTES of it came meanwhile, it then raises BlockingIOError as
        # if the socket had timed out. A server's workers read with one, so that a frame that
        # comes slowly, or stops, goes back to the event loop.
        self.patience: Optional[float] = None
        self._impatient_at: Optional[float] = None
        self._progress = 0  # Bytes received since _impatient_at was set.

    @property
    def buffered(self) -> bool:
        """Whether bytes of the next frame were read already (so no need to wait for the socket)."""
        if self._end > self._start or self._frame is not None:
            return True
        if self._tls_lock is None:
            return False
        with self._tls_lock:  # TLS may hold decrypted bytes that the descriptor no longer shows.
            return self._sock.pending() > 0

    @property
    def partial(self) -> bool:
        """Whether bytes of a frame that :meth:`read_frame` has not returned were read (after
        it raised BlockingIOError: the frame is not whole yet)."""
        return self._end > self._start or self._frame is not None

    def peek(self, size: int) -> bytes:
        """Returns the next ``size`` bytes without consuming them (fewer if the peer closed)."""
        self._wait = True
        try:
            self._fill(size)
        except EOFError:
            pass
        return bytes(self._view[self._start:min(self._end, self._start + size)])

    def feed(self, data: bytes) -> None:
        """Takes ``data`` as if read from the socket, ahead of what the socket holds."""
        self._make_room(self._end - self._start + len(data))
        self._view[self._end:self._end + len(data)] = data
        self._end += len(data)

    def take_descriptors(self) -> None:
        """Receives the descriptors a peer passes (shared memory, :mod:`.shm`) from now on."""
        self._descriptors = collections.deque()
        self._receive_into = self._receive_with_descriptors
        self._receive_waiting = self._receive_with_descriptors
        self._receive_now = functools.partial(self._receive_with_descriptors,
                                              flags=_DONTWAIT | _CLOEXEC)

    def close_descriptors(self) -> None:
        """Closes the descriptors received and not used (the connection is closing)."""
        descriptors = self._descriptors
        while descriptors:
            os.close(descriptors.popleft())

    def _receive_with_descriptors(self, view: memoryview, flags: int = _CLOEXEC) -> int:
        count, ancillary, message_flags, _ = self._sock.recvmsg_into(
            [view], shm.ANCILLARY_SPACE, flags)
        if ancillary:
            shm.take_descriptors(ancillary, self._descriptors)
        if message_flags & _TRUNCATED:
            raise ProtocolViolation('the peer passed more descriptors than a message may carry')
        return count

    def _shared_part(self, size: int) -> memoryview:
        """The next buffer of the frame, which the peer passed in shared memory."""
        if not self._descriptors:
            raise ProtocolViolation('a buffer in shared memory came without its descriptor'
                                    if self._descriptors is not None else
                                    'a buffer in shared memory on a connection without it')
        try:
            return shm.receive(self._descriptors.popleft(), size)
        except ValueError as error:
            raise ProtocolViolation(str(error)) from None

    def release(self) -> None:
        """Frees the read buffer if it holds nothing: a connection going idle keeps no memory."""
        if self._end == self._start:
            self._buffer = _EMPTY
            self._view = memoryview(self._buffer)
            self._start = self._end = 0

    def read_frame(self, limits: Limits = TRUSTED_LIMITS, wait: bool = True) -> Frame:
        """Returns the next frame.

        ``wait``: receive as the socket does (blocking, or up to its timeouts), and over a frame
        that is not whole while it comes steadily (see ``patience``); False: take only what the
        socket holds now (a few receives at most, so that one busy connection cannot hold the
        caller).

        Raises:
          BlockingIOError: the frame is not whole yet (no more bytes now, the socket's receive
            timeout passed, or the patience ran out); what was read is kept (see ``partial``).
          EOFError: the peer closed the connection (possibly mid-frame).
          ProtocolViolation: the frame breaks ``limits``.
          OSError: the socket failed or timed out (a timeout set with ``settimeout``).
        """
        self._wait = wait
        if wait:
            self._impatient_at = None  # Patience is per call.
        else:
            self._receives_left = _RECEIVES_PER_TURN
        if self._frame is not None:
            return self._read_parts()
        start = self._start
        if self._end - start < HEADER.size:
            if wait and self._end == start and self._buffer is not _EMPTY:
                # Nothing buffered, as between calls: one receive at the front of the buffer.
                count = self._receive_waiting(self._view)
                if not count:
                    raise EOFError('the peer closed the connection')
                self._start = start = 0
                self._end = count
            if self._end - start < HEADER.size:
                self._fill(HEADER.size)
                start = self._start
        kind, status, text_size, count, call_id, payload_size = HEADER.unpack_from(
            self._buffer, start)
        if text_size > limits.text or payload_size > limits.payload or count > limits.buffers:
            check(kind, text_size, payload_size, count, limits)  # Raises, saying why.
        body = start + HEADER.size
        end = body + text_size + payload_size
        if not count and end <= self._end:  # The whole frame is here: the common case.
            self._start = end
            buffer = self._buffer
            return Frame(kind, status, call_id,
                         bytes(buffer[body:body + text_size]) if text_size else b'',
                         buffer[body + text_size:end], [])
        sizes = ()
        if count:
            self._fill(HEADER.size + 8 * count)  # The header stays until its table is in.
            sizes = (_TABLE_STRUCTS[count] if count < len(_TABLE_STRUCTS)
                     else struct.Struct(f'<{count}Q')).unpack_from(
                         self._buffer, self._start + HEADER.size)
            total = sum(sizes)
            if total >= shm.SHARED_BIT:  # Buffers in shared memory are not in the stream.
                total = sum(size & ~shm.SHARED_BIT for size in sizes)
            if payload_size + total > limits.payload:
                raise ProtocolViolation(f'frame of kind {kind} is too large (its payload and '
                                        f'buffers add up to {payload_size + total} bytes)')
        self._start += HEADER.size + 8 * count
        self._frame = _Partial(kind, status, call_id, (text_size, payload_size, *sizes))
        return self._read_parts()

    def _read_parts(self) -> Frame:
        """Reads the text, payload and buffers of the frame whose header was read."""
        frame = self._frame
        sizes, parts = frame.sizes, frame.parts
        while len(parts) < len(sizes):
            size = sizes[len(parts)]
            if size <= _READ_BUFFER:
                self._fill(size)
                parts.append(self._buffer[self._start:self._start + size])  # A copy: ours.
                self._start += size
                continue
            if size & shm.SHARED_BIT:
                parts.append(self._shared_part(size & ~shm.SHARED_BIT))
                continue
            if frame.filling is None:
                frame.filling = allocate(size)
                frame.filled = min(size, self._end - self._start)
                frame.filling[:frame.filled] = self._view[self._start:self._start + frame.filled]
                self._start += frame.filled
            destination = memoryview(frame.filling)
            while frame.filled < size:
                frame.filled += self._receive(destination[frame.filled:])
            parts.append(frame.filling)
            frame.filling = None
        self._frame = None
        return Frame(frame.kind, frame.status, frame.call_id, bytes(parts[0]), parts[1],
                     parts[2:])

    def _receive(self, view: memoryview) -> int:
        if self._wait:
            if self.patience is None or (self._end == self._start and self._frame is None):
                count = self._receive_waiting(view)
            else:  # Within a frame: a bounded wait.
                count = self._receive_patiently(view)
        else:
            if self._receives_left <= 0:
                raise BlockingIOError('enough for one turn')
            self._receives_left -= 1
            count = self._receive_now(view)
        if not count:
            raise EOFError('the peer closed the connection')
        return count

    def _receive_patiently(self, view: memoryview) -> int:
        """Receives the rest of a frame for a reader that waits, while it comes steadily: at
        least ``STEADY_BYTES`` every ``patience`` seconds."""
        now = time.monotonic()
        if self._impatient_at is None or (now >= self._impatient_at
                                          and self._progress >= STEADY_BYTES):
            self._impatient_at = now + self.patience
            self._progress = 0
        elif now >= self._impatient_at:
            raise BlockingIOError('the rest of the frame is slow to come')
        if self._tls_lock is not None:
            count = self._receive_tls(view, self._impatient_at - now)
        else:
            count = self._receive_into(view)
        self._progress += count
        return count

    def _receive_tls_waiting(self, view: memoryview) -> int:
        return self._receive_tls(view, self.patience)

    def _receive_tls_now(self, view: memoryview) -> int:
        return self._receive_tls(view, 0.0)

    def _receive_tls(self, view: memoryview, wait: Optional[float]) -> int:
        """Receives on a TLS socket, waiting up to ``wait`` seconds for bytes (None: until they
        come). A non-blocking one (two threads use it) is read holding its lock, not the waits;
        a blocking one (one thread's: a caller's connection, a hello) waits as the socket does."""
        sock = self._sock
        if sock.gettimeout() != 0.0:
            return sock.recv_into(view)
        lock = self._tls_lock
        while True:
            _take(lock)
            try:
                return sock.recv_into(view)
            except OSError as error:
                if not _wants(error):
                    raise
                events = _WANTS[type(error).__name__]
            finally:
                lock.release()
            if wait == 0.0 or not _ready(sock, events, wait):
                raise BlockingIOError('no bytes for now')

    def _make_room(self, size: int) -> None:
        """Moves what is buffered to the front, in a buffer with room for ``size`` bytes."""
        available = self._end - self._start
        if self._start + size > len(self._buffer):
            if size > len(self._buffer):
                buffer = bytearray(max(size, _READ_BUFFER))
                buffer[:available] = self._view[self._start:self._end]
                self._buffer = buffer
                self._view = memoryview(buffer)
            else:
                self._view[:available] = self._view[self._start:self._end]
            self._start, self._end = 0, available

    def _fill(self, size: int) -> None:
        """Makes ``size`` bytes available at ``self._start``."""
        if self._end - self._start >= size:
            return
        self._make_room(size)
        while self._end - self._start < size:
            self._end += self._receive(self._view[self._end:])


class _Partial:
    """A frame being read: its header, and its parts (text, payload, buffers) read so far."""

    __slots__ = ('kind', 'status', 'call_id', 'sizes', 'parts', 'filling', 'filled')

    def __init__(self, kind: int, status: int, call_id: int, sizes: Sequence[int]):
        self.kind = kind
        self.status = status
        self.call_id = call_id
        self.sizes = sizes
        self.parts: List[Any] = []
        self.filling: Any = None  # A large part's memory, while it fills.
        self.filled = 0


_EMPTY = bytearray()
_RECEIVES_PER_TURN = 16  # What a read that does not wait takes before it lets others go first.
# What a frame must bring every `patience` seconds to keep a reader that waits (a worker):
# 256 KiB every 20 ms, about 13 MB/s. A large array keeps its worker; a trickle does not.
STEADY_BYTES = 256 << 10
# What a non-blocking TLS socket waits for, by what it raised: poll's events.
_WANTS = {'SSLWantReadError': select.POLLIN, 'SSLWantWriteError': select.POLLOUT}


def _wants(error: OSError) -> bool:
    """Whether a TLS socket raised ``error`` because it would block (ssl is imported lazily)."""
    return type(error).__name__ in _WANTS


def _ready(sock: socket.socket, events: int, seconds: Optional[float]) -> bool:
    """Whether ``sock`` gets ready for ``events`` within ``seconds`` (None: it waits until then;
    a socket closed meanwhile counts as ready: using it then says so)."""
    poller = select.poll()  # Not select(): it fails on descriptors above 1,024.
    try:
        poller.register(sock, events)
    except ValueError:  # Closed (its descriptor is -1).
        return True
    return bool(poller.poll(None if seconds is None else max(1, int(seconds * 1000))))


def _send_timeout(sock: socket.socket) -> float:
    """The send timeout of ``sock`` (:func:`set_send_timeout`; none set: a day)."""
    whole, micro = _TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                                                   _TIMEVAL.size))
    return whole + micro / 1e6 or 86400.0


def _send_tls(sock: Any, data: Any) -> None:
    """Sends all of ``data`` on a TLS socket; a non-blocking one waits for room.

    A non-blocking one is read by another thread meanwhile (a server's loop, a futures client's
    reader): each write holds its lock (``tls.wrap`` says why), and the waits do not."""
    if sock.gettimeout() != 0.0:
        sock.sendall(data)
        return
    lock = sock.courier_lock
    view = memoryview(data).cast('B')
    while view.nbytes:
        _take(lock)
        try:
            view, events = view[sock.send(view):], 0
        except OSError as error:
            if not _wants(error):
                raise
            events = _WANTS[type(error).__name__]
        finally:
            lock.release()
        if events and not _ready(sock, events, _send_timeout(sock)):
            raise TimeoutError(f'the peer took no bytes for {_send_timeout(sock):g} s')


def _take(lock: threading.Lock) -> None:
    """Takes a TLS socket's lock. Its holder makes one SSL call and needs the GIL to let go: a
    few yields first cost less than sleeping on the lock (up to 2x the CPU of a futures call)."""
    for _ in range(8):
        if lock.acquire(False):
            return
        os.sched_yield()  # (It lets go of the GIL.)
    lock.acquire()


def set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """Makes a blocking ``sock``'s reads raise BlockingIOError after ``seconds`` without data.

    Unlike ``sock.settimeout``, this costs no extra system call per read: the kernel keeps
    the timeout (SO_RCVTIMEO).
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))


def set_send_timeout(sock: socket.socket, seconds: float) -> None:
    """Makes sends on ``sock`` fail (BlockingIOError, TimeoutError) once its peer took no byte
    for ``seconds``: a blocking socket's by the kernel (SO_SNDTIMEO), a non-blocking TLS
    socket's by :func:`send`, which reads it back."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(seconds))


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return _TIMEVAL.pack(whole, int((seconds - whole) * 1e6))


_TIMEVAL = struct.Struct('ll')


def check(kind: int, text_size: int, payload_size: int, count: int, limits: Limits) -> None:
    """Raises ProtocolViolation if a frame with this header breaks ``limits``."""
    if text_size > limits.text or payload_size > limits.payload or count > limits.buffers:
        raise ProtocolViolation(
            f'frame of kind {kind} is too large (text {text_size} bytes, payload '
            f'{payload_size} bytes, {count} buffers)')
