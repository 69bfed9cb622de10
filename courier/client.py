"""courier.Client: calls the methods of a remote courier.Server."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, List, Optional, Union

from courier import durations
from courier import errors
from courier import inflight
from courier import metrics
from courier import security
from courier import serialization
from courier import wire

_get_ident = threading.get_ident  # (read once: it runs on every call)


class _Sends:
    """How many times one call may have reached its server, as ``AddressResolver.resend`` is
    told: a failure known not to have sent it (``ServerUnavailableError.unsent``) counts only
    past the first three, since a restarting server's dying socket may take a connection or two."""

    __slots__ = ('sent', '_unsent')
    _FORGIVEN = 3

    def __init__(self):
        self.sent = self._unsent = 0

    def lost(self, error: errors.ServerUnavailableError) -> int:
        """Counts the failure ``error`` of the call; returns how often it may have been sent."""
        if error.unsent and self._unsent < self._FORGIVEN:
            self._unsent += 1
        else:
            self.sent += 1
        return self.sent


class AddressResolver:
    """An address a client finds when it connects, and that may ask it to try a call again.

    A client calls it (``resolver()`` returns ``'host:port'`` or ``'unix:/path'``) at its
    first call and again after a call found the server unavailable, as any callable
    address. A resolver also travels as itself when the client is pickled (a plain
    callable travels as the address it resolved to), so a copy in another process finds
    the server anew, and :meth:`retry` lets it say that a blocking call (or a method
    listing) that found no server, on a connection that has not carried a call yet, goes
    again: such a call never reached the server. launchpad's node handles use one to
    follow a node through its restarts.
    """

    def __call__(self) -> str:
        raise NotImplementedError

    def retry(self, elapsed: float) -> bool:
        """Whether the call that began ``elapsed`` seconds ago goes again (it may wait first).

        The default never retries.
        """
        del elapsed
        return False

    def resends(self, method: str) -> bool:
        """Whether :meth:`resend` decides about the calls of ``method`` (then its futures
        are sent again too, see :mod:`courier.resent`). The default: for none."""
        del method
        return False

    def resend(self, method: str, sent: int) -> Optional[bool]:
        """Whether a call of ``method`` (blocking, or a future's) that was sent ``sent``
        times, and lost its server each time (it may have run there; the first few failures
        known not to have sent it, see ``ServerUnavailableError.unsent``, are not counted), is
        sent again, to the server the resolver finds next (one restarted in its place): True
        or False for a method whose calls the resolver counts (they go at most as often as it
        allows), None for the others, which :meth:`retry` decides about.

        The default has no say: a call that may have reached its server is repeated only
        where its caller said that is safe (launchpad: ``handle.with_retries``).
        """
        del method, sent
        return None

    def explain(self, error: errors.ServerUnavailableError) -> errors.ServerUnavailableError:
        """The error raised by a call that found no server and does not go again: ``error``,
        or one that says more (launchpad's: the node was removed and will not come back).

        It runs in the thread that reads the call's outcome (a blocking call's, or the one
        asking its future). The default returns ``error``.
        """
        return error


Address = Union[str, Callable[[], str]]

# Counts forks, so a client notices it runs in a child (its connections, and gRPC
# channels, do not survive fork) without a getpid system call per call.
_fork_generation = 0


def _count_fork() -> None:
    global _fork_generation  # pylint: disable=global-statement
    _fork_generation += 1


os.register_at_fork(after_in_child=_count_fork)


class Client:
    """A handle on a remote server: ``client.name(...)`` calls the method ``name``.

    ``client.futures.name(...)`` starts the call and returns a
    ``concurrent.futures.Future``; cancelling it cancels the call (a method the
    server already started runs to completion, and its result is dropped).

    Clients are thread-safe and picklable: the connection is made at the first
    call (in the process making it), so a client pickled into another process
    works there too. An auth token passed explicitly travels with the pickle;
    otherwise each process reads ``COURIER_AUTH_TOKEN`` when it first calls.

    Args:
      server_address: The server's address (``'host:port'``, ``'unix:/path'``), or a
        picklable zero-argument callable returning it, called at the first call, and
        again at the next call after a call found the server unavailable (it may have
        moved, e.g. restarted on another port), or an :class:`AddressResolver`. It is
        checked at the first call too (as dm-launchpad does): a malformed one fails there.
      compress: Send every call and its result compressed (zlib, done in
        serialization: it helps large compressible arguments and results between
        hosts, and costs CPU between the processes of one machine).
      call_timeout: Seconds (or a ``datetime.timedelta``) each call may take;
        None or 0 waits forever.
      wait_for_ready: If the server is not reachable, wait for it (until the
        call's deadline) instead of failing at once.
      chunk_tensors: Accepted for dm-launchpad's signature, without effect: large
        arrays already travel as out-of-band buffers, never as one copied chunk.
      load_balancing_policy: Accepted for dm-launchpad's signature (None or a gRPC
        policy name), without effect: a client calls the one server its address names.
      propagate_deadline: Accepted for dm-launchpad's signature, without effect (as there).
      auth_token: Secret the server requires; defaults to ``COURIER_AUTH_TOKEN``.
      tls: ``courier.TLSConfig`` to connect with TLS (None: plaintext).
      protocol: What carries the calls: None (courier's framed protocol where the server
        speaks it, else gRPC: a TCP client falls back to gRPC for a server that speaks only
        gRPC, and a ``unix:`` server with TLS is called over gRPC), ``'framed'`` (courier's
        frames only), or ``'grpc'`` (gRPC only: for a server known to speak only gRPC, or to
        measure a courier server's gRPC service).
    """

    def __init__(self, server_address: Address, compress: bool = False,
                 call_timeout: Optional[durations.Duration] = None, wait_for_ready: bool = True,
                 chunk_tensors: bool = False, *, load_balancing_policy: Optional[str] = None,
                 propagate_deadline: bool = True, auth_token: Optional[str] = None,
                 tls: Optional[security.TLSConfig] = None, protocol: Optional[str] = None):
        if not isinstance(server_address, str) and not callable(server_address):
            raise TypeError('address must be a str or a callable returning one, got '
                            f'{type(server_address).__name__}')
        if load_balancing_policy is not None and not isinstance(load_balancing_policy, str):
            raise TypeError('load_balancing_policy must be None or a policy name, got '
                            f'{load_balancing_policy!r}')
        if auth_token is not None:
            security.resolve_auth_token(auth_token)  # Validate now.
        if protocol is not None:
            from courier import transport  # pylint: disable=import-outside-toplevel
            if protocol not in transport.PROTOCOLS:
                raise ValueError(f'protocol={protocol!r} is not one of {transport.PROTOCOLS}; '
                                 f'pass one of them, or None to speak what the server speaks best')
        del chunk_tensors, propagate_deadline  # See the docstring.
        self._address = server_address
        self._compress = bool(compress)
        # dm-launchpad's clients read a zero timeout as none.
        self._call_timeout = durations.to_seconds(call_timeout, 'call_timeout') or None
        self._wait_for_ready = bool(wait_for_ready)
        self._auth_token = auth_token
        self._tls = tls
        self._protocol = protocol
        self._link = _Link(self)

    @property
    def address(self) -> Address:
        """The server's address (as given, or as resolved once connected)."""
        return self._link.address

    @property
    def protocol(self) -> Optional[str]:
        """What carries this client's calls: 'framed' (courier's own protocol, on a Unix socket
        or TCP), 'grpc' (a server that speaks only gRPC, or a ``unix:`` one with TLS), or None
        before the first call."""
        transport = self._link.transport
        return transport.protocol if transport is not None else None

    def __getattr__(self, name: str) -> '_Method':
        if name.startswith('__'):
            raise AttributeError(name)
        method = _Method(self, name)
        self.__dict__[name] = method  # Later lookups skip __getattr__.
        return method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the server's ``__call__`` method (a bound callable object)."""
        return self._link._call('__call__', args, kwargs)  # pylint: disable=protected-access

    @property
    def futures(self) -> '_Futures':
        """``client.futures.name(...)`` calls ``name`` asynchronously."""
        futures = self.__dict__.get('_futures')
        if futures is None:
            futures = self.__dict__['_futures'] = _Futures(self)
        return futures

    def __getstate__(self):
        address = self._address
        transport = self._link.transport
        if transport is not None and not isinstance(address, AddressResolver):
            address = transport.address  # Resolved: send the string.
        return {'server_address': address, 'compress': self._compress,
                'call_timeout': self._call_timeout, 'wait_for_ready': self._wait_for_ready,
                'auth_token': self._auth_token, 'tls': self._tls,
                'protocol': self._protocol}

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self) -> str:
        return f'courier.Client({self.address!r})'

    def close(self) -> None:
        """Releases the client's connections and threads; its calls in flight fail.

        (Calls to a server in this process hold nothing of the client: they complete.)

        Later calls raise ``courier.ServerUnavailableError``. A client that is garbage
        collected releases them too; ``with courier.Client(...) as client:`` closes at the end.
        """
        self._link.close()

    def redial(self) -> None:
        """Drops the client's connections as if its server had gone away, leaving it open.

        For a server known to have moved while its old connections may stay open and silent
        (its host or pod went away without a reset): calls waiting on them fail with
        ``courier.ServerUnavailableError`` (or go again, to where an AddressResolver finds
        the server next), and the next call connects again, resolving the address anew.
        """
        self._link.redial()

    def __enter__(self) -> 'Client':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def _transport(self):
        """The transport, once connected (None before)."""
        return self._link.transport

    def _call_async(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        return self._link.call_async(method, args, kwargs)

    def _list_methods(self) -> List[str]:
        return self._link.patiently(
            lambda transport: transport.list_methods(self._call_timeout))[1]

    def _connection(self):
        """Returns the transport, connecting on first use in each process."""
        return self._link.connection()


class _Link:
    """A client's way to its server: the transport, made at the first call in each process
    (again after a fork, and after a callable address's server went away), the counts of its
    calls, and the calls themselves.

    Apart from :class:`Client` for speed: a class with ``__getattr__`` (the client's, for
    remote method names) keeps CPython from specializing the reads of its attributes, and a
    call reads a dozen.
    """

    __slots__ = ('_address', '_compress', '_call_timeout', '_wait_for_ready', '_auth_token',
                 '_tls', '_protocol', '_waiting', 'transport', '_calls', '_fresh',
                 '_generation', '_unavailable', '_lock', '_lock_generation', '_closed')

    def __init__(self, client: Client):
        self._address = client._address  # pylint: disable=protected-access
        self._compress = client._compress  # pylint: disable=protected-access
        self._call_timeout = client._call_timeout  # pylint: disable=protected-access
        self._wait_for_ready = client._wait_for_ready  # pylint: disable=protected-access
        self._auth_token = client._auth_token  # pylint: disable=protected-access
        self._tls = client._tls  # pylint: disable=protected-access
        self._protocol = client._protocol  # pylint: disable=protected-access
        self._waiting = inflight.waiting if inflight.enabled() else None  # Lists its calls.
        self.transport = None
        # Counts of calls through the transport (and what `inflight.snapshot` reads).
        self._calls: Optional[metrics.CallTable] = None
        self._fresh = True  # No blocking call went through the transport since it was made.
        self._generation = -1  # The _fork_generation the transport was made in.
        self._unavailable = None  # A transport whose server went away (see _server_gone).
        self._lock = threading.Lock()
        self._lock_generation = _fork_generation
        self._closed = False

    @property
    def address(self) -> Address:
        """The server's address (as given, or as resolved once connected)."""
        transport = self.transport
        return transport.address if transport is not None else self._address

    def close(self) -> None:
        with self._lock:
            self._closed = True
            transport = self.transport
        if transport is not None:
            transport.close()

    def redial(self) -> None:
        with self._lock:
            transport, self.transport = self.transport, None
            self._unavailable = None
        if transport is not None:
            transport.close()

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        """Makes a blocking call and returns its result (named as on Client before: stack
        views show a thread blocked in a call by it)."""
        data, buffers = serialization.dumps_arguments(args, kwargs, method, self._compress)
        started = metrics.clock()
        listed = self._waiting
        if listed is not None:
            entry = (self, method, started, _get_ident())
            key = id(entry)
            listed[key] = entry
        try:
            transport = self.transport
            if transport is not None and self._generation == _fork_generation:
                # Connected in this process, the common case: the call goes at once (no
                # closure, no retry loop); a server found unavailable goes on as the first try
                # of `patiently`.
                fresh = self._fresh
                try:
                    response = transport.call(method, data, buffers, self._call_timeout)
                except errors.ServerUnavailableError as error:
                    transport, response = self.patiently(
                        self._attempt(method, data, buffers), method, (transport, fresh, error))
                else:
                    if fresh:
                        self._fresh = False
            else:
                transport, response = self.patiently(self._attempt(method, data, buffers),
                                                     method)
            if response.status != wire.OK:
                raise _error(method, transport.address, response)
            result = serialization.loads(response.pickle, response.buffers,
                                         ('the result of', method))
        except BaseException:
            if self._calls is not None:  # None: no connection was ever made.
                self._calls.record(method, started, True)
            raise
        finally:
            if listed is not None:
                del listed[key]
        self._calls.record(method, started, False)
        return result

    def _attempt(self, method: str, data: bytes, buffers: List[Any]) -> Callable[[Any], Any]:
        """What `patiently` tries for a blocking call (a closure made here: `call` then keeps
        its variables plain, which is cheaper than the cells a closure there would need)."""
        return lambda transport: transport.call(method, data, buffers, self._call_timeout)

    def patiently(self, attempt: Callable[[Any], Any], method: Optional[str] = None,
                  failed: Optional[tuple] = None) -> tuple:
        """Returns the transport and what ``attempt(transport)`` returned; a blocking call that
        never reached its server goes again while an AddressResolver says so, and one that may
        have reached it (call ``method``) is sent again where the resolver's ``resend`` says so.
        ``failed``: ``(transport, fresh, error)`` of a first try made already, which found the
        server unavailable."""
        started = sends = None
        while True:
            if failed is None:
                fresh = self._fresh
                transport = self.connection()
                try:
                    result = attempt(transport)
                except errors.ServerUnavailableError as error:
                    failed = transport, fresh, error
                else:
                    self._fresh = False
                    return transport, result
            transport, fresh, error = failed
            failed = None
            self._server_gone(transport)
            started = started or time.monotonic()
            address = self._address
            if isinstance(address, AddressResolver):
                sends = sends or _Sends()  # (made on a failure only: not per call)
                sent = sends.lost(error)
                resend = None if method is None else address.resend(method, sent)
                if resend or (resend is None and fresh
                              and address.retry(time.monotonic() - started)):
                    continue
                explained = address.explain(error)
                if explained is not error:
                    raise explained from error
            raise error

    def call_async(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        """Starts a call and returns its future."""
        try:
            data, buffers = serialization.dumps_arguments(args, kwargs, method, self._compress)
            transport = self.connection()
        except Exception as error:  # pylint: disable=broad-except
            future = concurrent.futures.Future()
            future.set_exception(error)
            return future
        address, calls, started = transport.address, self._calls, metrics.clock()
        listed = self._waiting
        if listed is not None:
            entry = [self, method, started, _get_ident(), None]
            key = id(entry)
            listed[key] = entry

        def finish(response: wire.Response) -> Any:
            if listed is not None:
                listed.pop(key, None)
            try:
                result = _result(method, address, response)
            except BaseException:
                calls.record(method, started, True)
                raise
            calls.record(method, started, False)
            return result

        # A future that fails without a response (timed out, unreachable, closed) is not
        # counted: a done-callback to count it would cost the client ~30% of a future's CPU.
        future = transport.call_async(method, data, buffers, self._call_timeout, finish)
        if listed is not None:
            entry[4] = future  # `inflight.snapshot` drops it once done without a response
            if len(listed) > inflight.sweep_at:
                inflight.sweep()
        if callable(self._address):
            # The transport's own error (Future.exception: not explained on its thread).
            future.add_done_callback(lambda done: isinstance(
                concurrent.futures.Future.exception(done) if not done.cancelled() else None,
                errors.ServerUnavailableError) and self._server_gone(transport))
            if isinstance(self._address, AddressResolver):
                future.explain = self._address.explain
        return future

    def connection(self):
        """Returns the transport, connecting on first use in each process."""
        transport = self.transport
        generation = _fork_generation
        if transport is not None and self._generation == generation:
            return transport
        if self._lock_generation != generation:  # Forked: the lock may be held forever.
            self._lock = threading.Lock()
            self._lock_generation = generation
        with self._lock:
            gone, self._unavailable = self._unavailable, None
            if gone is not None and gone is self.transport:
                gone.close()
                self.transport = None
            if self.transport is None or self._generation != generation:
                from courier import transport as transports  # pylint: disable=import-outside-toplevel
                self.transport = transports.connect(
                    self._resolve_address(), auth_token=security.resolve_auth_token(
                        self._auth_token), tls=self._tls, wait_for_ready=self._wait_for_ready,
                    protocol=self._protocol)
                self._calls = metrics.table(metrics.CLIENT, self.transport.address)
                self._fresh = True
                self._generation = generation
                if self._closed:  # Its calls raise the error that says the client was closed.
                    self.transport.close()
            return self.transport

    def _server_gone(self, transport) -> None:
        """A call found the server unavailable: with a callable address, the next call resolves
        it again (and closes this transport)."""
        if callable(self._address) and transport is self.transport:
            self._unavailable = transport
            self._generation = -1  # The next call takes the slow path.

    def _resolve_address(self) -> str:
        address = self._address
        if callable(address):
            resolved = address()
            if not isinstance(resolved, str):
                raise TypeError(f'the address callable {address!r} returned '
                                f'{type(resolved).__name__}, expected a str address')
        else:
            resolved = address
        from courier import transport  # pylint: disable=import-outside-toplevel
        try:
            transport.parse_address(resolved)
        except ValueError as error:
            raise ValueError(f'{error}. courier.Client was given {resolved!r}: courier has no '
                             'name service (a name given to courier.Server is only a label), so '
                             'pass the address the server listens on, e.g. server.address') from None
        return resolved


class _Method:
    """``client.name``: calling it calls the remote method ``name``."""

    __slots__ = ('_client', '_link', '_name')

    def __init__(self, client: Client, name: str):
        self._client = client
        self._link = client._link  # pylint: disable=protected-access
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link._call(self._name, args, kwargs)  # pylint: disable=protected-access

    def __repr__(self) -> str:
        return f'<remote method {self._name!r} of {self._client!r}>'

class _Futures:
    """``client.futures``: its attributes start calls and return futures."""

    def __init__(self, client: Client):
        self._client = client

    def __getattr__(self, name: str) -> '_AsyncMethod':
        if name.startswith('__'):
            raise AttributeError(name)
        method = (_ResentAsyncMethod if _resends(self._client, name) else _AsyncMethod)(
            self._client, name)
        self.__dict__[name] = method
        return method

    def __call__(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Starts a call of the server's ``__call__`` method and returns its future."""
        if _resends(self._client, '__call__'):
            return _ResentAsyncMethod(self._client, '__call__')(*args, **kwargs)
        return self._client._call_async('__call__', args, kwargs)  # pylint: disable=protected-access


class _AsyncMethod(_Method):
    """``client.futures.name``: calling it starts the call and returns a future."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        return self._link.call_async(self._name, args, kwargs)


class _ResentAsyncMethod(_Method):
    """``client.futures.name`` of a method whose calls the client's resolver re-sends."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        from courier import resent  # pylint: disable=import-outside-toplevel
        return resent.ResentFuture(self._client, self._name, args, kwargs, _Sends()).send()


def _resends(client: Client, method: str) -> bool:
    address = client._address  # pylint: disable=protected-access
    return isinstance(address, AddressResolver) and address.resends(method)


def list_methods(client: Client) -> List[str]:
    """Returns the sorted names of the methods bound on ``client``'s server."""
    if not isinstance(client, Client):
        raise TypeError(f'list_methods needs a courier.Client, got {type(client).__name__}')
    return client._list_methods()  # pylint: disable=protected-access


def _result(method: str, address: str, response: wire.Response) -> Any:
    """Returns the call's result, or raises the error the response describes."""
    if response.status == wire.OK:
        return serialization.loads(response.pickle, response.buffers,
                                   f'the result of {method!r}')
    raise _error(method, address, response)


def _error(method: str, address: str, response: wire.Response) -> BaseException:
    call = f'call to {method!r} on courier server {address}'
    if response.status == wire.EXCEPTION:
        return _remote_exception(method, address, response)
    if response.status == wire.UNKNOWN_METHOD:
        from courier.transport import _base  # pylint: disable=import-outside-toplevel
        return _base.unknown_method(method, address, response.methods)
    if response.status == wire.SERIALIZATION_ERROR:
        return errors.SerializationError(f'{call} failed: {response.message}')
    return errors.ProtocolError(f'{call} returned unknown status {response.status}')


def _remote_exception(method: str, address: str, response: wire.Response) -> BaseException:
    """Rebuilds the remote exception, or a RemoteError when that is impossible."""
    exception = None
    if response.pickle:
        try:
            exception = serialization.loads(response.pickle, response.buffers,
                                            f'the exception raised by {method!r}')
        except errors.SerializationError:
            pass
    if not isinstance(exception, BaseException):
        return errors.RemoteError(
            f'{method!r} on courier server {address} raised {response.message}',
            remote_type=response.exception_type, remote_traceback=response.traceback)
    exception.__cause__ = errors.RemoteTraceback(
        f'{method!r} on courier server {address} raised:\n{response.traceback}')
    try:
        exception.remote_traceback = response.traceback
    except AttributeError:  # __slots__ or a read-only attribute: the cause still has it.
        pass
    return exception
