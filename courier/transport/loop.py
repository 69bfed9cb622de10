"""The framed server's event loop: one thread accepts connections, reads their hellos and
watches the idle ones, so that a connection costs a socket and a little memory, not a thread.

    listener ──accept──▶ [TLS handshake] ──▶ hello (the loop reads it, non-blocking, all
                             │                        within hello_timeout)
                             │ HTTP/2's preface, or ALPN h2: a gRPC client ──▶ relay(...)
                             │ welcomed                        refused, timed out: closed
                             ▼
          watched (in the selector) ──readable──▶ the loop reads what came, without waiting;
                             ▲                    each whole frame ──▶ serve(connection, frame)
                             │                      futures connection: its calls go to the
                             │                        pool, the loop goes on reading it
                             │                      blocking connection: a worker takes it and
                             │                        runs the call, then its next ones │
                             └── resume(connection) ◀── the worker is done with it for now
                                 (the wake socket tells the loop)

A frame that is not whole stays with the loop until the rest comes, so a client that stops
in the middle of a frame (a host that dropped off the network, a hostile peer) holds no
worker; one silent for ``stall_timeout`` in the middle of a frame is dropped, however long
a frame whose bytes keep coming takes. Cancellations are read here too, while every worker
is busy, so a call cancelled before a worker took it never runs.

Accepting stops for a while (doubling from 10 ms up to 1 s) when the process runs out of
file descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): pending clients wait in the
listen backlog instead of the loop spinning, and serving resumes by itself. A connection
beyond ``max_connections``, or beyond ``max_connections_per_client`` from one client
process (one host for TCP), gets a REFUSED frame saying which limit it hit.

The loop never blocks: it reads with MSG_DONTWAIT (a TLS socket stays non-blocking). It
does not care which family its sockets are (Unix or TCP) beyond :func:`client_of` and
turning Nagle's delay off for TCP. A TLS server's handshakes happen here too; a TLS client
at a connection limit gets its refusal after the handshake, when it can read it.
"""

from __future__ import annotations

import collections
import errno
import logging
import selectors
import socket
import struct
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set

from courier.transport import frames
from courier.transport import outbox
from courier.transport.limits import ServerLimits

_logger = logging.getLogger('courier')

BACKLOG = 1024
_ACCEPTS_PER_WAKE = 64  # Then the loop looks at its other sockets again.
_FRAMES_PER_TURN = 64  # Frames of one connection served per wake, for the same reason.
_BACKOFF_FIRST = 0.01
_BACKOFF_MAX = 1.0
# Accept errors that mean "out of a resource for now": accepting again later may work.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Accept errors about one connection that went away before it was accepted.
_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})

HELLO, IDLE, ACTIVE, RELAYED, CLOSED = 'hello', 'idle', 'active', 'relayed', 'closed'
# TLS clients at a connection limit waiting for their handshake, to read their refusal; more
# are closed without one.
_MAX_TLS_REFUSALS = 64
_HTTP2_PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'
_TLS_RECORD = b'\x16'  # The first byte of a TLS handshake record (a ClientHello).


class AcceptedConnection:
    """A client's connection as the server sees it, from accept to close."""

    __slots__ = ('sock', 'client', 'state', 'mode', 'reader', 'hello', 'deadline', 'outbox',
                 'calls', 'lock', 'busy', 'parked', 'ended', 'tls', 'handshake', 'refusal',
                 'shared', 'welcome', '__weakref__')

    def __init__(self, sock: socket.socket, client: Any):
        self.sock = sock
        self.client = client
        self.state = HELLO
        self.mode = frames.SYNC
        self.reader = frames.FrameReader(sock)
        self.hello = bytearray()  # The hello's bytes so far.
        self.deadline = 0.0
        self.outbox: Optional[outbox.Outbox] = None
        # Futures connections: call id -> [calls with that id not answered, cancelled].
        self.calls: Dict[int, List[Any]] = {}
        self.lock = threading.Lock()  # Orders a cancellation or the end against a call's end.
        self.busy = False  # A blocking call waits for a worker, runs or answers.
        self.parked = False  # Too many calls in flight: nobody reads it until some end.
        self.ended = False  # The client closed its side: close once the calls in flight end.
        self.tls = False  # Its socket is a TLS socket (non-blocking, also once welcomed).
        self.handshake: Optional[str] = None  # What its TLS handshake waits for: 'read', 'write'.
        self.refusal: Optional[str] = None  # A TLS client at a limit: refused after the handshake.
        # Large buffers go both ways in shared memory (frames.SHARED_MEMORY): set by greet.
        self.shared = False
        self.welcome = b''  # The text of its WELCOME (frames.SAME_HOST): set by greet.

    @property
    def idle(self) -> bool:
        return not self.busy and not self.calls


def client_of(sock: socket.socket) -> Any:
    """Who is calling, for the per-client limit: the peer's process (Unix) or host (TCP)."""
    if sock.family == socket.AF_UNIX and hasattr(socket, 'SO_PEERCRED'):
        try:
            credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                          struct.calcsize('3i'))
            return ('pid', struct.unpack('3i', credentials)[0])
        except OSError:
            return ('pid', None)
    try:
        return ('host', sock.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return ('host', None)


class Loop:
    """The thread that accepts, greets and watches the connections of a server's listeners.

    Args:
      listeners: bound, listening stream sockets of any family (a TCP server's port, and its
        same-host Unix socket, :mod:`.same_host`).
      greet: ``greet(connection, hello)`` returns None to welcome the connection (having set
        ``connection.shared`` if large buffers go in shared memory, and ``connection.welcome``
        to the WELCOME's text), or the REFUSED frame's (reason, message); runs on the loop
        thread, so it must not block.
      serve: ``serve(connection, frame)`` is called on the loop thread with each whole frame
        a welcomed connection sent, and must not block. A blocking (SYNC) connection is then
        the callee's until it calls :meth:`resume`; for a futures (PIPELINED) connection it
        returns whether the loop goes on reading it (False: not until :meth:`resume`).
      end: ``end(connection, error)`` is called on the loop thread when the loop stops
        reading a welcomed connection for good: the peer closed it (EOFError), it failed
        (OSError), it broke the protocol or stalled in a frame (ProtocolViolation), or reading
        it failed otherwise (logged); the connection is the callee's, to close.
      limits: the server's limits.
      name: names the thread.
      tls: the ``ssl.SSLContext`` of a TLS server; every connection starts with a handshake.
      relay: ``relay(connection, sock, data)`` takes a gRPC client's connection (non-blocking;
        ``data``: what it sent so far) until it calls :meth:`close`; None: gRPC clients are
        treated as any peer that is not courier's.
    """

    def __init__(self, listeners: Sequence[socket.socket], *,
                 greet: Callable[[AcceptedConnection, frames.Frame], Optional[tuple]],
                 serve: Callable[[AcceptedConnection, frames.Frame], bool],
                 end: Callable[[AcceptedConnection, BaseException], None], limits: ServerLimits,
                 name: str, tls: Any = None,
                 relay: Optional[Callable[[AcceptedConnection, Any, bytes], None]] = None):
        self._listeners = tuple(listeners)
        self._greet = greet
        self._serve = serve
        self._end = end
        self.limits = limits
        self._tls = tls
        self._relay = relay
        self._would_block: tuple = (BlockingIOError,)
        if tls is not None:
            from courier.transport import tls as tls_module  # pylint: disable=import-outside-toplevel
            self._tls_module = tls_module
            self._would_block = tls_module.WOULD_BLOCK
        self._refusing = 0  # TLS clients at a limit, waiting for their handshake.
        self._name = name
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._woken = False
        self._lock = threading.Lock()
        self._connections: Set[AcceptedConnection] = set()
        self._per_client: Dict[Any, int] = collections.Counter()
        # In order of their deadlines:
        self._hellos: Deque[AcceptedConnection] = collections.deque()
        self._resumed: Deque[AcceptedConnection] = collections.deque()
        self._again: List[AcceptedConnection] = []  # Connections with more frames read already.
        # Watched connections in the middle of a frame:
        self._stalled: Set[AcceptedConnection] = set()
        self._stall_check_at: Optional[float] = None
        self._backoff = _BACKOFF_FIRST
        self._accepting_at: Optional[float] = None  # While backing off: when to accept again.
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._listen()
        self._selector.register(self._wake_read, selectors.EVENT_READ, self._drain_wake)
        self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
        self._thread.start()

    def connections(self) -> List[AcceptedConnection]:
        with self._lock:
            return list(self._connections)

    def resume(self, connection: AcceptedConnection) -> None:
        """Gives ``connection`` back to the loop: it watches it for the next call. Any thread."""
        self._resumed.append(connection)
        self._wake()

    def close(self, connection: AcceptedConnection) -> None:
        """Closes ``connection`` and forgets it. Any thread, any number of times."""
        with self._lock:
            if connection.state == CLOSED:
                return
            connection.state = CLOSED
            self._connections.discard(connection)
            if connection.refusal is not None:
                self._refusing -= 1
            self._per_client[connection.client] -= 1
            if not self._per_client[connection.client]:
                del self._per_client[connection.client]
        _close_socket(connection.sock)
        connection.reader.close_descriptors()

    def stop(self) -> None:
        """Stops accepting and watching; the connections still open (`connections()`) are the
        caller's now."""
        self._stopping = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        else:
            self._shut()

    # The loop thread.

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select(0 if self._again else self._timeout()):
                    if self._stopping:
                        break
                    if isinstance(key.data, AcceptedConnection):
                        self._readable(key.data)
                    else:  # The listener or the wake socket: its handler.
                        key.data(key.fileobj)
                self._take_resumed()
                self._take_again()
                now = time.monotonic()
                self._expire_hellos(now)
                self._expire_stalls(now)
                if self._accepting_at is not None and now >= self._accepting_at:
                    self._accepting_at = None
                    self._listen()
        except Exception:  # pylint: disable=broad-except
            _logger.exception('courier server %s: its event loop failed', self._name)
        finally:
            self._shut()

    def _shut(self) -> None:
        self._stopping = True
        for connection in self.connections():
            if connection.state == HELLO:
                self.close(connection)
        self._selector.close()
        for listener in self._listeners:
            _close_socket(listener)
        _close_socket(self._wake_read)
        _close_socket(self._wake_write)

    def _timeout(self) -> Optional[float]:
        ends = []
        if self._hellos:
            ends.append(self._hellos[0].deadline)
        if self._stall_check_at is not None:
            ends.append(self._stall_check_at)
        if self._accepting_at is not None:
            ends.append(self._accepting_at)
        return max(0.0, min(ends) - time.monotonic()) if ends else None

    def _wake(self) -> None:
        if self._woken:
            return
        self._woken = True
        try:
            self._wake_write.send(b'!')
        except OSError:  # Full (the loop is awake anyway) or closed (stopped).
            pass

    def _drain_wake(self, sock: socket.socket) -> None:
        try:
            while sock.recv(4096):
                pass
        except OSError:
            pass
        # Only now: a thread waking the loop meanwhile did not write, but the loop looks at
        # what it resumed after this anyway.
        self._woken = False

    def _take_resumed(self) -> None:
        resumed = self._resumed
        while resumed:
            connection = resumed.popleft()
            if connection.state != ACTIVE:
                continue  # Closed meanwhile.
            connection.state = IDLE
            try:
                self._selector.register(connection.sock, selectors.EVENT_READ, connection)
            except (OSError, ValueError):  # Closed by its worker meanwhile.
                self.close(connection)
                continue
            if connection.reader.buffered:  # Part of its next frame, or more, was read already.
                self._read_frames(connection)
            else:
                connection.reader.release()

    def _take_again(self) -> None:
        again, self._again = self._again, []
        for connection in again:
            if connection.state == IDLE:
                self._read_frames(connection)

    def _readable(self, connection: AcceptedConnection) -> None:
        if connection.state == HELLO:
            self._read_hello(connection)
        else:
            self._read_frames(connection)

    def _read_frames(self, connection: AcceptedConnection) -> None:
        """Reads what a watched connection sent, without waiting, and serves its whole frames.

        A frame that is not whole stays with its reader until more comes (see
        ``stall_timeout``): it never holds a worker.
        """
        reader = connection.reader
        for _ in range(_FRAMES_PER_TURN):
            try:
                frame = reader.read_frame(wait=False)
                if connection.mode == frames.SYNC:
                    self._unwatch(connection)  # The callee's from now on.
                    self._serve(connection, frame)
                    return
                if not self._serve(connection, frame):
                    self._unwatch(connection)
                    return
            except BlockingIOError:
                if reader.partial:
                    self._stalling(connection)
                return
            except Exception as error:  # pylint: disable=broad-except
                if not isinstance(error, (EOFError, OSError, frames.ProtocolViolation)):
                    _logger.exception('courier server %s: reading a connection failed',
                                      self._name)  # Only that connection is lost.
                if connection.state == IDLE:
                    self._unwatch(connection)
                self._end(connection, error)
                return
        self._again.append(connection)  # Maybe more read already: after the others' turn.

    def _unwatch(self, connection: AcceptedConnection) -> None:
        self._selector.unregister(connection.sock)
        connection.state = ACTIVE

    def _stalling(self, connection: AcceptedConnection) -> None:
        """Notes that ``connection`` is in the middle of a frame and has just sent some of it."""
        connection.deadline = time.monotonic() + self.limits.stall_timeout
        self._stalled.add(connection)
        if self._stall_check_at is None:
            self._stall_check_at = connection.deadline

    def _expire_stalls(self, now: float) -> None:
        """Drops the watched connections that sent nothing for stall_timeout mid-frame."""
        if self._stall_check_at is None or now < self._stall_check_at:
            return
        earliest = None
        for connection in list(self._stalled):
            if connection.state != IDLE or not connection.reader.partial:
                self._stalled.discard(connection)
            elif connection.deadline <= now:
                self._stalled.discard(connection)
                self._unwatch(connection)
                self._end(connection, frames.ProtocolViolation(
                    f'the client sent nothing for {self.limits.stall_timeout:g} s in the '
                    f'middle of a frame (stall_timeout)'))
            elif earliest is None or connection.deadline < earliest:
                earliest = connection.deadline
        self._stall_check_at = earliest

    def _listen(self) -> None:
        for listener in self._listeners:
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ, self._accept)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                self._backoff = _BACKOFF_FIRST
                return
            except OSError as error:
                if error.errno in _GONE:
                    continue
                self._back_off(error)
                return
            self._admit(sock)

    def _back_off(self, error: OSError) -> None:
        """Stops accepting for a while: the process is out of descriptors or memory."""
        delay = self._backoff
        self._backoff = min(2 * delay, _BACKOFF_MAX)
        if delay == _BACKOFF_FIRST or delay == _BACKOFF_MAX:
            _logger.warning('courier server %s cannot accept connections (%s); trying again in '
                            '%g s (%d connections open)', self._name, error, delay,
                            len(self._connections))
        for listener in self._listeners:
            self._selector.unregister(listener)
        self._accepting_at = time.monotonic() + delay

    def _admit(self, sock: socket.socket) -> None:
        client = client_of(sock)
        limits = self.limits
        with self._lock:
            if len(self._connections) >= limits.max_connections:
                refusal = (f'it has {len(self._connections)} connections open, its limit '
                           f'(max_connections)')
            elif self._per_client[client] >= limits.max_connections_per_client:
                refusal = (f'this client has {self._per_client[client]} connections open to '
                           f'it, its limit (max_connections_per_client)')
            else:
                refusal = None
        if refusal is not None and (self._tls is None or self._refusing >= _MAX_TLS_REFUSALS):
            _refuse(sock, frames.BUSY, refusal, plaintext=self._tls is None)
            return
        sock.setblocking(False)
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = AcceptedConnection(sock, client)
        if self._tls is not None:
            connection.handshake = 'first'  # Its first byte tells whether it speaks TLS.
            connection.refusal = refusal
        with self._lock:
            self._connections.add(connection)
            self._per_client[client] += 1
            if refusal is not None:
                self._refusing += 1
        connection.deadline = time.monotonic() + limits.hello_timeout
        self._hellos.append(connection)
        self._selector.register(sock, selectors.EVENT_READ, connection)

    def _start_tls(self, connection: AcceptedConnection) -> bool:
        """Wraps a TLS client's socket once its first byte came; returns whether it did.

        A courier client that did not ask for TLS is told so in plaintext.
        """
        try:
            first = connection.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except OSError:
            first = b''
        if first != _TLS_RECORD:
            self._drop(connection, frames.encode(
                frames.REFUSED, frames.TLS_REQUIRED, 0, frames.TLS_REQUIRED_TEXT.encode())
                if first == bytes([frames.HELLO]) else None)
            return False
        self._selector.unregister(connection.sock)
        try:
            connection.sock = self._tls_module.wrap(self._tls, connection.sock,
                                                    server_side=True, do_handshake_on_connect=False)
        except OSError:
            self.close(connection)
            return False
        connection.reader = frames.FrameReader(connection.sock)
        connection.handshake = 'read'
        self._selector.register(connection.sock, selectors.EVENT_READ, connection)
        return True

    def _shake_hands(self, connection: AcceptedConnection) -> bool:
        """Advances a TLS handshake; returns whether it is done and the connection still open."""
        if connection.handshake == 'first' and not self._start_tls(connection):
            return False
        before = connection.handshake
        try:
            connection.handshake = self._tls_module.handshake(connection.sock)
        except OSError:  # Not TLS, not trusted, or gone.
            self._drop(connection)
            return False
        if connection.handshake is not None:
            if connection.handshake != before:
                self._selector.modify(connection.sock, selectors.EVENT_WRITE
                                      if connection.handshake == 'write' else selectors.EVENT_READ,
                                      connection)
            return False
        if before == 'write':
            self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
        if connection.refusal is not None:
            self._drop(connection, frames.encode(frames.REFUSED, frames.BUSY, 0,
                                                 connection.refusal.encode()))
            return False
        if self._relay is not None and self._tls_module.speaks_http2(connection.sock):
            self._hand_to_relay(connection, b'')
            return False
        return True

    def _hand_to_relay(self, connection: AcceptedConnection, data: bytes) -> None:
        self._selector.unregister(connection.sock)
        connection.state = RELAYED
        connection.hello = bytearray()
        self._relay(connection, connection.sock, data)

    def _read_hello(self, connection: AcceptedConnection) -> None:
        if connection.handshake is not None and not self._shake_hands(connection):
            return
        data = connection.hello
        try:
            received = connection.sock.recv(frames.HELLO_BYTES - len(data))
            # TLS may hold more of it, decrypted already: the selector would not tell.
            while (received and connection.handshake is None and self._tls is not None
                   and connection.sock.pending() and len(data) + len(received) < frames.HELLO_BYTES):
                received += connection.sock.recv(frames.HELLO_BYTES - len(data) - len(received))
        except self._would_block:
            return
        except OSError:
            received = b''
        if not received:
            self._drop(connection)
            return
        data += received
        if data[:1] == _HTTP2_PREFACE[:1] and self._relay is not None:  # A gRPC client?
            if len(data) < len(_HTTP2_PREFACE) and _HTTP2_PREFACE.startswith(data):
                return  # The rest of its preface is on its way.
            if data.startswith(_HTTP2_PREFACE):
                self._hand_to_relay(connection, bytes(data))
                return
        if len(data) < frames.HEADER.size:
            return
        kind, status, text_size, count, call_id, payload_size = frames.HEADER.unpack_from(data)
        try:
            frames.check(kind, text_size, payload_size, count, frames.HELLO_LIMITS)
        except frames.ProtocolViolation as error:
            self._drop(connection, frames.encode(frames.FAULT, 0, 0, str(error).encode()))
            return
        size = frames.HEADER.size + text_size + payload_size
        if len(data) < size:
            return
        body = frames.HEADER.size
        hello = frames.Frame(kind, status, call_id, bytes(data[body:body + text_size]),
                             bytes(data[body + text_size:size]), [])
        refusal = self._greet(connection, hello)
        if refusal is not None:
            self._drop(connection, frames.encode(frames.REFUSED, refusal[0], 0, refusal[1]))
            return
        connection.hello = bytearray()
        connection.mode = hello.status & ~frames.CAPABILITIES
        if len(data) > size:  # The client did not wait for its welcome: keep what follows.
            connection.reader.feed(bytes(data[size:]))
        try:
            connection.sock.sendall(frames.encode(
                frames.WELCOME, frames.SHARED_MEMORY if connection.shared else 0, 0,
                connection.welcome)[0])
            # A client that takes no byte of its answers for stall_timeout loses its
            # connection: it cannot hold the worker sending to it.
            frames.set_send_timeout(connection.sock, self.limits.stall_timeout)
            if self._tls is None:
                # Workers wait for the next frame in plain blocking reads up to linger_ms (the
                # loop reads with MSG_DONTWAIT); a TLS socket stays non-blocking (see frames).
                connection.sock.setblocking(True)
                frames.set_receive_timeout(connection.sock, self.limits.linger_ms / 1000)
            else:
                connection.tls = True
        except OSError:
            self._drop(connection)
            return
        connection.reader.patience = self.limits.linger_ms / 1000
        connection.outbox = outbox.Outbox(connection.sock)
        frames.enlarge_send_buffer(connection.sock)
        connection.state = IDLE
        if connection.shared:
            connection.reader.take_descriptors()
        if connection.reader.buffered:
            self._read_frames(connection)

    def _drop(self, connection: AcceptedConnection, parts: Optional[List[Any]] = None) -> None:
        """Ends a connection in its hello, after sending ``parts`` (a refusal) if given."""
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        if parts is not None:
            try:
                connection.sock.send(parts[0])
            except OSError:
                pass
            _discard_input(connection.sock)
        self.close(connection)

    def _expire_hellos(self, now: float) -> None:
        hellos = self._hellos
        while hellos and (hellos[0].deadline <= now or hellos[0].state != HELLO):
            connection = hellos.popleft()
            if connection.state == HELLO:
                self._drop(connection)


def _refuse(sock: socket.socket, reason: int, message: str, plaintext: bool = True) -> None:
    """Refuses a connection just accepted: says why (unless it expects TLS first) and closes."""
    try:
        sock.setblocking(False)
        if plaintext:
            sock.send(frames.encode(frames.REFUSED, reason, 0, message.encode())[0])
    except OSError:
        pass
    _discard_input(sock)
    sock.close()


def _discard_input(sock: socket.socket) -> None:
    """Reads what the peer sent and nobody will read (a hello, mostly), without waiting.

    Closing a socket with unread input resets the connection, and the peer may then lose the
    refusal or fault just sent to it.
    """
    try:
        for _ in range(16):
            if not sock.recv(frames.HELLO_BYTES):
                return
    except OSError:  # Nothing more for now (or the peer is gone).
        pass


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # Wakes a thread blocked reading it.
    except OSError:
        pass
    sock.close()
