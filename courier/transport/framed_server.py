"""The server half of courier's framed protocol: accept loop, workers, connections.

The framed protocol (:mod:`.frames`) carries same-host calls today, over Unix
sockets; it is named for its frames, not its host, because it is to carry calls
between hosts over TCP too. A connection's hello says how it calls: a blocking
connection's call runs on the thread that read it, a pipelined connection's
calls run on the worker threads, within ``thread_pool_size`` calls at once
either way. A peer sending garbage only loses its own connection.

A started server registers itself in :mod:`._here`, where clients of this
process (:mod:`.framed_client`) find it and call it without a socket: arguments
and results are still pickled and buffers copied, so caller and server never
share mutable objects, and the call runs on the worker threads as a remote one
would.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hmac
import logging
import os
import queue
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

from courier import errors
from courier import wire
from courier.transport import _base
from courier.transport import _here
from courier.transport import frames

_logger = logging.getLogger('courier')

_HELLO_TIMEOUT = 10.0  # Seconds a new connection may take to introduce itself.
_BACKLOG = 1024


def listen(path: str, handle_call: _base.HandleCall, list_methods: Callable[[], List[str]],
           *, thread_pool_size: int, auth_token: Optional[str]) -> 'FramedServerTransport':
    """Binds Unix socket ``path`` and returns the unstarted server transport."""
    return FramedServerTransport(os.path.abspath(path), handle_call, list_methods,
                                 thread_pool_size=thread_pool_size, auth_token=auth_token)


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
        frames.enlarge_send_buffer(sock)
        self.outbox = frames.Outbox(sock)
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


class FramedServerTransport(_base.ServerTransport):
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
        _here.servers[self._path] = self
        self._accepter = threading.Thread(target=self._accept, daemon=True,
                                          name=f'courier-accept {self.address}')
        self._accepter.start()

    def stop(self, grace):
        if _here.servers.get(self._path) is self:
            del _here.servers[self._path]
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
            raise _base.refused(method, address, frames.REFUSALS[reason])

    def method_names(self) -> List[str]:
        return self._list_methods()

    def call_here(self, token: Optional[str], method: str, pickle: bytes,
                  buffers: Sequence[memoryview], timeout: Optional[float],
                  address: str) -> wire.Response:
        """Runs a call of this process's client on a worker thread and waits for it."""
        future = _base.CallFuture()
        self.call_here_async(future, token, method, pickle, buffers, address, _unchanged)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise _base.call_timeout(method, address, timeout) from None

    def call_here_async(self, future: _base.CallFuture, token: Optional[str], method: str,
                        pickle: bytes, buffers: Sequence[memoryview], address: str,
                        finish: Callable[[wire.Response], Any]) -> None:
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
                                                frames.REFUSALS[reason].encode()))
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


def _unchanged(response: wire.Response) -> wire.Response:
    return response


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
