"""Courier's same-host transport: light frames over Unix sockets, or no socket at all.

A server bound to a ``unix:/path`` address (without TLS) speaks this protocol
(:mod:`courier.transport.frames`) on its socket, and clients pick it by the address.
It keeps courier's guarantees: calls carry the auth token (checked once per
connection), errors, timeouts and cancellation behave as with gRPC, and a peer
sending garbage only loses its own connection.

Why it is fast: a blocking call uses a connection of its calling thread, so the
caller sends and receives on its own thread and the server runs the call on the
thread that read it (within ``thread_pool_size`` calls at once). Futures share
one pipelined connection: callers send, a reader thread completes them, and the
server runs them on its worker threads. Large buffers stream straight from the
sender's array into memory the receiver keeps.

When the server runs in the caller's own process (local_mt, colocated nodes),
calls skip the socket: arguments and results are still pickled and buffers
copied, so caller and server never share mutable objects, and the call runs on
the server's worker threads as a remote one would.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import functools
import hmac
import heapq
import itertools
import logging
import os
import queue
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Type

from courier import errors
from courier.transport import _base
from courier.transport import frames
from courier import wire

_logger = logging.getLogger('courier')

_HELLO_TIMEOUT = 10.0  # Seconds a new connection may take to introduce itself.
_RETRY_FIRST = 0.001  # Seconds between connection attempts to a server not yet up: doubling...
_RETRY_MAX = 0.02     # ... up to this, so that a node notices a new server within 20 ms.
_BACKLOG = 1024
# Bytes a connection may have in flight (the kernel caps it at net.core.wmem_max): large
# arrays then cross in a few big steps instead of hundreds of 200 KiB ones (~1.4x the MB/s).
_SEND_BUFFER = 4 << 20

_REFUSALS = {frames.TOKEN_MISSING: _base.NO_TOKEN, frames.TOKEN_WRONG: _base.WRONG_TOKEN}

# Servers of this process by socket path: calls to them skip the socket.
_servers_here: Dict[str, 'LocalServerTransport'] = {}


def _forget_servers() -> None:
    _servers_here.clear()  # A forked child has none of its parent's server threads.


os.register_at_fork(after_in_child=_forget_servers)


def connect(address: str, path: str, *, auth_token: Optional[str],
            wait_for_ready: bool) -> 'LocalClientTransport':
    """Returns a client transport for the server on Unix socket ``path``."""
    return LocalClientTransport(address, os.path.abspath(path), auth_token=auth_token,
                                wait_for_ready=wait_for_ready)


def listen(path: str, handle_call: _base.HandleCall, list_methods: Callable[[], List[str]],
           *, thread_pool_size: int, auth_token: Optional[str]) -> 'LocalServerTransport':
    """Binds Unix socket ``path`` and returns the unstarted server transport."""
    return LocalServerTransport(os.path.abspath(path), handle_call, list_methods,
                                thread_pool_size=thread_pool_size, auth_token=auth_token)


# ----- client ------------------------------------------------------------------------------------

class _ServerHere(Exception):
    """The server turned out to run in this process: call it there."""


class _Unreachable(Exception):
    """No connection could be made: ``error(method, address)`` is what each call raises."""

    def __init__(self, error: Callable[[str, str], errors.CourierError]):
        super().__init__()
        self.error = error


def _unreachable(what: str, kind: Type[errors.CourierError] = errors.ServerUnavailableError
                 ) -> _Unreachable:
    """Returns the _Unreachable whose calls raise ``kind('call to ... <what>')``."""
    return _Unreachable(functools.partial(_base.call_error, kind, what=what))


class _Connection:
    """One socket to the server, after a successful hello."""

    __slots__ = ('sock', 'reader', '__weakref__')

    def __init__(self, sock: socket.socket):
        self.sock = sock
        _enlarge_send_buffer(sock)
        self.reader = frames.FrameReader(sock)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # Wakes a thread blocked reading it.
        except OSError:
            pass
        self.sock.close()

    def __del__(self):  # The connection of a thread that ended.
        self.sock.close()


class LocalClientTransport(_base.ClientTransport):
    """Calls one server over its Unix socket, or directly when it runs in this process."""

    def __init__(self, address: str, path: str, *, auth_token: Optional[str],
                 wait_for_ready: bool):
        self.address = address
        self._path = path
        self._token = auth_token
        self._wait_for_ready = wait_for_ready
        self._local = threading.local()  # .connection: this thread's blocking connection.
        self._connections: 'weakref.WeakSet[_Connection]' = weakref.WeakSet()
        self._lock = threading.Lock()
        self._pipeline: Optional[_Pipeline] = None
        self._deadlines: Optional[_Deadlines] = None
        self._closed = False

    # Blocking calls.

    def call(self, method, pickle, buffers, timeout):
        server = _servers_here.get(self._path)
        if server is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            parts = frames.encode(frames.CALL, 0, 0, method.encode(), pickle, buffers)
            try:
                frame = self._exchange(parts, method, timeout, deadline)
            except _ServerHere:
                server = _stopped_meanwhile(self._path, method, self.address)
                if deadline is not None:
                    timeout = max(0.0, deadline - time.monotonic())
            else:
                return _response(frame, method, self.address)
        return server.call_here(self._token, method, pickle, buffers, timeout, self.address)

    def list_methods(self, timeout):
        server = _servers_here.get(self._path)
        if server is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                frame = self._exchange(frames.encode(frames.LIST), 'ListMethods',
                                       timeout, deadline)
            except _ServerHere:
                server = _stopped_meanwhile(self._path, 'ListMethods', self.address)
        if server is not None:
            server.check_token_here(self._token, 'ListMethods', self.address)
            return server.method_names()
        if frame.kind != frames.METHODS:
            raise _unexpected(frame, 'ListMethods', self.address)
        return _base.decode_method_list(frame.payload, self.address)

    def _exchange(self, parts: List[Any], method: str, timeout: Optional[float],
                  deadline: Optional[float]) -> frames.Frame:
        """Sends a request on this thread's connection and reads the answer to it."""
        connection = getattr(self._local, 'connection', None)
        for attempt in range(2):
            if connection is None:
                connection = self._connect_blocking(method, timeout, deadline)
            sock = connection.sock
            try:
                if deadline is not None:
                    _time_out_at(sock, deadline)
                elif sock.gettimeout() is not None:
                    sock.settimeout(None)
                try:
                    frames.send(sock, parts)
                except (BrokenPipeError, ConnectionResetError):
                    # The server closed this connection while it sat idle (it stopped or
                    # restarted); the request never arrived, so a new connection may carry it.
                    self._drop(connection)
                    connection = None
                    if attempt:
                        raise
                    continue
                return connection.reader.read_frame()
            except socket.timeout:
                self._drop(connection)
                raise _base.call_timeout(method, self.address, timeout) from None
            except (EOFError, OSError) as error:
                self._drop(connection)
                raise _base.call_error(errors.ServerUnavailableError, method, self.address,
                                       _went_away(error)) from None
            except frames.ProtocolViolation as error:
                self._drop(connection)
                raise _base.call_error(errors.ProtocolError, method, self.address,
                                       f'got a malformed answer: {error}') from None
            except BaseException:  # e.g. KeyboardInterrupt: the answer would come out of turn.
                self._drop(connection)
                raise
        raise AssertionError('unreachable')

    def _connect_blocking(self, method: str, timeout: Optional[float],
                          deadline: Optional[float]) -> _Connection:
        try:
            connection = _open(self._path, self._token, frames.SYNC, self._wait_for_ready,
                               deadline, here=True)
        except _Unreachable as unreachable:
            raise unreachable.error(method, self.address) from None
        except socket.timeout:
            raise _base.unreachable_timeout(method, self.address, timeout) from None
        if self._path in _servers_here:  # It started here while this thread waited for it.
            connection.close()
            raise _ServerHere
        with self._lock:
            if self._closed:
                connection.close()
                raise _closed(method, self.address)
            self._connections.add(connection)
        self._local.connection = connection
        return connection

    def _drop(self, connection: _Connection) -> None:
        if getattr(self._local, 'connection', None) is connection:
            self._local.connection = None
        connection.close()

    # Futures.

    def call_async(self, method, pickle, buffers, timeout, finish):
        future = _base.CallFuture()
        server = _servers_here.get(self._path)
        pipeline = None
        if server is not None:
            server.call_here_async(future, self._token, method, pickle, buffers, self.address,
                                   finish)
        else:
            pipeline = self._pipeline
            if pipeline is None or pipeline.broken:
                try:
                    pipeline = self._new_pipeline(method)
                except errors.CourierError as error:
                    future.fail(error)
                    return future
            pipeline.start(future, method, pickle, buffers, finish)
        if timeout is not None and not future.done():
            address = self.address

            def timed_out() -> errors.CourierError:
                if pipeline is not None and not pipeline.connected:
                    return _base.unreachable_timeout(method, address, timeout)
                return _base.call_timeout(method, address, timeout)

            self._deadline_watcher().add(time.monotonic() + timeout, future, timed_out)
        return future

    def _new_pipeline(self, method: str) -> '_Pipeline':
        with self._lock:
            if self._pipeline is None or self._pipeline.broken:
                if self._closed:
                    raise _closed(method, self.address)
                self._pipeline = _Pipeline(self._path, self._token, self._wait_for_ready,
                                           self.address)
            return self._pipeline

    def _deadline_watcher(self) -> '_Deadlines':
        with self._lock:
            if self._deadlines is None:
                self._deadlines = _Deadlines()
            return self._deadlines

    def close(self):
        with self._lock:
            self._closed = True
            connections = list(self._connections)
            pipeline, self._pipeline = self._pipeline, None
            deadlines, self._deadlines = self._deadlines, None
        for connection in connections:
            connection.close()
        if pipeline is not None:
            pipeline.close()
        if deadlines is not None:
            deadlines.close()


def _stopped_meanwhile(path: str, method: str, address: str) -> 'LocalServerTransport':
    """Returns the server of this process at ``path``, which just started (and may have stopped)."""
    server = _servers_here.get(path)
    if server is None:
        raise _base.call_error(errors.ServerUnavailableError, method, address,
                               'failed: the server stopped')
    return server


def _closed(method: str, address: str) -> errors.CourierError:
    return _base.call_error(errors.ServerUnavailableError, method, address,
                            'failed: the client transport is closed')


def _open(path: str, token: Optional[str], mode: int, wait_for_ready: bool,
          deadline: Optional[float], here: bool = False) -> _Connection:
    """Connects and says hello, waiting for the server to come up if asked to.

    Raises:
      _Unreachable: no server (and no waiting), or it refused the hello.
      _ServerHere: ``here`` is true and the server started in this process meanwhile.
      socket.timeout: the deadline passed first.
    """
    delay = _RETRY_FIRST
    while True:
        if here and path in _servers_here:
            raise _ServerHere
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if deadline is not None:
                _time_out_at(sock, deadline)
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError) as error:
            sock.close()
            if not wait_for_ready:
                raise _Unreachable(functools.partial(
                    _base.unavailable, details=_describe(error), wait_for_ready=False)) from None
        except socket.timeout:
            sock.close()
            raise
        except OSError as error:
            sock.close()
            raise _unreachable(f'failed: cannot connect to its socket ({_describe(error)})'
                               ) from None
        pause = delay if deadline is None else min(delay, deadline - time.monotonic())
        if pause <= 0:
            raise socket.timeout
        time.sleep(pause)
        delay = min(2 * delay, _RETRY_MAX)
    connection = _Connection(sock)
    try:
        frames.send(sock, frames.encode(
            frames.HELLO, mode, frames.VERSION, (token or '').encode(), frames.MAGIC))
        answer = connection.reader.read_frame()
    except socket.timeout:
        connection.close()
        raise
    except (EOFError, OSError, frames.ProtocolViolation) as error:
        connection.close()
        if not wait_for_ready:
            raise _unreachable(f'failed: the server closed the connection ({_describe(error)})'
                               ) from None
        return _open(path, token, mode, wait_for_ready, deadline, here)
    if answer.kind == frames.WELCOME:
        return connection
    connection.close()
    if answer.kind == frames.REFUSED and answer.status in _REFUSALS:
        raise _Unreachable(functools.partial(_base.refused, reason=_REFUSALS[answer.status]))
    raise _unreachable(f'failed: the socket does not serve the courier protocol '
                       f'({answer.text.decode(errors="replace")})', errors.ProtocolError)


class _Outbox:
    """Frames that several threads send on one socket.

    A thread that finds the socket busy leaves its frame here; the thread sending
    sends it too, so frames from many threads go out in few system calls and no
    thread ever waits for another's send.
    """

    def __init__(self, sock: Optional[socket.socket] = None):
        self.sock = sock  # None while connecting: frames wait here.
        self.skip: set = set()  # Call ids whose CALL frames must not go out (cancelled).
        self._frames: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def put(self, call_id: int, parts: List[Any]) -> None:
        """Sends a frame, now or with the frames of the thread sending.

        Raises:
          OSError: sending failed; this frame and others queued are lost.
        """
        self._frames.append((call_id, parts))
        self.flush()

    def flush(self) -> None:
        queued = self._frames
        while queued and self.sock is not None:
            if not self._lock.acquire(False):
                return  # The sending thread re-checks after it is done.
            try:
                if len(queued) == 1 and not self.skip:
                    parts = queued.popleft()[1]
                    if len(parts) == 1:
                        self.sock.sendall(parts[0])
                    else:
                        frames.send(self.sock, parts)
                else:
                    self._write([queued.popleft() for _ in range(len(queued))])
            finally:
                self._lock.release()

    def clear(self) -> None:
        self._frames.clear()

    def _write(self, batch: List[tuple]) -> None:
        sock = self.sock
        joined: List[Any] = []
        skip = self.skip
        for call_id, parts in batch:
            if skip and call_id in skip:
                skip.discard(call_id)
                continue
            if len(parts) == 1:
                joined.append(parts[0])
                continue
            if joined:
                sock.sendall(b''.join(joined))
                joined = []
            frames.send(sock, parts)
        if joined:
            sock.sendall(joined[0] if len(joined) == 1 else b''.join(joined))


class _Pipeline:
    """One connection carrying many calls at once; a reader thread completes them.

    The reader thread also makes the connection, so starting a call never blocks
    on a server that is not up yet. Once the connection breaks, every call on it
    fails and the transport makes a new pipeline for later calls.
    """

    def __init__(self, path: str, token: Optional[str], wait_for_ready: bool, address: str):
        self._path = path
        self._token = token
        self._wait_for_ready = wait_for_ready
        self._address = address
        self._ids = itertools.count(1)
        self._pending: Dict[int, tuple] = {}  # call id -> (future, method, finish)
        self._outbox = _Outbox()
        self._lock = threading.Lock()
        self._connection: Optional[_Connection] = None
        # Set before the pending calls are failed, so a call started meanwhile sees it.
        self.broken: Optional[_Unreachable] = None
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name=f'courier-client {address}').start()

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def start(self, future: _base.CallFuture, method: str, pickle: bytes,
              buffers: Sequence[memoryview], finish) -> None:
        call_id = next(self._ids)
        self._pending[call_id] = (future, method, finish)
        if self.broken:  # Checked after registering: see _break.
            self._pending.pop(call_id, None)
            future.fail(self.broken.error(method, self._address))
            return
        future.on_cancel = functools.partial(self._cancel, call_id)
        self._put(call_id, frames.encode(frames.CALL, 0, call_id, method.encode(),
                                         pickle, buffers))

    def _cancel(self, call_id: int) -> None:
        if self._pending.pop(call_id, None) is None or self.broken:
            return
        if self._connection is None:
            self._outbox.skip.add(call_id)  # Not sent yet: the server never sees it.
        self._put(0, frames.encode(frames.CANCEL, 0, call_id))

    def _put(self, call_id: int, parts: List[Any]) -> None:
        try:
            self._outbox.put(call_id, parts)
        except OSError as error:
            self._break(_unreachable(f'failed: sending failed ({_describe(error)})'))

    def _run(self) -> None:
        try:
            connection = _open(self._path, self._token, frames.PIPELINED,
                               self._wait_for_ready, None)
        except _Unreachable as unreachable:
            self._break(unreachable)
            return
        except BaseException as error:  # pylint: disable=broad-except
            self._break(_unreachable(f'failed: cannot connect ({_describe(error)})'))
            return
        with self._lock:
            if self._closed:
                connection.close()
                return
            self._connection = connection
        try:
            self._outbox.sock = connection.sock
            self._outbox.flush()  # What was started while connecting.
            self._outbox.skip.clear()
            pending = self._pending
            read_frame = connection.reader.read_frame
            while True:
                frame = read_frame()
                entry = pending.pop(frame.call_id, None)
                if entry is None:
                    continue  # Cancelled or timed out: nobody waits for it.
                future, method, finish = entry
                try:
                    response = _response(frame, method, self._address)
                except errors.CourierError as error:
                    future.fail(error)
                    continue
                future.resolve(finish, response)
        except (EOFError, OSError, frames.ProtocolViolation) as error:
            self._break(_unreachable(_went_away(error)))
        finally:
            connection.close()

    def _break(self, reason: _Unreachable) -> None:
        """Fails every pending call, and the calls started later on this pipeline."""
        self.broken = reason
        pending, self._pending = self._pending, {}
        self._outbox.clear()
        for future, method, _ in list(pending.values()):
            future.fail(reason.error(method, self._address))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connection = self._connection
        self._break(_unreachable('failed: the client transport was closed'))
        if connection is not None:
            connection.close()


class _Deadlines:
    """Fails futures whose call_timeout passes; one thread, started on first use."""

    def __init__(self):
        self._heap: List[tuple] = []
        self._order = itertools.count()
        self._compact_at = 1024
        self._condition = threading.Condition()
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name='courier-deadlines').start()

    def add(self, deadline: float, future: _base.CallFuture,
            timed_out: Callable[[], errors.CourierError]) -> None:
        """At ``deadline``, fails ``future`` with ``timed_out()`` unless it is done."""
        with self._condition:
            heap = self._heap
            if len(heap) >= self._compact_at:  # Drop the entries of calls that completed.
                heap[:] = [entry for entry in heap if not entry[2].done()]
                heapq.heapify(heap)
                self._compact_at = 2 * len(heap) + 1024
            heapq.heappush(heap, (deadline, next(self._order), future, timed_out))
            if heap[0][2] is future:
                self._condition.notify()

    def _run(self) -> None:
        with self._condition:
            while not self._closed:
                heap = self._heap
                if not heap:
                    self._condition.wait()
                    continue
                now = time.monotonic()
                if heap[0][0] > now:
                    self._condition.wait(heap[0][0] - now)
                    continue
                _, _, future, timed_out = heapq.heappop(heap)
                if not future.done():
                    future.fail(timed_out())
                    on_cancel = future.on_cancel
                    if on_cancel is not None:
                        on_cancel()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._heap = []
            self._condition.notify()


def _response(frame: frames.Frame, method: str, address: str) -> wire.Response:
    if frame.kind != frames.RESPONSE:
        raise _unexpected(frame, method, address)
    if frame.status == wire.OK:
        return wire.Response(wire.OK, frame.payload, frame.buffers)
    return _base.decode_response(frame.payload, address)


def _unexpected(frame: frames.Frame, method: str, address: str) -> errors.CourierError:
    if frame.kind == frames.FAULT:
        return _base.rejected_as_malformed(method, address,
                                           frame.text.decode(errors='replace'))
    return _base.call_error(errors.ProtocolError, method, address,
                            f'got a frame of kind {frame.kind} instead of its answer')


def _time_out_at(sock: socket.socket, deadline: float) -> None:
    """Makes ``sock``'s operations time out at ``deadline``; raises socket.timeout if it passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout
    sock.settimeout(remaining)


def _enlarge_send_buffer(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
    except OSError:  # Not allowed here: the default works, only slower for large arrays.
        pass


def _describe(error: BaseException) -> str:
    return f'{type(error).__name__}: {error}' if str(error) else type(error).__name__


def _went_away(error: BaseException) -> str:
    return f'failed: the server went away during the call ({_describe(error)})'


# ----- server ------------------------------------------------------------------------------------

class _Workers:
    """A pool of up to ``size`` threads running submitted functions, started as needed."""

    def __init__(self, size: int):
        self._size = size
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle: queue.SimpleQueue = queue.SimpleQueue()  # A token per idle thread.
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, fn: Callable, *args: Any) -> None:
        self._jobs.put((fn, args))
        if not self._idle.empty():
            try:
                self._idle.get_nowait()
                return
            except queue.Empty:
                pass
        if self._threads >= self._size:
            return
        with self._lock:
            if self._threads >= self._size:
                return
            self._threads += 1
        threading.Thread(target=self._work, daemon=True, name='courier-server').start()

    def _work(self) -> None:
        get = self._jobs.get
        idle = self._idle.put
        while True:
            item = get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # pylint: disable=broad-except
                _logger.exception('courier server worker failed')
            del item, fn, args
            idle(None)

    def stop(self) -> None:
        """Ends the threads once they are done with the functions submitted so far."""
        for _ in range(self._threads):
            self._jobs.put(None)


class _ServerConnection:
    """A client's connection as the server sees it."""

    __slots__ = ('sock', 'outbox', 'busy', 'calls', 'lock', '__weakref__')

    def __init__(self, sock: socket.socket):
        self.sock = sock
        _enlarge_send_buffer(sock)
        self.outbox = _Outbox(sock)
        self.busy = False  # A blocking call is running or answering.
        self.calls: Dict[int, bool] = {}  # Pipelined calls not answered: id -> cancelled.
        self.lock = threading.Lock()  # Orders a cancellation against the call's end.

    @property
    def idle(self) -> bool:
        return not self.busy and not self.calls

    def close(self, how: int = socket.SHUT_RDWR) -> None:
        try:
            self.sock.shutdown(how)
        except OSError:
            pass
        if how == socket.SHUT_RDWR:
            self.sock.close()


class LocalServerTransport(_base.ServerTransport):
    """Serves courier calls on a Unix socket, and to clients in this process directly."""

    def __init__(self, path: str, handle_call: _base.HandleCall,
                 list_methods: Callable[[], List[str]], *, thread_pool_size: int,
                 auth_token: Optional[str]):
        _base.check_unix_path_free(path)
        self._path = path
        self.address = _base.UNIX_PREFIX + path
        self._handle_call = handle_call
        self._list_methods = list_methods
        self._token = auth_token.encode() if auth_token else None
        self._workers = _Workers(thread_pool_size)
        self._permits: queue.SimpleQueue = queue.SimpleQueue()  # Calls that may run at once.
        for _ in range(thread_pool_size):
            self._permits.put(None)
        self._lock = threading.Lock()
        self._connections: 'weakref.WeakSet[_ServerConnection]' = weakref.WeakSet()
        self._calls_here: Dict[_base.CallFuture, str] = {}  # In-process calls: future -> method.
        self._stopping = False
        self._stopped = False  # After the grace period: calls not started yet are dropped.
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                os.unlink(path)  # A stale socket file (checked above that nobody listens).
            except FileNotFoundError:
                pass
            self._listener.bind(path)
            self._listener.listen(_BACKLOG)
        except OSError as error:
            self._listener.close()
            raise OSError(error.errno or errno.EADDRINUSE,
                          f'courier server cannot bind {self.address!r}: {error}') from None
        self._accepter: Optional[threading.Thread] = None

    def start(self):
        # Registered first: a client of this process that got in through the socket sees
        # the server here once it is welcomed, and calls it without the socket from then on.
        _servers_here[self._path] = self
        self._accepter = threading.Thread(target=self._accept, daemon=True,
                                          name=f'courier-accept {self.address}')
        self._accepter.start()

    def stop(self, grace):
        if _servers_here.get(self._path) is self:
            del _servers_here[self._path]
        with self._lock:
            self._stopping = True
            connections = list(self._connections)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # Wakes the accepting thread.
        except OSError:
            pass
        self._listener.close()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        for connection in connections:
            connection.close(socket.SHUT_RD)  # No new calls; answers still go out.
        if grace:
            end = time.monotonic() + grace
            while time.monotonic() < end and (
                    self._calls_here or not all(c.idle for c in connections)):
                time.sleep(0.005)
        self._stopped = True
        for future, method in list(self._calls_here.items()):  # As if their connection closed.
            future.fail(_base.stopped_during_call(method, self.address))
        for connection in connections:
            connection.close()
        self._workers.stop()
        if self._accepter is not None:
            self._accepter.join(5)

    # In-process calls.

    def check_token_here(self, token: Optional[str], method: str, address: str) -> None:
        reason = self._refusal(token.encode() if token else b'')
        if reason:
            raise _base.refused(method, address, _REFUSALS[reason])

    def method_names(self) -> List[str]:
        return self._list_methods()

    def call_here(self, token: Optional[str], method: str, pickle: bytes,
                  buffers: Sequence[memoryview], timeout: Optional[float],
                  address: str) -> wire.Response:
        """Runs a call of this process's client on a worker thread and waits for it."""
        future = _base.CallFuture()
        self.call_here_async(future, token, method, pickle, buffers, address, None)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise _base.call_timeout(method, address, timeout) from None

    def call_here_async(self, future: _base.CallFuture, token: Optional[str], method: str,
                        pickle: bytes, buffers: Sequence[memoryview], address: str,
                        finish) -> None:
        """Starts a call of this process's client; ``future`` gets ``finish(response)``."""
        try:
            self.check_token_here(token, method, address)
        except errors.PermissionDeniedError as error:
            future.fail(error)
            return
        # Copies now: the caller may change its arrays as soon as the call returns.
        owned = [bytearray(buffer) for buffer in buffers]
        self._calls_here[future] = method
        self._workers.submit(self._run_here, future, method, bytes(pickle), owned, finish)
        if self._stopped:  # Stop may have missed it; failing twice is harmless.
            future.fail(_base.stopped_during_call(method, self.address))

    def _run_here(self, future: _base.CallFuture, method: str, pickle: bytes,
                  buffers: List[bytearray], finish) -> None:
        try:
            if future.done():  # Cancelled, timed out or cut off by Stop.
                return
            self._permits.get()
            try:
                response = self._handle_call(method, pickle, buffers)
            finally:
                self._permits.put(None)
            # Copies before anything else runs here: the results may be live server state.
            response.buffers = [bytearray(buffer) for buffer in response.buffers]
            if finish is None:
                try:
                    future.set_result(response)
                except concurrent.futures.InvalidStateError:
                    pass
            else:
                future.resolve(finish, response)
        finally:
            self._calls_here.pop(future, None)

    # Calls through the socket.

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # The listener was closed: the server stops.
            connection = _ServerConnection(sock)
            with self._lock:
                if self._stopping:
                    sock.close()
                    return
                self._connections.add(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True,
                             name=f'courier-connection {self.address}').start()

    def _refusal(self, token: bytes) -> int:
        if self._token is None:
            return 0
        if not token:
            return frames.TOKEN_MISSING
        return 0 if hmac.compare_digest(token, self._token) else frames.TOKEN_WRONG

    def _serve(self, connection: _ServerConnection) -> None:
        sock = connection.sock
        reader = frames.FrameReader(sock)
        try:
            sock.settimeout(_HELLO_TIMEOUT)
            hello = reader.read_frame(frames.HELLO_LIMITS)
            if (hello.kind != frames.HELLO or hello.payload != frames.MAGIC
                    or hello.call_id != frames.VERSION
                    or hello.status not in (frames.SYNC, frames.PIPELINED)):
                frames.send(sock, frames.encode(
                    frames.REFUSED, frames.BAD_HELLO, 0,
                    b'expected a courier-local hello of version %d' % frames.VERSION))
                return
            reason = self._refusal(hello.text)
            if reason:
                frames.send(sock, frames.encode(frames.REFUSED, reason, 0,
                                                _REFUSALS[reason].encode()))
                return
            sock.settimeout(None)
            frames.send(sock, frames.encode(frames.WELCOME))
            if hello.status == frames.SYNC:
                self._serve_sync(connection, reader)
            else:
                self._serve_pipelined(connection, reader)
        except (EOFError, OSError):
            pass  # The client went away, or the server is stopping.
        except frames.ProtocolViolation as error:
            try:
                connection.outbox.put(0, frames.encode(frames.FAULT, 0, 0,
                                                       str(error).encode()))
            except OSError:
                pass
        except Exception:  # pylint: disable=broad-except
            _logger.exception('courier server %s: connection failed', self.address)
        finally:
            connection.close()

    def _serve_sync(self, connection: _ServerConnection, reader: frames.FrameReader) -> None:
        sock = connection.sock
        read_frame = reader.read_frame
        handle_call = self._handle_call
        permits = self._permits
        while True:
            frame = read_frame()
            kind = frame.kind
            if kind == frames.CALL:
                method = _method_name(frame)
                connection.busy = True
                try:
                    permits.get()
                    try:
                        response = handle_call(method, frame.payload, frame.buffers)
                    finally:
                        permits.put(None)
                    frames.send(sock, _encode_response(0, response))
                finally:
                    connection.busy = False  # After the answer went out: Stop waits for it.
            elif kind == frames.LIST:
                frames.send(sock, self._methods_frame(0))
            elif kind != frames.CANCEL:
                raise frames.ProtocolViolation(f'unexpected frame of kind {kind}')

    def _serve_pipelined(self, connection: _ServerConnection,
                         reader: frames.FrameReader) -> None:
        calls = connection.calls
        read_frame = reader.read_frame
        submit = self._workers.submit
        try:
            while True:
                frame = read_frame()
                kind = frame.kind
                if kind == frames.CALL:
                    method = _method_name(frame)
                    calls[frame.call_id] = False
                    submit(self._run_pipelined, connection, frame.call_id, method,
                           frame.payload, frame.buffers)
                elif kind == frames.CANCEL:
                    with connection.lock:
                        if frame.call_id in calls:
                            calls[frame.call_id] = True
                elif kind == frames.LIST:
                    connection.outbox.put(0, self._methods_frame(frame.call_id))
                else:
                    raise frames.ProtocolViolation(f'unexpected frame of kind {kind}')
        finally:
            while calls and not self._stopped:  # Answers of calls in flight still go out.
                time.sleep(0.005)

    def _run_pipelined(self, connection: _ServerConnection, call_id: int, method: str,
                       pickle: bytes, buffers: List[Any]) -> None:
        try:
            if connection.calls.get(call_id, True) or self._stopped:
                return  # Cancelled, or the server stopped before the call started.
            self._permits.get()
            try:
                response = self._handle_call(method, pickle, buffers)
            finally:
                self._permits.put(None)
            try:
                connection.outbox.put(call_id, _encode_response(call_id, response))
            except OSError:
                pass  # The client went away; its reader fails what it waited for.
        finally:
            with connection.lock:
                connection.calls.pop(call_id, None)

    def _methods_frame(self, call_id: int) -> List[Any]:
        return frames.encode(frames.METHODS, 0, call_id,
                             payload=wire.encode_method_list(self._list_methods()))


def _method_name(frame: frames.Frame) -> str:
    try:
        return frame.text.decode()
    except UnicodeDecodeError:
        raise frames.ProtocolViolation('the method name is not UTF-8') from None


def _encode_response(call_id: int, response: wire.Response) -> List[Any]:
    if response.status == wire.OK:
        return frames.encode(frames.RESPONSE, wire.OK, call_id, b'', response.pickle,
                             response.buffers)
    return frames.encode(frames.RESPONSE, response.status, call_id, b'',
                         wire.encode_response(response))
