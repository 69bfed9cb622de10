"""The server half of courier's framed protocol: its connections' calls, and in-process calls.

The framed protocol (:mod:`.frames`) carries courier's calls over a Unix socket on one
host and over TCP between hosts, with TLS if asked for (:mod:`.tls`). On TCP the server
owns its port for gRPC clients too: its loop hands their connections to a relay
(:mod:`.relay`) that carries them to the server's gRPC service; and its loop also accepts on
a Unix socket, where TCP clients on its host go on (:mod:`.same_host`). The server's threads:

    loop thread (:mod:`.loop`): accepts, [TLS handshakes,] reads hellos, watches idle
        │ connections and reads whole frames      a gRPC client ──▶ the relay thread
        │ (a frame still coming holds no worker)
        ▼
    pool (:mod:`.pool`, ``thread_pool_size`` threads):
        - blocking connection: a worker takes it with its call, runs the call on this very
          thread and answers, then reads the next call itself, again and again while the
          client keeps calling (a busy connection costs no hand-over at all); it gives the
          connection back to the loop after ``linger_ms`` without a call (or with a frame
          that stops coming, or comes slower than 256 KiB per ``linger_ms``: the loop reads
          the rest), or at once when other work waits for a thread. While the pool has room, the wait is a plain read with the socket's
          receive timeout (no system call of its own); when it has little (or the
          connection is TLS), the wait is a poll the pool can cut short;
        - futures connection: the loop reads its calls and submits each to the pool, and
          reads its cancellations: a call cancelled before a worker takes it never runs.
          Any worker runs a call and puts its answer in the connection's outbox.

A connection costs a socket and about 2 KB while idle, no thread, and the
pool bounds both the threads and the calls running at once. A peer sending garbage
only loses its own connection.

A started Unix-socket server registers itself in :mod:`._here`, where clients of this
process (:mod:`.framed_client`) find it and call it without a socket: arguments
and results are still pickled and buffers copied, so caller and server never
share mutable objects, and the call runs on the worker threads as a remote one
would.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hmac
import logging
import os
import secrets
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from courier import errors
from courier import security
from courier import wire
from courier.transport import _base
from courier.transport import _here
from courier.transport import frames
from courier.transport import keepalive
from courier.transport import loop as loops
from courier.transport.limits import ServerLimits
from courier.transport import pool as pools
from courier.transport import same_host
from courier.transport import shm

_logger = logging.getLogger('courier')

# What a worker does with a connection once it stops reading it.
_RESUME, _END = 'resume', 'end'


def listen(path: str, handle_call: _base.HandleCall, list_methods: Callable[[], List[str]],
           *, thread_pool_size: int, auth_token: Optional[str],
           limits: Optional[ServerLimits] = None) -> 'FramedServerTransport':
    """Binds Unix socket ``path`` and returns the unstarted server transport."""
    path = os.path.abspath(path)
    _base.check_unix_path_free(path)
    address = _base.UNIX_PREFIX + path
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _bind_listening(listener, path)
    except OSError as error:
        listener.close()
        raise OSError(error.errno or errno.EADDRINUSE,
                      f'courier server cannot bind {address!r}: {error}') from None
    return FramedServerTransport(listener, address, handle_call, list_methods, path=path,
                                 thread_pool_size=thread_pool_size, auth_token=auth_token,
                                 limits=limits)


def _bind_listening(listener: socket.socket, path: str) -> None:
    """Binds ``listener`` to ``path`` and listens. The path appears only once the socket
    listens (bound under a temporary name, then renamed), so a client that sees the file can
    connect; a stale socket file there (nobody listens: checked) is replaced."""
    temporary = os.path.join(os.path.dirname(path), f'.{secrets.token_hex(4)}.sock')
    if len(os.fsencode(temporary)) > _base.MAX_UNIX_PATH_BYTES:
        temporary = path  # No room for the temporary name: the path itself, from the start.
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    listener.bind(temporary)
    try:
        listener.listen(loops.BACKLOG)
        if temporary != path:
            os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def listen_tcp(host: str, port: int, handle_call: _base.HandleCall,
               list_methods: Callable[[], List[str]], *, thread_pool_size: int,
               auth_token: Optional[str], limits: Optional[ServerLimits] = None,
               tls: Optional[security.TLSConfig] = None,
               grpc_service: Optional[Callable[[], str]] = None) -> 'FramedServerTransport':
    """Binds TCP ``host:port`` (port 0: a free one) and returns the unstarted server transport.

    ``grpc_service()`` returns the Unix socket path of a gRPC service to relay gRPC clients
    to, starting it on first use; None: gRPC clients are refused like any stranger.

    Raises:
      OSError: the address cannot be bound.
      ValueError: ``tls`` cannot be used by a server.
    """
    context = None
    if tls is not None:
        from courier.transport import tls as tls_module  # pylint: disable=import-outside-toplevel
        context = tls_module.server_context(tls)
    listener = _tcp_listener(host, port)
    address = _base.tcp_address(_base.connectable_host(host), listener.getsockname()[1])
    # TLS asks for encryption on the wire: its clients stay on it, also on the server's host.
    upgrade = same_host.listener(loops.BACKLOG) if context is None else None
    return FramedServerTransport(listener, address, handle_call, list_methods,
                                 thread_pool_size=thread_pool_size, auth_token=auth_token,
                                 limits=limits, tls=context, grpc_service=grpc_service,
                                 upgrade=upgrade)


def _tcp_listener(host: str, port: int) -> socket.socket:
    bind_host = '0.0.0.0' if host in ('', '0.0.0.0') else host.strip('[]')
    try:
        infos = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise OSError(errno.EADDRNOTAVAIL, f'courier server cannot bind '
                      f'{_base.tcp_address(host, port)!r}: {error}') from None
    family, _, _, _, sockaddr = infos[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        keepalive.configure(listener)  # Accepted connections inherit it.
        listener.bind(sockaddr)
        listener.listen(loops.BACKLOG)
    except OSError as error:
        listener.close()
        raise OSError(error.errno or errno.EADDRINUSE,
                      f'courier server cannot bind {_base.tcp_address(host, port)!r}: the '
                      f'address is in use or not available on this machine ({error})') from None
    return listener


class FramedServerTransport(_base.ServerTransport):
    """Serves courier calls on a listening socket, and (Unix) to clients in this process."""

    def __init__(self, listener: socket.socket, address: str, handle_call: _base.HandleCall,
                 list_methods: Callable[[], List[str]], *, thread_pool_size: int,
                 auth_token: Optional[str], limits: Optional[ServerLimits] = None,
                 path: Optional[str] = None, tls: Any = None,
                 grpc_service: Optional[Callable[[], str]] = None,
                 upgrade: Optional[Tuple[socket.socket, bytes]] = None):
        self._path = path  # Unix sockets only: where clients of this process find the server.
        listeners = [listener]
        self._same_host = b''  # What a WELCOME tells a TCP client that offers the upgrade.
        if upgrade is not None:  # A TCP server's same-host socket, and its WELCOME's text.
            listeners.append(upgrade[0])
            self._same_host = upgrade[1]
        self.address = address
        self._handle_call = handle_call
        self._list_methods = list_methods
        self._token = auth_token.encode() if auth_token else None
        try:
            self.limits = limits or ServerLimits()
        except BaseException:
            for sock in listeners:
                sock.close()
            raise
        self._pool = pools.Pool(thread_pool_size, f'courier-server {self.address}')
        self._calls_here: Dict[_base.CallFuture, str] = {}  # In-process calls: future -> method.
        self._stopped = False  # After the grace period: calls not started yet are dropped.
        self._relay = None
        if grpc_service is not None:
            from courier.transport import relay  # pylint: disable=import-outside-toplevel
            self._relay = relay.Relay(grpc_service, self._relayed, f'courier-relay {address}')
        self._loop = loops.Loop(listeners, greet=self._greet, serve=self._dispatch,
                                end=self._broken, limits=self.limits,
                                name=f'courier-loop {self.address}',
                                tls=tls, relay=self._relay and self._relay.hand)

    def start(self):
        # Registered first: a client of this process that got in through the socket sees
        # the server here once it is welcomed, and calls it without the socket from then on.
        if self._path is not None:
            _here.servers[self._path] = self
        self._loop.start()

    def stop(self, grace):
        if self._path is not None:
            if _here.servers.get(self._path) is self:
                del _here.servers[self._path]
            try:  # First: as long as the file is there, it accepts connections.
                os.unlink(self._path)
            except FileNotFoundError:
                pass
        self._loop.stop()  # Closes the listener: nobody new gets in.
        if self._relay is not None:
            self._relay.stop()  # Ends the gRPC clients' connections.
        connections = self._loop.connections()
        for connection in connections:
            try:
                connection.sock.shutdown(socket.SHUT_RD)  # No new calls; answers still go out.
            except OSError:
                pass
        if grace:
            end = time.monotonic() + grace
            while time.monotonic() < end and (
                    self._calls_here or not all(c.idle for c in connections)):
                time.sleep(0.005)
        self._stopped = True
        for future, method in list(self._calls_here.items()):  # As if their connection closed.
            future.fail(_base.stopped_during_call(method, self.address))
        for connection in connections:
            self._loop.close(connection)
        self._pool.stop(timeout=0.1)  # Idle workers end at once; one in a long call ends after it.

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
        self._pool.submit(self._run_here, future, method, bytes(pickle), owned, finish)
        if self._stopped:  # Stop may have missed it; failing twice is harmless.
            future.fail(_base.stopped_during_call(method, self.address))

    def _run_here(self, future: _base.CallFuture, method: str, pickle: bytes,
                  buffers: List[bytearray], finish) -> None:
        try:
            if future.done():  # Cancelled, timed out or cut off by Stop.
                return
            response = self._handle_call(method, pickle, buffers)
            # Copies before anything else runs here: the results may be live server state.
            response.buffers = [bytearray(buffer) for buffer in response.buffers]
            future.resolve(finish, response)
        finally:
            self._calls_here.pop(future, None)

    # Calls through the socket.

    def _relayed(self, connection: loops.AcceptedConnection) -> None:
        """The relay is done with a gRPC client's connection."""
        self._loop.close(connection)

    def _refusal(self, token: bytes) -> int:
        if self._token is None:
            return 0
        if not token:
            return frames.TOKEN_MISSING
        return 0 if hmac.compare_digest(token, self._token) else frames.TOKEN_WRONG

    def _greet(self, connection: loops.AcceptedConnection, hello: frames.Frame) -> Optional[tuple]:
        """On the loop thread: None welcomes the connection, else the refusal's (reason, text)."""
        if (hello.kind != frames.HELLO or hello.payload != frames.MAGIC
                or hello.call_id != frames.VERSION
                or hello.status & ~frames.CAPABILITIES not in (frames.SYNC, frames.PIPELINED)):
            return (frames.BAD_HELLO,
                    b'expected a courier-local hello of version %d' % frames.VERSION)
        reason = self._refusal(hello.text)
        if reason:
            return reason, frames.REFUSALS[reason].encode()
        unix = connection.sock.family == socket.AF_UNIX
        connection.shared = bool(hello.status & frames.SHARED_MEMORY and shm.ENABLED and unix)
        if hello.status & frames.SAME_HOST and not unix:
            connection.welcome = self._same_host
        return None

    def _dispatch(self, connection: loops.AcceptedConnection, frame: frames.Frame) -> bool:
        """On the loop thread: a whole frame of ``connection``. A blocking connection's goes to
        a worker with the connection; a futures connection's calls go to the pool one by one,
        and the loop goes on reading it (returns False once too many calls are in flight)."""
        if connection.mode == frames.SYNC:
            connection.busy = True  # Till its answer went out: a graceful Stop waits for it.
            self._pool.submit(self._serve, connection, frame)
            return False
        kind = frame.kind
        calls = connection.calls
        if kind == frames.CALL:
            method = _method_name(frame)
            call_id = frame.call_id
            if call_id not in calls:  # Only the loop thread adds: no lock needed.
                calls[call_id] = [1, False]
            else:  # The client reused a call id: each call still gets its answer.
                with connection.lock:
                    calls.setdefault(call_id, [0, False])[0] += 1
            self._pool.submit(self._run_pipelined, connection, call_id, method, frame.payload,
                              frame.buffers)
            if len(calls) >= self.limits.max_calls_in_flight:
                with connection.lock:
                    if len(calls) >= self.limits.max_calls_in_flight:
                        connection.parked = True  # The end of a call resumes it.
                        return False
        elif kind == frames.CANCEL:  # A call not started yet never runs.
            with connection.lock:
                entry = calls.get(frame.call_id)
                if entry is not None:
                    entry[1] = True
        elif kind == frames.LIST:
            self._pool.submit(self._send_methods, connection, frame.call_id)
        else:
            raise frames.ProtocolViolation(f'unexpected frame of kind {kind}')
        return True

    def _broken(self, connection: loops.AcceptedConnection, error: BaseException) -> None:
        """On the loop thread: the client of ``connection`` closed it, or broke the protocol."""
        if isinstance(error, frames.ProtocolViolation):
            self._pool.submit(self._fault, connection, error)  # Sending may block.
        else:
            self._end(connection)

    def _fault(self, connection: loops.AcceptedConnection, error: frames.ProtocolViolation) -> None:
        """Tells the client how it broke the protocol, then ends the connection."""
        _tell(connection, error)
        self._end(connection)

    def _send_methods(self, connection: loops.AcceptedConnection, call_id: int) -> None:
        self._answer(connection, call_id, self._methods_frame(call_id))

    def _answer(self, connection: loops.AcceptedConnection, call_id: int, parts: List[Any]) -> None:
        """Sends a futures connection's answer; a connection that cannot take it is hung up."""
        try:
            connection.outbox.put(call_id, parts)
        except OSError:  # Gone, or it took nothing for stall_timeout: the rest cannot follow.
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)  # The loop reads its end.
            except OSError:
                pass

    def _serve(self, connection: loops.AcceptedConnection, frame: frames.Frame) -> None:
        """On a worker: serves a blocking connection's frame, then its next calls while the
        client keeps calling; then the loop watches it again."""
        outcome = _END
        try:
            if not self._stopped:
                outcome = self._serve_sync(connection, frame)
        except (EOFError, OSError):
            pass  # The client went away, or the server is stopping.
        except frames.ProtocolViolation as error:
            _tell(connection, error)
        except Exception:  # pylint: disable=broad-except
            _logger.exception('courier server %s: connection failed', self.address)
        connection.busy = False
        if outcome == _RESUME:
            self._loop.resume(connection)
        else:
            self._end(connection)

    def _serve_sync(self, connection: loops.AcceptedConnection, frame: frames.Frame) -> str:
        sock = connection.sock
        reader = connection.reader
        read_frame = reader.read_frame
        handle_call = self._handle_call
        pool = self._pool
        poller = None
        while True:
            kind = frame.kind
            if kind == frames.CALL:
                method = _method_name(frame)
                connection.busy = True
                try:
                    response = handle_call(method, frame.payload, frame.buffers)
                    frame = None  # The arguments' memory goes before the answer is sent.
                    if response.status == wire.OK:
                        frames.send_frame(sock, frames.RESPONSE, wire.OK, 0, b'',
                                          response.pickle, response.buffers, connection.shared)
                    else:
                        frames.send(sock, _encode_response(0, response, connection.shared))
                    response = None
                finally:
                    connection.busy = False  # After the answer went out: Stop waits for it.
            elif kind == frames.LIST:
                frames.send(sock, self._methods_frame(0))
            elif kind != frames.CANCEL:
                raise frames.ProtocolViolation(f'unexpected frame of kind {kind}')
            frame = None
            if not ((pool.roomy() and not connection.tls) or reader.buffered):
                poller = poller or pool.poller(sock)
                if not pool.linger(poller, self.limits.linger_ms):
                    return _RESUME
            try:
                # Waits up to linger_ms for the next call, and for the rest of a frame while it
                # comes steadily (frames.STEADY_BYTES): the loop reads what is slow to come.
                frame = read_frame()
            except BlockingIOError:
                return _RESUME

    def _run_pipelined(self, connection: loops.AcceptedConnection, call_id: int, method: str,
                       pickle: bytes, buffers: List[Any]) -> None:
        try:
            entry = connection.calls.get(call_id)
            if entry is None or entry[1] or self._stopped:
                return  # Cancelled (CANCEL came first), or the server stopped meanwhile.
            response = self._handle_call(method, pickle, buffers)
            self._answer(connection, call_id,
                         _encode_response(call_id, response, connection.shared))
        finally:
            self._call_ended(connection, call_id)

    def _call_ended(self, connection: loops.AcceptedConnection, call_id: int) -> None:
        calls = connection.calls
        with connection.lock:
            entry = calls.get(call_id)
            if entry is not None:
                entry[0] -= 1
                if entry[0] <= 0:
                    del calls[call_id]
            resume = connection.parked and len(calls) <= self.limits.max_calls_in_flight // 2
            if resume:
                connection.parked = False
            close = connection.ended and not calls
        if resume:
            self._loop.resume(connection)
        elif close:
            self._loop.close(connection)

    def _end(self, connection: loops.AcceptedConnection) -> None:
        """The client is gone or broke the protocol: close, once the answers in flight went out."""
        with connection.lock:
            connection.ended = True
            close = not connection.calls or self._stopped
        if close:
            self._loop.close(connection)

    def _methods_frame(self, call_id: int) -> List[Any]:
        return frames.encode(frames.METHODS, 0, call_id,
                             payload=wire.encode_method_list(self._list_methods()))


def _tell(connection: loops.AcceptedConnection, error: frames.ProtocolViolation) -> None:
    """Tells the client how it broke the protocol (the connection ends after)."""
    try:
        connection.outbox.put(0, frames.encode(frames.FAULT, 0, 0, str(error).encode()))
    except OSError:
        pass


def _unchanged(response: wire.Response) -> wire.Response:
    return response


def _method_name(frame: frames.Frame) -> str:
    try:
        return frame.text.decode()
    except UnicodeDecodeError:
        raise frames.ProtocolViolation('the method name is not UTF-8') from None


def _encode_response(call_id: int, response: wire.Response, shared: bool) -> List[Any]:
    if response.status == wire.OK:
        return frames.encode(frames.RESPONSE, wire.OK, call_id, b'', response.pickle,
                             response.buffers, shared)
    return frames.encode(frames.RESPONSE, response.status, call_id, b'',
                         wire.encode_response(response))
