"""The client half of courier's framed protocol: blocking calls, futures, deadlines.

The framed protocol (:mod:`.frames`) carries courier's calls over Unix sockets on
one host and over TCP (with TLS if asked for, :mod:`.tls`) between hosts;
:mod:`.dial` makes the connections. A TCP server that turns out to speak only gRPC
makes calls fail with ``_base.NotFramedError``, on which :mod:`courier.transport`
calls it over gRPC instead. A blocking call uses a connection of its calling
thread, so the caller sends and receives on its own thread. Futures share one
pipelined connection: callers send, a reader thread completes them. Calls carry
the auth token (checked once per connection), and errors, timeouts and
cancellation behave as with gRPC.

When the server runs in this process (local_mt, colocated nodes), calls skip the
socket and go to the server object found in :mod:`._here`, where
:mod:`.framed_server` registers it: neither half imports the other.
"""

from __future__ import annotations

import errno
import functools
import heapq
import itertools
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

from courier import errors
from courier import security
from courier import wire
from courier.transport import _base
from courier.transport import _here
from courier.transport import dial
from courier.transport import frames
from courier.transport import keepalive
from courier.transport import outbox

# Method names as calls carry them (UTF-8), encoded once: a call then looks its name up.
_names: Dict[str, bytes] = {}
_NAMES_KEPT = 4096  # Names beyond these many are encoded at each call.


def connect(address: str, endpoint: _base.Endpoint, *, auth_token: Optional[str],
            wait_for_ready: bool,
            tls: Optional[security.TLSConfig] = None) -> 'FramedClientTransport':
    """Returns a client transport for the server at ``endpoint`` (Unix socket, or TCP)."""
    return FramedClientTransport(address, dial.Target(endpoint, tls), auth_token=auth_token,
                                 wait_for_ready=wait_for_ready)


class _Held:
    """What a transport holds open: apart from it, so that closing needs no transport.

    A transport dropped without ``close()`` is closed by its finalizer, which holds
    this and not the transport; no thread holds the transport either (a pipeline's
    reader does only while calls started through it wait for their answers).
    """

    def __init__(self):
        self.lock = threading.Lock()
        # The blocking calls' connections.
        self.connections: 'weakref.WeakSet[dial.DialedConnection]' = weakref.WeakSet()
        self.pipeline: Optional[_Pipeline] = None
        self.deadlines: Optional[_Deadlines] = None
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            connections = list(self.connections)
            pipeline, self.pipeline = self.pipeline, None
            deadlines, self.deadlines = self.deadlines, None
        for connection in connections:
            connection.close()
        if pipeline is not None:
            pipeline.close()
        if deadlines is not None:
            deadlines.close()


class FramedClientTransport(_base.ClientTransport):
    """Calls one server over its socket, or directly when it runs in this process (Unix)."""

    protocol = 'framed'

    def __init__(self, address: str, target: dial.Target, *, auth_token: Optional[str],
                 wait_for_ready: bool):
        self.address = address
        self._target = target
        self._path = target.path  # None for TCP: no server of this process is called directly.
        self._token = auth_token
        self._wait_for_ready = wait_for_ready
        self._local = threading.local()  # .connection: this thread's blocking connection.
        self._held = _Held()
        self._release = weakref.finalize(self, self._held.close)

    def close(self):
        self._release()

    # Blocking calls.

    def call(self, method, pickle, buffers, timeout):
        name = _names.get(method)
        if name is None:
            name = _base.encode_method(method, self.address)
            if len(_names) < _NAMES_KEPT:
                _names[method] = name
        server = _here.servers.get(self._path)
        if server is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                frame = self._exchange(frames.CALL, name, pickle, buffers, method, timeout,
                                       deadline)
            except dial.ServerHere:
                server = _stopped_meanwhile(self._path, method, self.address)
                if deadline is not None:
                    timeout = max(0.0, deadline - time.monotonic())
            else:
                if frame.kind == frames.RESPONSE and frame.status == wire.OK:
                    return wire.Response(wire.OK, frame.payload, frame.buffers)
                return _response(frame, method, self.address)
        elif self._held.closed:
            raise _base.closed(method, self.address)
        return server.call_here(self._token, method, pickle, buffers, timeout, self.address)

    def list_methods(self, timeout):
        method = _base.LIST_METHODS
        server = _here.servers.get(self._path)
        if server is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                frame = self._exchange(frames.LIST, b'', b'', (), method, timeout, deadline)
            except dial.ServerHere:
                server = _stopped_meanwhile(self._path, method, self.address)
        elif self._held.closed:
            raise _base.closed(method, self.address)
        if server is not None:
            server.check_token_here(self._token, method, self.address)
            return server.method_names()
        if frame.kind != frames.METHODS:
            raise _unexpected(frame, method, self.address)
        return _base.decode_method_list(frame.payload, self.address)

    def _exchange(self, kind: int, text: bytes, payload: Any, buffers: Sequence[Any],
                  method: str, timeout: Optional[float],
                  deadline: Optional[float]) -> frames.Frame:
        """Sends a request frame on this thread's connection and reads the answer to it."""
        connection = getattr(self._local, 'connection', None)
        if connection is not None and self._held.closed:
            raise _base.closed(method, self.address)
        for attempt in (0, 1):
            if connection is None:
                connection = self._connect_blocking(method, timeout, deadline)
            try:
                sock = connection.sock
                if deadline is not None:
                    dial.time_out_at(sock, deadline)
                    connection.timed = True
                elif connection.timed:
                    sock.settimeout(None)
                    connection.timed = False
                if connection.tcp and connection.closed_meanwhile():
                    raise _Unsent(ConnectionResetError('the server closed the idle connection'),
                                  _last_words(connection))
                try:
                    frames.send_frame(sock, kind, 0, 0, text, payload, buffers, connection.shared)
                except (BrokenPipeError, ConnectionResetError) as error:
                    raise _Unsent(error, _last_words(connection)) from None
                return connection.reader.read_frame()
            except _Unsent as unsent:
                # The server closed this connection while it sat idle (it stopped or
                # restarted), or refused it; the request never arrived, so a new connection
                # may carry it.
                self._drop(connection)
                connection = None
                if unsent.answer is not None:
                    raise _unexpected(unsent.answer, method, self.address) from None
                if attempt:
                    raise _never_sent(_base.call_error(
                        errors.ServerUnavailableError, method, self.address,
                        f'failed: the server closed two connections before the call went out '
                        f'({dial.describe(unsent.error)})')) from None
            except frames.ProtocolViolation as error:
                self._drop(connection)
                raise _base.call_error(errors.ProtocolError, method, self.address,
                                       f'got a malformed answer: {error}') from None
            except (EOFError, OSError) as error:
                self._drop(connection)
                if dial.deadline_passed(error):
                    raise _base.call_timeout(method, self.address, timeout) from None
                if self._held.closed:
                    raise _base.closed(method, self.address) from None
                raise _base.call_error(errors.ServerUnavailableError, method, self.address,
                                       _went_away(error)) from None
            except BaseException:  # e.g. KeyboardInterrupt: the answer would come out of turn.
                self._drop(connection)
                raise
        raise AssertionError('unreachable')

    def _connect_blocking(self, method: str, timeout: Optional[float],
                          deadline: Optional[float]) -> dial.DialedConnection:
        if self._held.closed:
            raise _base.closed(method, self.address)
        try:
            connection = dial.open_connection(self._target, self._token, frames.SYNC,
                                              self._wait_for_ready, deadline, here=True)
        except dial.Unreachable as unreachable:
            raise _never_sent(unreachable.error(method, self.address)) from None
        except socket.timeout:
            raise _base.unreachable_timeout(method, self.address, timeout) from None
        if self._path in _here.servers:  # It started here while this thread waited for it.
            connection.close()
            raise dial.ServerHere
        held = self._held
        with held.lock:
            if held.closed:
                connection.close()
                raise _base.closed(method, self.address)
            held.connections.add(connection)
        self._local.connection = connection
        return connection

    def _drop(self, connection: dial.DialedConnection) -> None:
        if getattr(self._local, 'connection', None) is connection:
            self._local.connection = None
        connection.close()

    # Futures.

    def call_async(self, method, pickle, buffers, timeout, finish):
        future = _base.CallFuture()
        try:
            name = _base.encode_method(method, self.address)
        except errors.CourierError as error:
            future.fail(error)
            return future
        server = _here.servers.get(self._path)
        pipeline = None
        if self._held.closed:
            future.fail(_base.closed(method, self.address))
            return future
        if server is not None:
            server.call_here_async(future, self._token, method, pickle, buffers, self.address,
                                   finish)
        else:
            pipeline = self._held.pipeline
            if pipeline is None or pipeline.broken:
                try:
                    pipeline = self._new_pipeline(method)
                except errors.CourierError as error:
                    future.fail(error)
                    return future
            pipeline.start(future, method, name, pickle, buffers, finish, self)
        if timeout is not None and not future.done():
            address = self.address

            def timed_out() -> errors.CourierError:
                if pipeline is not None and not pipeline.connected:
                    return _base.unreachable_timeout(method, address, timeout)
                return _base.call_timeout(method, address, timeout)

            self._deadline_watcher().add(time.monotonic() + timeout, future, timed_out)
        return future

    def _new_pipeline(self, method: str) -> '_Pipeline':
        held = self._held
        with held.lock:
            if held.pipeline is None or held.pipeline.broken:
                if held.closed:
                    raise _base.closed(method, self.address)
                held.pipeline = _Pipeline(self._target, self._token, self._wait_for_ready,
                                          self.address)
            return held.pipeline

    def _deadline_watcher(self) -> '_Deadlines':
        held = self._held
        with held.lock:
            if held.deadlines is None:
                held.deadlines = _Deadlines()
            return held.deadlines


class _Unsent(Exception):
    """Sending a request failed: it never reached the server (``answer``: what the server said)."""

    def __init__(self, error: OSError, answer: Optional[frames.Frame]):
        super().__init__()
        self.error = error
        self.answer = answer


def _never_sent(error: errors.CourierError) -> errors.CourierError:
    """Marks a ServerUnavailableError raised before the request went out (see its ``unsent``)."""
    if isinstance(error, errors.ServerUnavailableError):
        error.unsent = True
    return error


def _last_words(connection: dial.DialedConnection) -> Optional[frames.Frame]:
    """What a server that closed the connection sent before (a refusal or a fault), if anything."""
    try:
        connection.sock.settimeout(1.0)
        frame = connection.reader.read_frame()
    except Exception:  # pylint: disable=broad-except
        return None
    return frame if frame.kind in (frames.FAULT, frames.REFUSED) else None


def _stopped_meanwhile(path: str, method: str, address: str) -> _here.ServerHere:
    """Returns the server of this process at ``path``, which just started (and may have stopped)."""
    server = _here.servers.get(path)
    if server is None:
        raise _base.call_error(errors.ServerUnavailableError, method, address,
                               'failed: the server stopped')
    return server


class _Pipeline:
    """One connection carrying many calls at once; a reader thread completes them.

    The reader thread also makes the connection, so starting a call never blocks
    on a server that is not up yet. Once the connection breaks, every call on it
    fails and the transport makes a new pipeline for later calls.
    """

    def __init__(self, target: dial.Target, token: Optional[str], wait_for_ready: bool,
                 address: str):
        self._target = target
        self._token = token
        self._wait_for_ready = wait_for_ready
        self._address = address
        self._ids = itertools.count(1)
        self._pending: Dict[int, tuple] = {}  # call id -> (future, method, finish, owner)
        self._outbox = outbox.Outbox()
        self._lock = threading.Lock()
        self._connection: Optional[dial.DialedConnection] = None
        self._shared = False  # Large buffers go in shared memory (known once connected).
        # Set before the pending calls are failed, so a call started meanwhile sees it.
        self.broken: Optional[dial.Unreachable] = None
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name=f'courier-client {address}').start()

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def start(self, future: _base.CallFuture, method: str, name: bytes, pickle: bytes,
              buffers: Sequence[memoryview], finish, owner: Any) -> None:
        """Sends a call; ``owner`` (its transport) stays alive until the call is answered."""
        call_id = next(self._ids)
        self._pending[call_id] = (future, method, finish, owner)
        if self.broken:  # Checked after registering: see _break.
            self._pending.pop(call_id, None)
            future.fail(_never_sent(self.broken.error(method, self._address)))
            return
        future.on_cancel = functools.partial(self._cancel, call_id)
        self._put(call_id, frames.encode(frames.CALL, 0, call_id, name, pickle, buffers,
                                         self._shared))

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
            self._break(dial.unreachable(f'failed: sending failed ({dial.describe(error)})'))

    def _run(self) -> None:
        try:
            connection = dial.open_connection(self._target, self._token, frames.PIPELINED,
                                              self._wait_for_ready, None)
        except dial.Unreachable as unreachable:
            self._break(unreachable)
            return
        except BaseException as error:  # pylint: disable=broad-except
            self._break(dial.unreachable(f'failed: cannot connect ({dial.describe(error)})'))
            return
        with self._lock:
            if self._closed:
                connection.close()
                return
            self._connection = connection
        try:
            self._shared = connection.shared
            connection.for_two_threads()
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
                future, method, finish, owner = entry
                try:
                    response = _response(frame, method, self._address)
                except errors.CourierError as error:
                    future.fail(error)
                else:
                    future.resolve(finish, response)
                # While this thread waits for the next frame, it holds nothing of this call:
                # its transport, future and result may go once their owner drops them.
                entry = future = finish = owner = frame = response = None
        except (EOFError, OSError, frames.ProtocolViolation) as error:
            self._break(dial.unreachable(_went_away(error)))
        finally:
            connection.close()

    def _break(self, reason: dial.Unreachable) -> None:
        """Fails every pending call, and the calls started later on this pipeline."""
        self.broken = reason
        pending, self._pending = self._pending, {}
        self._outbox.clear()
        unsent = self._connection is None  # nothing was sent before the connection was made
        for future, method, _, _ in list(pending.values()):
            error = reason.error(method, self._address)
            future.fail(_never_sent(error) if unsent else error)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connection = self._connection
        self._break(dial.Unreachable(_base.closed))
        if connection is not None:
            connection.close()


class _Deadlines:
    """Fails futures whose call_timeout passes; one thread, started on first use.

    It holds the futures weakly: a call that completed and was dropped (with its result) is
    not kept until its deadline. A call still waiting is held by its pipeline or its server.
    """

    def __init__(self):
        self._heap: List[tuple] = []
        self._order = itertools.count()
        self._compact_at = 1024
        # Entered as the lock: `add` runs in callers' threads, where an exception raised from
        # outside (a local_mt stop) could land inside Condition.__enter__ and leave it held.
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._closed = False
        threading.Thread(target=self._run, daemon=True, name='courier-deadlines').start()

    def add(self, deadline: float, future: _base.CallFuture,
            timed_out: Callable[[], errors.CourierError]) -> None:
        """At ``deadline``, fails ``future`` with ``timed_out()`` unless it is done."""
        with self._lock:
            heap = self._heap
            if len(heap) >= self._compact_at:  # Drop the entries of calls that completed.
                heap[:] = [entry for entry in heap if _waiting(entry[2])]
                heapq.heapify(heap)
                self._compact_at = 2 * len(heap) + 1024
            order = next(self._order)
            heapq.heappush(heap, (deadline, order, weakref.ref(future), timed_out))
            if heap[0][1] == order:
                self._condition.notify()

    def _run(self) -> None:
        with self._lock:
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
                future = future()
                if future is not None and not future.done():
                    on_cancel = future.on_cancel  # Taken first: failing the future drops it.
                    future.fail(timed_out())
                    if on_cancel is not None:
                        on_cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._heap = []
            self._condition.notify()


def _waiting(future: 'weakref.ref[_base.CallFuture]') -> bool:
    future = future()
    return future is not None and not future.done()


def _response(frame: frames.Frame, method: str, address: str) -> wire.Response:
    if frame.kind != frames.RESPONSE:
        raise _unexpected(frame, method, address)
    if frame.status == wire.OK:
        return wire.Response(wire.OK, frame.payload, frame.buffers)
    return _base.decode_response(frame.payload, method, address)


def _unexpected(frame: frames.Frame, method: str, address: str) -> errors.CourierError:
    if frame.kind == frames.REFUSED:
        return dial.refusal(frame).error(method, address)
    if frame.kind == frames.FAULT:
        return _base.rejected_as_malformed(method, address,
                                           frame.text.decode(errors='replace'))
    return _base.call_error(errors.ProtocolError, method, address,
                            f'got a frame of kind {frame.kind} instead of its answer')


def _went_away(error: BaseException) -> str:
    if getattr(error, 'errno', None) in (errno.ETIMEDOUT, errno.EHOSTUNREACH):
        return (f'failed: the server\'s host stopped answering during the call (nothing came '
                f'back for about {keepalive.DEAD_AFTER} s: it is down, frozen or cut off the '
                f'network) ({dial.describe(error)})')
    return f'failed: the server went away during the call ({dial.describe(error)})'
