"""Maps an address to the transport that carries courier calls to it.

This module is the single place that knows how bytes move: ``host:port``
addresses use gRPC over TCP and ``unix:/path`` addresses use gRPC over a Unix
domain socket. Clients talk to the small :class:`ClientTransport` interface and
servers hand :func:`listen` two plain callables, so a faster transport can be
added here without touching either. It is also the only module importing grpc;
the rest of courier imports it lazily so that ``import courier`` stays fast.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import errno
import hmac
import ipaddress
import os
import socket
from typing import Any, Callable, List, Optional, Sequence

import grpc

from courier import errors
from courier import security
from courier import wire

SERVICE = 'courier.Courier'
CALL = f'/{SERVICE}/Call'
LIST_METHODS = f'/{SERVICE}/ListMethods'

_AUTH_METADATA_KEY = 'authorization'
_AUTH_SCHEME = 'Bearer '
_UNIX_PREFIX = 'unix:'
_MAX_UNIX_PATH_BYTES = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux.
_WILDCARD_HOSTS = ('', '0.0.0.0', '::', '[::]')

# No gRPC message-size limit: courier carries whatever the caller passes.
MESSAGE_SIZE_OPTIONS = (
    ('grpc.max_send_message_length', -1),
    ('grpc.max_receive_message_length', -1),
)
CHANNEL_OPTIONS = MESSAGE_SIZE_OPTIONS + (
    # Calls between a program's processes must not detour through an HTTP proxy.
    ('grpc.enable_http_proxy', 0),
)
SERVER_OPTIONS = MESSAGE_SIZE_OPTIONS + (
    # Binding a port another server holds must fail, not silently share it.
    ('grpc.so_reuseport', 0),
)

HandleCall = Callable[[str, memoryview, List[bytearray]], wire.Response]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A parsed address: ``kind`` is 'tcp' (with host, port) or 'unix' (with path)."""

    kind: str
    host: str = ''
    port: int = 0
    path: str = ''

    @property
    def is_local(self) -> bool:
        """Whether only this machine can connect (Unix socket or loopback host)."""
        if self.kind == 'unix' or self.host == 'localhost':
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def grpc_target(self) -> str:
        if self.kind == 'unix':
            return _UNIX_PREFIX + self.path
        return tcp_address(self.host, self.port)


def parse_address(address: str) -> Endpoint:
    """Parses ``'host:port'``, ``'[ipv6]:port'`` or ``'unix:/path'``.

    Raises:
      ValueError: the address has neither form.
    """
    if not isinstance(address, str):
        raise TypeError(f'a courier address must be a str, got {type(address).__name__}')
    if address.startswith(_UNIX_PREFIX):
        path = address[len(_UNIX_PREFIX):]
        if path.startswith('//'):  # gRPC's 'unix:///abs/path' spelling.
            path = path[2:]
        if not path:
            raise ValueError(f'courier address {address!r} has no socket path; '
                             f"use 'unix:/path/to/socket'")
        return Endpoint('unix', path=path)
    host, sep, port = address.rpartition(':')
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"courier address {address!r} is not 'host:port' or 'unix:/path'")
    if host.startswith('[') and host.endswith(']'):
        host = host[1:-1]
    return Endpoint('tcp', host=host, port=int(port))


class ClientTransport(abc.ABC):
    """Carries calls from a client to one server address."""

    address: str

    @abc.abstractmethod
    def call(self, method: str, pickle: bytes, buffers: Sequence[memoryview],
             timeout: Optional[float]) -> wire.Response:
        """Calls ``method`` and returns the server's response.

        Raises:
          errors.CourierError: the call did not reach the server or no response
            came back (timeout, server unavailable, permission denied, ...).
        """

    @abc.abstractmethod
    def call_async(self, method: str, pickle: bytes, buffers: Sequence[memoryview],
                   timeout: Optional[float],
                   finish: Callable[[wire.Response], Any]) -> concurrent.futures.Future:
        """Starts a call; the returned future resolves to ``finish(response)``.

        Cancelling the future cancels the call.
        """

    @abc.abstractmethod
    def list_methods(self, timeout: Optional[float]) -> List[str]:
        """Returns the names of the methods bound on the server."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases the connection; calls in flight fail."""


class ServerTransport(abc.ABC):
    """Accepts calls on one address and hands them to the server's callables."""

    address: str

    @abc.abstractmethod
    def start(self) -> None:
        """Starts accepting calls."""

    @abc.abstractmethod
    def stop(self, grace: Optional[float]) -> None:
        """Stops accepting calls, waits up to ``grace`` seconds for calls in flight."""


def connect(address: str, *, auth_token: Optional[str] = None,
            tls: Optional[security.TLSConfig] = None,
            wait_for_ready: bool = True) -> ClientTransport:
    """Returns a transport that calls the server at ``address``."""
    return _GrpcClientTransport(address, parse_address(address), auth_token=auth_token,
                                tls=tls, wait_for_ready=wait_for_ready)


def listen(address: str, handle_call: HandleCall, list_methods: Callable[[], List[str]],
           *, thread_pool_size: int, auth_token: Optional[str] = None,
           tls: Optional[security.TLSConfig] = None) -> ServerTransport:
    """Binds ``address`` (port 0 picks a free port) and returns the unstarted transport.

    ``handle_call(method, pickle, buffers)`` runs in one of ``thread_pool_size``
    threads per call; the buffers it receives are writable and its own.

    Raises:
      OSError: the address cannot be bound (e.g. it is in use).
    """
    return _GrpcServerTransport(address, parse_address(address), handle_call, list_methods,
                                thread_pool_size=thread_pool_size, auth_token=auth_token,
                                tls=tls)


def tcp_address(host: str, port: int) -> str:
    """Returns the ``host:port`` address, bracketing IPv6 hosts."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def _writable(buffers: Sequence[memoryview]) -> List[bytearray]:
    # Received bytes are immutable; a copy makes unpickled arrays writable, like local ones.
    return [bytearray(buffer) for buffer in buffers]


def _decode_response(reply: bytes, address: str) -> wire.Response:
    try:
        response = wire.decode_response(reply)
    except ValueError as error:
        raise errors.ProtocolError(
            f'malformed response from courier server {address}: {error}') from None
    response.buffers = _writable(response.buffers)
    return response


class _CallFuture(concurrent.futures.Future):
    """A future whose cancellation also cancels the underlying gRPC call."""

    def __init__(self):
        super().__init__()
        self._rpc = None

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        if self._rpc is not None:
            self._rpc.cancel()
        return True

    def _resolve(self, compute: Callable[[], Any]) -> None:
        try:
            result = compute()
        except BaseException as error:  # pylint: disable=broad-except
            try:
                self.set_exception(error)
            except concurrent.futures.InvalidStateError:  # Cancelled meanwhile.
                pass
        else:
            try:
                self.set_result(result)
            except concurrent.futures.InvalidStateError:
                pass


class _GrpcClientTransport(ClientTransport):
    """gRPC channel to one courier server (TCP or Unix socket)."""

    def __init__(self, address: str, endpoint: Endpoint, *, auth_token: Optional[str],
                 tls: Optional[security.TLSConfig], wait_for_ready: bool):
        self.address = address
        self._wait_for_ready = wait_for_ready
        self._metadata = (((_AUTH_METADATA_KEY, _AUTH_SCHEME + auth_token),)
                          if auth_token else None)
        options = list(CHANNEL_OPTIONS)
        if tls is None:
            self._channel = grpc.insecure_channel(endpoint.grpc_target, options=options)
        else:
            if tls.server_name:
                options.append(('grpc.ssl_target_name_override', tls.server_name))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.root_certificates, private_key=tls.private_key,
                certificate_chain=tls.certificate_chain)
            self._channel = grpc.secure_channel(endpoint.grpc_target, credentials,
                                                options=options)
        self._call = self._channel.unary_unary(CALL, _registered_method=True)
        self._list_methods = self._channel.unary_unary(LIST_METHODS, _registered_method=True)

    def call(self, method, pickle, buffers, timeout):
        request = wire.encode_request(method, pickle, buffers)
        try:
            reply = self._call(request, timeout=timeout, metadata=self._metadata,
                               wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise self._translate(error, method, timeout) from None
        return _decode_response(reply, self.address)

    def call_async(self, method, pickle, buffers, timeout, finish):
        request = wire.encode_request(method, pickle, buffers)
        future = _CallFuture()
        rpc = self._call.future(request, timeout=timeout, metadata=self._metadata,
                                wait_for_ready=self._wait_for_ready)
        future._rpc = rpc  # pylint: disable=protected-access

        def on_done(rpc_future):
            if future.cancelled():
                return

            def outcome():
                try:
                    reply = rpc_future.result()
                except grpc.RpcError as error:
                    raise self._translate(error, method, timeout) from None
                return finish(_decode_response(reply, self.address))

            future._resolve(outcome)  # pylint: disable=protected-access

        rpc.add_done_callback(on_done)
        return future

    def list_methods(self, timeout):
        try:
            reply = self._list_methods(b'', timeout=timeout, metadata=self._metadata,
                                       wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise self._translate(error, 'ListMethods', timeout) from None
        try:
            return wire.decode_method_list(reply)
        except ValueError as error:
            raise errors.ProtocolError(
                f'malformed method list from courier server {self.address}: {error}') from None

    def close(self):
        self._channel.close()

    def _connected(self) -> bool:
        try:
            state = self._channel._channel.check_connectivity_state(False)  # pylint: disable=protected-access
        except AttributeError:  # Private gRPC API changed: assume the server was up.
            return True
        return state == 2  # grpc_connectivity_state GRPC_CHANNEL_READY

    def _translate(self, error, method: str, timeout: Optional[float]) -> errors.CourierError:
        """Returns the courier error for a failed gRPC call."""
        codes = grpc.StatusCode
        code = error.code()
        details = error.details() or code.name
        call = f'call to {method!r} on courier server {self.address}'
        if code == codes.DEADLINE_EXCEEDED:
            after = f' after {timeout:g}s' if timeout is not None else ''
            if self._wait_for_ready and not self._connected():
                return errors.ServerUnreachableTimeoutError(
                    f'{call} timed out{after}: the server was not reachable '
                    f'(wait_for_ready=True waited for it to come up). Is it running, and '
                    f'is the address right?')
            return errors.CallTimeoutError(
                f'{call} timed out{after} (call_timeout); '
                f'pass a larger call_timeout if the method needs longer')
        if code == codes.UNAVAILABLE:
            hint = ('' if self._wait_for_ready else
                    ' Is it running? Pass wait_for_ready=True to wait for it to come up.')
            return errors.ServerUnavailableError(
                f'{call} failed: the server is unavailable ({details}).{hint}')
        if code in (codes.UNAUTHENTICATED, codes.PERMISSION_DENIED):
            return errors.PermissionDeniedError(f'{call} was refused: {details}')
        if code == codes.CANCELLED:
            return errors.ServerUnavailableError(f'{call} was cancelled: {details}')
        if code == codes.UNIMPLEMENTED:
            return errors.ProtocolError(
                f'{call} failed: {self.address} does not serve the courier protocol '
                f'({details})')
        if code == codes.INVALID_ARGUMENT:
            return errors.ProtocolError(f'{call} was rejected as malformed: {details}')
        return errors.RemoteError(f'{call} failed with gRPC status {code.name}: {details}')


class _GrpcServerTransport(ServerTransport):
    """gRPC server on one address, running calls in a thread pool."""

    def __init__(self, address: str, endpoint: Endpoint, handle_call: HandleCall,
                 list_methods: Callable[[], List[str]], *, thread_pool_size: int,
                 auth_token: Optional[str], tls: Optional[security.TLSConfig]):
        if tls is not None and tls.certificate_chain is None:
            raise ValueError('a TLS server needs TLSConfig(certificate_chain=..., '
                             'private_key=...)')
        self._handle_call = handle_call
        self._list_methods = list_methods
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=thread_pool_size, thread_name_prefix='courier-server')
        interceptors = [_TokenCheck(auth_token)] if auth_token else None
        self._server = grpc.server(self._executor, interceptors=interceptors,
                                   options=SERVER_OPTIONS)
        self._server.add_registered_method_handlers(SERVICE, {
            'Call': grpc.unary_unary_rpc_method_handler(self._call),
            'ListMethods': grpc.unary_unary_rpc_method_handler(self._list),
        })
        self._unix_path = None
        self._started = False
        try:
            self.address = self._bind(address, endpoint, tls)
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    def _bind(self, address: str, endpoint: Endpoint,
              tls: Optional[security.TLSConfig]) -> str:
        if endpoint.kind == 'unix':
            # Absolute, so that the address means the same in a process with another cwd.
            endpoint = Endpoint('unix', path=os.path.abspath(endpoint.path))
            _check_unix_path_free(endpoint.path)
        if tls is None:
            add_port = self._server.add_insecure_port
            args = ()
        else:
            add_port = self._server.add_secure_port
            args = (grpc.ssl_server_credentials(
                [(tls.private_key, tls.certificate_chain)],
                root_certificates=tls.root_certificates,
                require_client_auth=tls.root_certificates is not None),)
        try:
            port = add_port(endpoint.grpc_target, *args)
        except RuntimeError:
            port = 0
        if not port:
            raise OSError(errno.EADDRINUSE,
                          f'courier server cannot bind {address!r}: the address is in use or '
                          f'not available on this machine')
        if endpoint.kind == 'unix':
            self._unix_path = endpoint.path
            return _UNIX_PREFIX + endpoint.path
        return tcp_address(_connectable_host(endpoint.host), port)

    def start(self):
        self._server.start()
        self._started = True

    def stop(self, grace):
        if not self._started:
            # gRPC only closes the listening socket of a server that was started.
            self._server.start()
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._unix_path is not None:
            try:
                os.unlink(self._unix_path)
            except FileNotFoundError:  # gRPC usually removes it itself.
                pass

    def _call(self, request: bytes, context) -> bytes:
        try:
            method, pickle, buffers = wire.decode_request(request)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f'malformed courier CallRequest: {error}')
        return wire.encode_response(self._handle_call(method, pickle, _writable(buffers)))

    def _list(self, request: bytes, context) -> bytes:
        del request, context  # ListMethodsRequest has no fields.
        return wire.encode_method_list(self._list_methods())


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses calls that lack the server's auth token."""

    def __init__(self, token: str):
        self._expected = (_AUTH_SCHEME + token).encode()

        def refuse(reason: str):
            def abort(request, context):
                del request
                context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
            return grpc.unary_unary_rpc_method_handler(abort)

        self._refuse_missing = refuse(
            'the server requires an auth token and the call carried none; pass '
            f'auth_token= to courier.Client or set {security.AUTH_TOKEN_ENV}')
        self._refuse_wrong = refuse(
            'the call carried the wrong auth token; client and server must use the same '
            f'auth_token (or {security.AUTH_TOKEN_ENV})')

    def intercept_service(self, continuation, handler_call_details):
        for key, value in handler_call_details.invocation_metadata or ():
            if key == _AUTH_METADATA_KEY:
                if isinstance(value, str):
                    value = value.encode()
                if hmac.compare_digest(value, self._expected):
                    return continuation(handler_call_details)
                return self._refuse_wrong
        return self._refuse_missing


def _check_unix_path_free(path: str) -> None:
    """Refuses a socket path that is too long or where a live server listens.

    gRPC would silently unlink a live server's socket and take over its path.
    """
    if len(os.fsencode(path)) > _MAX_UNIX_PATH_BYTES:
        raise OSError(errno.ENAMETOOLONG,
                      f'unix socket path {path!r} is longer than {_MAX_UNIX_PATH_BYTES} '
                      f'bytes; use a shorter path')
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return  # Stale socket file; gRPC replaces it.
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f'another server is listening on unix socket {path!r}')


def _connectable_host(host: str) -> str:
    """Returns the host clients should dial for a server bound on ``host``."""
    if host not in _WILDCARD_HOSTS:
        return host
    # Bound on every interface: name the machine so that other hosts can connect too.
    hostname = socket.gethostname()
    try:
        socket.getaddrinfo(hostname, None)
    except OSError:
        return '127.0.0.1'
    return hostname

