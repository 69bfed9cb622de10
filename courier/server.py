"""courier.Server: serves Python callables to courier clients."""

from __future__ import annotations

import logging
import threading
import traceback
import types
from typing import Any, Callable, Dict, List, Optional

from courier import errors
from courier import inflight
from courier import metrics
from courier import security
from courier import serialization
from courier import wire

_get_ident = threading.get_ident  # (read once: it runs on every call)
_COROUTINE = types.CoroutineType

_logger = logging.getLogger('courier')

# Attributes bind_object never exposes: the node's main loop and the hook below.
_NEVER_BOUND = frozenset({'run', 'set_courier_server'})

_CREATED, _STARTED, _STOPPED = 'created', 'started', 'stopped'


class Server:
    """Serves bound callables to :class:`courier.Client` objects.

    The server binds its address when constructed, so :attr:`address` is final
    (including the port picked for ``port=None`` or ``0``) before :meth:`Start`.
    Calls run in a pool of ``thread_pool_size`` threads; a call that blocks
    (e.g. a :func:`courier.batched_handler` collecting a batch) holds a thread.

    The positional arguments are dm-launchpad's: ``Server(name=None, port=None,
    thread_pool_size=16)``.

    Args:
      name: A name for the server, shown in its repr (dm-launchpad's servers take one too; it
        does not change where the server listens).
      port: TCP port to listen on; None or 0 picks a free port.
      thread_pool_size: How many calls may run at once.
      host: Interface to listen on. The default accepts local clients only.
      address: ``'host:port'`` or ``'unix:/path'``; overrides ``host`` and ``port``.
      auth_token: Shared secret every call must carry; defaults to the
        ``COURIER_AUTH_TOKEN`` environment variable. None there too: no check.
      tls: ``courier.TLSConfig`` with the server's certificate and key (and a
        client CA to require client certificates).
      max_connections, max_connections_per_client, hello_timeout, max_calls_in_flight,
        linger_ms, stall_timeout: the server's limits (docs/courier.md); None takes each from its
        ``COURIER_*`` environment variable, or its default.

    Raises:
      OSError: the address cannot be bound.
      ValueError: a limit is not a positive number.
    """

    def __init__(self, name: Optional[str] = None, port: Optional[int] = None,
                 thread_pool_size: int = 16, *, host: str = '127.0.0.1',
                 address: Optional[str] = None, auth_token: Optional[str] = None,
                 tls: Optional[security.TLSConfig] = None,
                 max_connections: Optional[int] = None,
                 max_connections_per_client: Optional[int] = None,
                 hello_timeout: Optional[float] = None,
                 max_calls_in_flight: Optional[int] = None,
                 linger_ms: Optional[int] = None,
                 stall_timeout: Optional[float] = None):
        from courier import transport  # pylint: disable=import-outside-toplevel
        if name is not None and not isinstance(name, str):
            raise TypeError(f'name must be a str, got {name!r}; a port is the second argument: '
                            f'courier.Server(port={name!r})')
        self.name = name
        self._healthy = True
        if not isinstance(thread_pool_size, int) or thread_pool_size < 1:
            raise ValueError(f'thread_pool_size must be a positive int, got {thread_pool_size!r}')
        if address is None:
            if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
                raise ValueError(f'port must be an int in [0, 65535] or None, got {port!r}')
            address = transport.tcp_address(host, port or 0)
        endpoint = transport.parse_address(address)
        auth_token = security.resolve_auth_token(auth_token)
        self._methods: Dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._state = _CREATED
        self._stopped = threading.Event()
        self._serving: Optional[Dict[int, tuple]] = None  # inflight's list of served calls
        self._transport = transport.listen(
            address, self._handle_call, self._method_names, thread_pool_size=thread_pool_size,
            auth_token=auth_token, tls=tls, limits=dict(
                max_connections=max_connections,
                max_connections_per_client=max_connections_per_client,
                hello_timeout=hello_timeout, max_calls_in_flight=max_calls_in_flight,
                linger_ms=linger_ms, stall_timeout=stall_timeout))
        if not endpoint.is_local and auth_token is None:
            _logger.warning(
                'courier server %s accepts calls from other machines without an auth token: '
                'anyone who can reach it can run code in this process. Pass auth_token= or '
                'set %s.', self.address, security.AUTH_TOKEN_ENV)

    @classmethod
    def from_object(cls, obj: Any, **server_kwargs: Any) -> 'Server':
        """Returns a new server with ``obj`` bound as by :meth:`bind_object`."""
        server = cls(**server_kwargs)
        try:
            server.bind_object(obj)
        except BaseException:
            server.Stop()
            raise
        return server

    @property
    def address(self) -> str:
        """The address clients connect to, e.g. ``'127.0.0.1:43121'`` or ``'unix:/tmp/s'``."""
        return self._transport.address

    @property
    def port(self) -> Optional[int]:
        """The TCP port clients connect to (None for a Unix socket)."""
        from courier import transport  # pylint: disable=import-outside-toplevel
        endpoint = transport.parse_address(self.address)
        return endpoint.port if endpoint.kind == 'tcp' else None

    @property
    def has_started(self) -> bool:
        """True once :meth:`Start` has been called (also after :meth:`Stop`)."""
        return self._state != _CREATED

    @property
    def is_healthy(self) -> bool:
        """What :meth:`SetIsHealthy` last set (True at first)."""
        return self._healthy

    def SetIsHealthy(self, is_healthy: bool) -> None:  # pylint: disable=invalid-name
        """Records whether the server wants calls (dm-launchpad's health status).

        It does not change what the server accepts: nothing in courier balances calls across
        servers by health, so the status is only kept, for :attr:`is_healthy`.
        """
        self._healthy = bool(is_healthy)

    def Bind(self, name: str, fn: Callable[..., Any],  # pylint: disable=invalid-name
             is_priority: bool = False) -> None:
        """Serves ``fn`` as method ``name``, replacing any method bound under that name.

        ``is_priority`` is accepted for dm-launchpad's signature and has no effect: every call
        gets a thread of the same pool.
        """
        del is_priority
        if not isinstance(name, str) or not name:
            raise TypeError(f'method name must be a non-empty str, got {name!r}')
        if not callable(fn):
            raise TypeError(f'cannot bind {name!r}: {type(fn).__name__} object is not callable')
        with self._lock:
            methods = dict(self._methods)
            methods[name] = fn
            self._methods = methods  # Copy-on-write: calls read without locking.

    def BindHandler(self, name: str, handler: Callable[..., Any],  # pylint: disable=invalid-name
                    is_priority: bool = False) -> None:
        """dm-launchpad's way to bind a prepared handler; here a handler is any callable, as
        for :meth:`Bind` (e.g. a function made by :func:`courier.batched_handler`)."""
        self.Bind(name, handler, is_priority)

    def Unbind(self, name: str) -> None:  # pylint: disable=invalid-name
        """Stops serving method ``name`` (calls to it then fail as unknown); nothing happens if
        no method of that name is bound."""
        with self._lock:
            methods = dict(self._methods)
            methods.pop(name, None)
            self._methods = methods

    def bind_object(self, obj: Any) -> None:
        """Binds every public callable attribute of ``obj``.

        Public means not starting with ``_``; ``__call__`` is bound too when
        ``obj`` is callable. Properties are read once, now, and bound when their
        value is callable. ``run`` and ``set_courier_server`` are never bound.
        Finally, if ``obj`` has ``set_courier_server``, it is called with this
        server, and ``obj`` then owns starting and stopping the server.
        """
        for name in dir(obj):
            if name in _NEVER_BOUND or (name.startswith('_') and name != '__call__'):
                continue
            try:
                value = getattr(obj, name)
            except Exception as error:  # pylint: disable=broad-except
                raise RuntimeError(f'cannot bind {type(obj).__name__}: reading attribute '
                                   f'{name!r} raised {error!r}') from error
            if callable(value):
                self.Bind(name, value)
        set_server = getattr(obj, 'set_courier_server', None)
        if callable(set_server):
            set_server(self)

    def Start(self) -> None:  # pylint: disable=invalid-name
        """Starts serving and returns at once; does nothing if already started."""
        with self._lock:
            if self._state == _STOPPED:
                raise RuntimeError(f'courier server {self.address} was stopped; a stopped '
                                   f'server cannot be restarted, create a new one')
            if self._state == _STARTED:
                return
            self._calls = metrics.table(metrics.SERVER, self.address)
            self._serving = inflight.serving if inflight.enabled() else None
            self._transport.start()
            self._state = _STARTED

    def Stop(self, grace: Optional[float] = None) -> None:  # pylint: disable=invalid-name
        """Stops serving and releases the address and the methods it served (the objects they
        belong to can be freed while the server is still referenced); calls in flight are
        cancelled.

        Args:
          grace: Seconds to let calls in flight finish first (default: none).
        """
        with self._lock:
            if self._state == _STOPPED:
                return
            self._state = _STOPPED
        self._transport.stop(grace)
        with self._lock:
            self._methods = {}
        self._stopped.set()

    def Join(self) -> None:  # pylint: disable=invalid-name
        """Blocks until the server is stopped."""
        self._stopped.wait()

    def __repr__(self) -> str:
        named = f'{self.name!r}, ' if self.name is not None else ''
        return (f'courier.Server({named}{self.address!r}, {self._state}, '
                f'{len(self._methods)} methods)')

    def _method_names(self) -> List[str]:
        return sorted(self._methods)

    def _handle_call(self, method: str, pickle: memoryview, buffers: List[Any]
                     ) -> wire.Response:
        """Runs one call, counted in the server's metrics (methods it has, not typos)."""
        fn = self._methods.get(method)
        if fn is None:
            return wire.Response(wire.UNKNOWN_METHOD, methods=self._method_names(),
                                 message=f'no method {method!r}')
        started = metrics.clock()
        listed = self._serving
        if listed is None:
            response = self._run_call(method, fn, pickle, buffers)
        else:
            entry = (self, method, started, _get_ident())
            key = id(entry)
            listed[key] = entry
            try:
                response = self._run_call(method, fn, pickle, buffers)
            finally:
                del listed[key]
        self._calls.record(method, started, response.status != wire.OK)
        return response

    def _run_call(self, method: str, fn: Callable[..., Any], pickle: memoryview,
                  buffers: List[Any]) -> wire.Response:
        """Runs one call; every failure becomes an error response, never an exception."""
        try:
            value = serialization.loads(pickle, buffers, ('the arguments of', method))
            if (value.__class__ is not tuple or len(value) != 2  # (checked here: every call)
                    or value[0].__class__ is not tuple or value[1].__class__ is not dict):
                value = _unpack_arguments(method, value)  # Raises, saying why (or a subclass).
            args, kwargs = value
        except errors.SerializationError as error:
            return wire.Response(wire.SERIALIZATION_ERROR, message=str(error))
        try:
            result = fn(*args, **kwargs)
            if result.__class__ is _COROUTINE:  # (not subclassable: as isinstance, cheaper)
                result.close()
                raise TypeError(f'courier method {method!r} returned a coroutine: courier calls '
                                f'plain functions; bind a wrapper that runs it, e.g. with '
                                f'asyncio.run')
        except BaseException as error:  # pylint: disable=broad-except
            return _exception_response(method, error)
        try:  # a client that compresses its calls gets its results compressed too
            data, result_buffers = serialization.dumps(
                result, ('the result of', method),
                compress=serialization.is_compressed(pickle))
        except errors.SerializationError as error:
            return wire.Response(wire.SERIALIZATION_ERROR, message=str(error))
        return wire.Response(wire.OK, data, result_buffers)


def _unpack_arguments(method: str, value: Any):
    if (not isinstance(value, tuple) or len(value) != 2 or not isinstance(value[0], tuple)
            or not isinstance(value[1], dict)):
        raise errors.SerializationError(
            f'the arguments of {method!r} are not an (args, kwargs) pair: the caller is not '
            f'a courier client')
    return value


def _exception_response(method: str, error: BaseException) -> wire.Response:
    exception_type = serialization.type_name(error)
    try:
        message = f'{exception_type}: {error}'
    except Exception:  # pylint: disable=broad-except  (a broken __str__)
        message = exception_type
    # Start at the bound method: the frame calling it is courier's, not the user's.
    frames = error.__traceback__.tb_next if error.__traceback__ is not None else None
    remote_traceback = ''.join(traceback.format_exception(type(error), error, frames))
    _logger.debug('courier method %r raised %s', method, message)
    data, buffers = b'', []
    if isinstance(error, Exception):  # Never re-raise SystemExit & co. in the caller.
        try:
            data, buffers = serialization.dumps(error, f'the exception raised by {method!r}')
        except errors.SerializationError:
            pass  # The client raises courier.RemoteError from the text fields.
    return wire.Response(wire.EXCEPTION, data, buffers, message=message,
                         exception_type=exception_type, traceback=remote_traceback)
