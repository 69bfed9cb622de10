"""Maps an address to the transport that carries courier calls to it.

This module is the single place that knows how bytes move: ``host:port``
addresses use gRPC over TCP, and ``unix:/path`` addresses use courier's own
same-host protocol (:mod:`courier.transport.framed`), which also serves clients in
the server's own process without a socket. With TLS, ``unix:`` addresses use
gRPC over the Unix socket instead. Clients talk to the small :class:`ClientTransport` interface and
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
import itertools
import mmap
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import grpc

from courier import errors
from courier import security
from courier import wire

SERVICE = 'courier.Courier'
CALL = f'/{SERVICE}/Call'
CALL_STREAM = f'/{SERVICE}/CallStream'
FETCH = f'/{SERVICE}/Fetch'
LIST_METHODS = f'/{SERVICE}/ListMethods'

# Buffers adding up to this many bytes travel as a stream of chunks rather than inside one
# message: gRPC moves one huge message several times slower, and copies it whole.
STREAM_THRESHOLD = 4 << 20
CHUNK_SIZE = 1 << 20
# Seconds a large result waits on the server for its client to fetch it (then it is dropped,
# so a client that died does not pin the memory). Generous: busy clients fetch late.
RESULT_TTL = 300.0

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
    # Retry connecting to a server that is not up yet at least every second: by default the
    # wait grows to two minutes, so a client noticed a late server long after it started.
    ('grpc.initial_reconnect_backoff_ms', 100),
    ('grpc.min_reconnect_backoff_ms', 100),
    ('grpc.max_reconnect_backoff_ms', 1000),
)
SERVER_OPTIONS = MESSAGE_SIZE_OPTIONS + (
    # Binding a port another server holds must fail, not silently share it.
    ('grpc.so_reuseport', 0),
)

# handle_call(method, pickle, buffers): the buffers are writable and owned by the call.
HandleCall = Callable[[str, memoryview, List[Any]], wire.Response]


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
    endpoint = parse_address(address)
    if endpoint.kind == 'unix' and tls is None:
        from courier.transport import framed  # pylint: disable=import-outside-toplevel
        return framed.connect(address, endpoint.path, auth_token=auth_token,
                              wait_for_ready=wait_for_ready)
    return _GrpcClientTransport(address, endpoint, auth_token=auth_token,
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
    endpoint = parse_address(address)
    if endpoint.kind == 'unix' and tls is None:
        from courier.transport import framed  # pylint: disable=import-outside-toplevel
        return framed.listen(endpoint.path, handle_call, list_methods,
                             thread_pool_size=thread_pool_size, auth_token=auth_token)
    return _GrpcServerTransport(address, endpoint, handle_call, list_methods,
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


def _streams(buffers: Sequence[memoryview]) -> bool:
    return sum(buffer.nbytes for buffer in buffers) >= STREAM_THRESHOLD


def _chunk_messages(buffers: Sequence[memoryview]) -> Iterator[bytes]:
    """Yields ``Chunk`` messages carrying ``buffers`` in order, one chunk at a time."""
    for buffer in buffers:
        for start in range(0, buffer.nbytes, CHUNK_SIZE):
            yield wire.encode_chunk(buffer[start:start + CHUNK_SIZE])


def _assemble(sizes: Sequence[int], messages: Iterator[bytes]) -> List[Any]:
    """Reassembles buffers of the announced ``sizes`` from ``Chunk`` messages.

    Buffers are anonymous memory maps: writable, and only memory that data was
    actually written to is used, so a bogus size cannot exhaust memory.

    Raises:
      ValueError: the chunks do not add up to the announced sizes.
    """
    buffers: List[Any] = []
    for size in sizes:
        if size == 0:
            buffers.append(bytearray())
            continue
        try:
            buffer = mmap.mmap(-1, size)
        except (OSError, OverflowError, ValueError) as error:
            raise ValueError(f'cannot allocate a buffer of {size} bytes: {error}') from None
        filled = 0
        while filled < size:
            message = next(messages, None)
            if message is None:
                raise ValueError(f'the stream ended {size - filled} bytes short of a buffer')
            data = wire.decode_chunk(message)
            if filled + len(data) > size:
                raise ValueError(f'a chunk overflows its {size}-byte buffer')
            buffer[filled:filled + len(data)] = data
            filled += len(data)
        buffers.append(buffer)
    if next(messages, None) is not None:
        raise ValueError('the stream holds more chunks than its buffers need')
    return buffers


def _remaining(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


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

    def _track(self, rpc) -> None:
        """Makes cancelling this future cancel ``rpc`` (the call's current gRPC call)."""
        self._rpc = rpc
        if self.cancelled():
            rpc.cancel()

    def _resolve(self, compute: Callable[[], Any]) -> None:
        """Completes the future with what ``compute`` returns or raises."""
        try:
            result = compute()
        except BaseException as error:  # pylint: disable=broad-except
            self._fail(error)
        else:
            try:
                self.set_result(result)
            except concurrent.futures.InvalidStateError:  # Cancelled meanwhile.
                pass

    def _fail(self, error: BaseException) -> None:
        try:
            self.set_exception(error)
        except concurrent.futures.InvalidStateError:  # Cancelled meanwhile.
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
        self._call_stream = self._channel.stream_unary(CALL_STREAM, _registered_method=True)
        self._fetch = self._channel.unary_stream(FETCH, _registered_method=True)
        self._list_methods = self._channel.unary_unary(LIST_METHODS, _registered_method=True)
        self._fetchers = None  # Threads fetching large results of futures, made on demand.
        self._fetchers_lock = threading.Lock()

    def call(self, method, pickle, buffers, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        send, request = self._request(method, pickle, buffers)
        try:
            reply = send(request, timeout=timeout, metadata=self._metadata,
                         wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise self._translate(error, method, timeout) from None
        response = _decode_response(reply, self.address)
        if response.result_id:
            self._fetch_result(method, response, deadline, timeout)
        return response

    def call_async(self, method, pickle, buffers, timeout, finish):
        deadline = None if timeout is None else time.monotonic() + timeout
        send, request = self._request(method, pickle, buffers)
        future = _CallFuture()
        future._track(send.future(  # pylint: disable=protected-access
            request, timeout=timeout, metadata=self._metadata,
            wait_for_ready=self._wait_for_ready))

        def on_done(rpc_future):
            if future.cancelled():
                return
            try:
                response = _decode_response(rpc_future.result(), self.address)
            except grpc.RpcError as error:
                future._fail(self._translate(error, method, timeout))  # pylint: disable=protected-access
                return
            except BaseException as error:  # pylint: disable=broad-except
                future._fail(error)  # pylint: disable=protected-access
                return
            if not response.result_id:
                future._resolve(lambda: finish(response))  # pylint: disable=protected-access
                return

            def fetch_and_finish():
                self._fetch_result(method, response, deadline, timeout,
                                   track=future._track)  # pylint: disable=protected-access
                return finish(response)

            # Fetching blocks; gRPC's callback thread must not.
            self._fetcher_pool().submit(
                future._resolve, fetch_and_finish)  # pylint: disable=protected-access

        future._rpc.add_done_callback(on_done)  # pylint: disable=protected-access
        return future

    def _request(self, method: str, pickle: bytes, buffers: Sequence[memoryview]):
        """Returns the gRPC call to make and its request: one message, or a stream."""
        if not _streams(buffers):
            return self._call, wire.encode_request(method, pickle, buffers)
        header = wire.encode_request(method, pickle,
                                     buffer_sizes=[buffer.nbytes for buffer in buffers])
        return self._call_stream, itertools.chain((header,), _chunk_messages(buffers))

    def _fetch_result(self, method: str, response: wire.Response, deadline: Optional[float],
                      timeout: Optional[float], track: Optional[Callable] = None) -> None:
        """Streams the buffers of a large result into ``response.buffers``."""
        stream = self._fetch(wire.encode_fetch_request(response.result_id),
                             timeout=_remaining(deadline), metadata=self._metadata,
                             wait_for_ready=self._wait_for_ready)
        if track is not None:
            track(stream)
        try:
            response.buffers = _assemble(response.buffer_sizes, iter(stream))
        except grpc.RpcError as error:
            raise self._translate(error, method, timeout) from None
        except ValueError as error:
            raise errors.ProtocolError(f'malformed result of {method!r} from courier server '
                                       f'{self.address}: {error}') from None

    def _fetcher_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._fetchers_lock:
            if self._fetchers is None:
                self._fetchers = concurrent.futures.ThreadPoolExecutor(
                    max_workers=16, thread_name_prefix='courier-fetch')
            return self._fetchers

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
        if self._fetchers is not None:
            self._fetchers.shutdown(wait=False)

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
            'CallStream': grpc.stream_unary_rpc_method_handler(self._call_stream),
            'Fetch': grpc.unary_stream_rpc_method_handler(self._fetch),
            'ListMethods': grpc.unary_unary_rpc_method_handler(self._list),
        })
        # Large results waiting to be fetched: result id -> (buffers, expiry timer).
        self._results: Dict[int, Tuple[Sequence[memoryview], threading.Timer]] = {}
        self._results_lock = threading.Lock()
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
        with self._results_lock:
            results, self._results = self._results, {}
        for _, timer in results.values():
            timer.cancel()
        if self._unix_path is not None:
            try:
                os.unlink(self._unix_path)
            except FileNotFoundError:  # gRPC usually removes it itself.
                pass

    def _call(self, request: bytes, context) -> bytes:
        try:
            decoded = wire.decode_request(request)
            if decoded.buffer_sizes:
                raise ValueError('buffer_sizes are only for CallStream')
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f'malformed courier CallRequest: {error}')
        return self._reply(self._handle_call(decoded.method, decoded.pickle,
                                             _writable(decoded.buffers)))

    def _call_stream(self, messages: Iterator[bytes], context) -> bytes:
        try:
            header = next(messages, None)
            if header is None:
                raise ValueError('the stream is empty')
            decoded = wire.decode_request(header)
            if decoded.buffers:
                raise ValueError('its first message must announce buffer_sizes, not carry buffers')
            buffers = _assemble(decoded.buffer_sizes, messages)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f'malformed courier CallStream: {error}')
        return self._reply(self._handle_call(decoded.method, decoded.pickle, buffers))

    def _reply(self, response: wire.Response) -> bytes:
        """Encodes ``response``; a large result's buffers stay here, to be fetched."""
        if _streams(response.buffers):
            result_id = secrets.randbits(63) or 1  # Unguessable: only its caller fetches it.
            expiry = threading.Timer(RESULT_TTL, self._drop_result, (result_id,))
            expiry.daemon = True
            with self._results_lock:
                self._results[result_id] = (response.buffers, expiry)
            expiry.start()
            response.buffer_sizes = [buffer.nbytes for buffer in response.buffers]
            response.buffers = ()
            response.result_id = result_id
        return wire.encode_response(response)

    def _drop_result(self, result_id: int) -> None:
        with self._results_lock:
            self._results.pop(result_id, None)

    def _fetch(self, request: bytes, context) -> Iterator[bytes]:
        try:
            result_id = wire.decode_fetch_request(request)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f'malformed courier FetchRequest: {error}')
        with self._results_lock:
            entry = self._results.pop(result_id, None)
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f'no result {result_id} to fetch: it was fetched already, or not '
                          f'within {RESULT_TTL:g}s')
        buffers, expiry = entry
        expiry.cancel()
        yield from _chunk_messages(buffers)

    def _list(self, request: bytes, context) -> bytes:
        del request, context  # ListMethodsRequest has no fields.
        return wire.encode_method_list(self._list_methods())


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses calls that lack the server's auth token."""

    def __init__(self, token: str):
        self._expected = (_AUTH_SCHEME + token).encode()
        self._refuse_missing = _refusals(
            'the server requires an auth token and the call carried none; pass '
            f'auth_token= to courier.Client or set {security.AUTH_TOKEN_ENV}')
        self._refuse_wrong = _refusals(
            'the call carried the wrong auth token; client and server must use the same '
            f'auth_token (or {security.AUTH_TOKEN_ENV})')

    def intercept_service(self, continuation, handler_call_details):
        refusals = self._refuse_missing
        for key, value in handler_call_details.invocation_metadata or ():
            if key == _AUTH_METADATA_KEY:
                if isinstance(value, str):
                    value = value.encode()
                if hmac.compare_digest(value, self._expected):
                    return continuation(handler_call_details)
                refusals = self._refuse_wrong
                break
        return refusals.get(handler_call_details.method, refusals[CALL])


def _refusals(reason: str) -> Dict[str, Any]:
    """Returns, per courier RPC, a handler of its kind that refuses the call."""

    def refuse(request, context):
        del request
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    def refuse_streaming(request, context):
        refuse(request, context)
        yield  # pylint: disable=unreachable  (makes this a generator, as Fetch needs)

    return {CALL: grpc.unary_unary_rpc_method_handler(refuse),
            CALL_STREAM: grpc.stream_unary_rpc_method_handler(refuse),
            FETCH: grpc.unary_stream_rpc_method_handler(refuse_streaming),
            LIST_METHODS: grpc.unary_unary_rpc_method_handler(refuse)}


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

