"""courier.Client: calls the methods of a remote courier.Server."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable, List, Optional, Union

from courier import durations
from courier import errors
from courier import metrics
from courier import security
from courier import serialization
from courier import wire

Address = Union[str, Callable[[], str]]

_ARGUMENT_NAMES = ('args', 'kwargs')

# Counts forks, so a client notices it runs in a child (gRPC channels do not survive
# fork) without a getpid system call per call.
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
      address: The server's address (``'host:port'``, ``'unix:/path'``), or a
        picklable zero-argument callable returning it, called at the first call.
      call_timeout: Seconds (or a ``datetime.timedelta``) each call may take;
        None waits forever.
      wait_for_ready: If the server is not reachable, wait for it (until the
        call's deadline) instead of failing at once.
      auth_token: Secret the server requires; defaults to ``COURIER_AUTH_TOKEN``.
      tls: ``courier.TLSConfig`` to connect with TLS (None: plaintext).
    """

    def __init__(self, address: Address, call_timeout: Optional[durations.Duration] = None,
                 wait_for_ready: bool = True, *, auth_token: Optional[str] = None,
                 tls: Optional[security.TLSConfig] = None):
        if isinstance(address, str):
            from courier import transport  # pylint: disable=import-outside-toplevel
            transport.parse_address(address)  # Fail now on a malformed address.
        elif not callable(address):
            raise TypeError('address must be a str or a callable returning one, got '
                            f'{type(address).__name__}')
        if auth_token is not None:
            security.resolve_auth_token(auth_token)  # Validate now.
        self._address = address
        self._call_timeout = durations.to_seconds(call_timeout, 'call_timeout')
        self._wait_for_ready = bool(wait_for_ready)
        self._auth_token = auth_token
        self._tls = tls
        self._transport = None
        self._transport_generation = -1
        self._lock = threading.Lock()
        self._lock_generation = _fork_generation

    def __getattr__(self, name: str) -> '_Method':
        if name.startswith('__'):
            raise AttributeError(name)
        method = _Method(self, name)
        self.__dict__[name] = method  # Later lookups skip __getattr__.
        return method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the server's ``__call__`` method (a bound callable object)."""
        return self._call('__call__', args, kwargs)

    @property
    def futures(self) -> '_Futures':
        """``client.futures.name(...)`` calls ``name`` asynchronously."""
        futures = self.__dict__.get('_futures')
        if futures is None:
            futures = self.__dict__['_futures'] = _Futures(self)
        return futures

    def __getstate__(self):
        address = self._address
        if self._transport is not None:
            address = self._transport.address  # Resolved: send the string.
        return {'address': address, 'call_timeout': self._call_timeout,
                'wait_for_ready': self._wait_for_ready, 'auth_token': self._auth_token,
                'tls': self._tls}

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self) -> str:
        address = self._transport.address if self._transport is not None else self._address
        return f'courier.Client({address!r})'

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        data, buffers = serialization.dumps((args, kwargs), f'the arguments of {method!r}',
                                            _ARGUMENT_NAMES)
        transport = self._connection()
        calls, started = self._calls, metrics.clock()
        try:
            result = _result(method, transport.address,
                             transport.call(method, data, buffers, self._call_timeout))
        except BaseException:
            calls.record(method, started, True)
            raise
        calls.record(method, started, False)
        return result

    def _call_async(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        try:
            data, buffers = serialization.dumps((args, kwargs), f'the arguments of {method!r}',
                                                _ARGUMENT_NAMES)
            transport = self._connection()
        except Exception as error:  # pylint: disable=broad-except
            future = concurrent.futures.Future()
            future.set_exception(error)
            return future
        address, calls, started = transport.address, self._calls, metrics.clock()

        def finish(response: wire.Response) -> Any:
            try:
                result = _result(method, address, response)
            except BaseException:
                calls.record(method, started, True)
                raise
            calls.record(method, started, False)
            return result

        return transport.call_async(method, data, buffers, self._call_timeout, finish)

    def _list_methods(self) -> List[str]:
        return self._connection().list_methods(self._call_timeout)

    def _connection(self):
        """Returns the transport, connecting on first use in each process."""
        transport = self._transport
        generation = _fork_generation
        if transport is not None and self._transport_generation == generation:
            return transport
        if self._lock_generation != generation:  # Forked: the lock may be held forever.
            self._lock = threading.Lock()
            self._lock_generation = generation
        with self._lock:
            if self._transport is None or self._transport_generation != generation:
                from courier import transport as transports  # pylint: disable=import-outside-toplevel
                self._transport = transports.connect(
                    self._resolve_address(), auth_token=security.resolve_auth_token(
                        self._auth_token), tls=self._tls, wait_for_ready=self._wait_for_ready)
                self._calls = metrics.table(metrics.CLIENT, self._transport.address)
                self._transport_generation = generation
            return self._transport

    def _resolve_address(self) -> str:
        address = self._address
        if isinstance(address, str):
            return address
        resolved = address()
        if not isinstance(resolved, str):
            raise TypeError(f'the address callable {address!r} returned '
                            f'{type(resolved).__name__}, expected a str address')
        from courier import transport  # pylint: disable=import-outside-toplevel
        transport.parse_address(resolved)
        return resolved


class _Method:
    """``client.name``: calling it calls the remote method ``name``."""

    __slots__ = ('_client', '_name')

    def __init__(self, client: Client, name: str):
        self._client = client
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client._call(self._name, args, kwargs)  # pylint: disable=protected-access

    def __repr__(self) -> str:
        return f'<remote method {self._name!r} of {self._client!r}>'


class _Futures:
    """``client.futures``: its attributes start calls and return futures."""

    def __init__(self, client: Client):
        self._client = client

    def __getattr__(self, name: str) -> '_AsyncMethod':
        if name.startswith('__'):
            raise AttributeError(name)
        method = _AsyncMethod(self._client, name)
        self.__dict__[name] = method
        return method


class _AsyncMethod(_Method):
    """``client.futures.name``: calling it starts the call and returns a future."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        return self._client._call_async(self._name, args, kwargs)  # pylint: disable=protected-access


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
        existing = ', '.join(repr(name) for name in response.methods) or 'none'
        return errors.UnknownMethodError(
            f'courier server {address} has no method {method!r}; its methods are: {existing}')
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
