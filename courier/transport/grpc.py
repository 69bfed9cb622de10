"""Courier calls over gRPC: between hosts (TCP), and on Unix sockets when TLS is asked for.

A call is one ``Call`` message, or a ``CallStream`` of chunks when its buffers are
large; a large result stays on the server until its client ``Fetch``es it in
chunks. Tokens travel as metadata and are checked by an interceptor. This is the
only courier module importing grpc, so that processes that only use the framed
transport never load it.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hmac
import itertools
import mmap
import os
import secrets
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import grpc

from courier import errors
from courier import security
from courier import wire
from courier.transport import _base
from courier.transport import keepalive


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


def _writable(buffers: Sequence[memoryview]) -> List[bytearray]:
    # Received bytes are immutable; a copy makes unpickled arrays writable, like local ones.
    return [bytearray(buffer) for buffer in buffers]


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


class GrpcClientTransport(_base.ClientTransport):
    """gRPC channel to one courier server (TCP or Unix socket)."""

    protocol = 'grpc'

    def __init__(self, address: str, endpoint: _base.Endpoint, *, auth_token: Optional[str],
                 tls: Optional[security.TLSConfig], wait_for_ready: bool):
        self.address = address
        self._wait_for_ready = wait_for_ready
        self._metadata = (((_AUTH_METADATA_KEY, _AUTH_SCHEME + auth_token),)
                          if auth_token else None)
        options = [*CHANNEL_OPTIONS, *keepalive.grpc_channel_options()]
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
        # Threads fetching large results of futures (made on demand) and the channel: closed
        # by close() or, for a transport dropped without it, by its finalizer.
        self._held = _Held(self._channel)
        self._release = weakref.finalize(self, self._held.close)

    def call(self, method, pickle, buffers, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        send, request = self._request(method, pickle, buffers)
        try:
            reply = send(request, timeout=timeout, metadata=self._metadata,
                         wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise self._translate(error, method, timeout) from None
        except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
            raise self._closed_error(method) from None
        response = _base.decode_response(reply, method, self.address)
        if response.result_id:
            self._fetch_result(method, response, deadline, timeout)
        return response

    def call_async(self, method, pickle, buffers, timeout, finish):
        deadline = None if timeout is None else time.monotonic() + timeout
        future = _base.CallFuture()
        try:
            send, request = self._request(method, pickle, buffers)
            rpc = send.future(request, timeout=timeout, metadata=self._metadata,
                              wait_for_ready=self._wait_for_ready)
        except errors.CourierError as error:
            future.fail(error)
            return future
        except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
            future.fail(self._closed_error(method))
            return future
        future.track(rpc.cancel)

        def on_done(rpc_future):
            if future.cancelled():
                return
            try:
                response = _base.decode_response(rpc_future.result(), method, self.address)
            except grpc.RpcError as error:
                future.fail(self._translate(error, method, timeout))
                return
            except BaseException as error:  # pylint: disable=broad-except
                future.fail(error)
                return
            if not response.result_id:
                future.resolve(finish, response)
                return

            def fetch_and_finish(response):
                self._fetch_result(method, response, deadline, timeout, track=future.track)
                return finish(response)

            # Fetching blocks; gRPC's callback thread must not.
            try:
                self._held.fetchers().submit(future.resolve, fetch_and_finish, response)
            except RuntimeError:  # Closed meanwhile: the pool takes no more work.
                future.fail(self._closed_error(method))

        rpc.add_done_callback(on_done)
        return future

    def _request(self, method: str, pickle: bytes, buffers: Sequence[memoryview]):
        """Returns the gRPC call to make and its request: one message, or a stream."""
        _base.encode_method(method, self.address)  # Raises the courier error if it cannot go.
        if self._held.closed:
            raise self._closed_error(method)
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
            track(stream.cancel)
        try:
            response.buffers = _assemble(response.buffer_sizes, iter(stream))
        except grpc.RpcError as error:
            raise self._translate(error, method, timeout) from None
        except ValueError as error:
            raise errors.ProtocolError(f'malformed result of {method!r} from courier server '
                                       f'{self.address}: {error}') from None

    def list_methods(self, timeout):
        method = _base.LIST_METHODS
        if self._held.closed:
            raise self._closed_error(method)
        try:
            reply = self._list_methods(b'', timeout=timeout, metadata=self._metadata,
                                       wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise self._translate(error, method, timeout) from None
        except ValueError:  # gRPC's "Cannot invoke RPC on closed channel!"
            raise self._closed_error(method) from None
        return _base.decode_method_list(reply, self.address)

    def close(self):
        self._release()

    def _closed_error(self, method: str) -> errors.CourierError:
        return _base.closed(method, self.address)

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
        address = self.address
        if code == codes.DEADLINE_EXCEEDED:
            if self._wait_for_ready and not self._connected():
                return _base.unreachable_timeout(method, address, timeout)
            return _base.call_timeout(method, address, timeout)
        if code == codes.UNAVAILABLE:
            return _base.unavailable(method, address, details, self._wait_for_ready)
        if code in (codes.UNAUTHENTICATED, codes.PERMISSION_DENIED):
            return _base.refused(method, address, details)
        if code == codes.CANCELLED and self._held.closed:
            return self._closed_error(method)
        if code == codes.CANCELLED:
            return _base.call_error(errors.ServerUnavailableError, method, address,
                                    f'was cancelled: {details}')
        if code == codes.UNIMPLEMENTED:
            return _base.call_error(errors.ProtocolError, method, address,
                                    f'failed: {address} does not serve the courier protocol '
                                    f'({details})')
        if code == codes.INVALID_ARGUMENT:
            return _base.rejected_as_malformed(method, address, details)
        return _base.call_error(errors.RemoteError, method, address,
                                f'failed with gRPC status {code.name}: {details}')


class _Held:
    """A client transport's channel and fetching threads, closed apart from the transport.

    The finalizer of a transport dropped without ``close()`` holds this, not the transport.
    """

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.closed = False
        self._fetchers: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def fetchers(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads fetching large results of futures (gRPC's callback thread must not).

        Raises:
          RuntimeError: closed.
        """
        with self._lock:
            if self.closed:
                raise RuntimeError('closed')
            if self._fetchers is None:
                self._fetchers = concurrent.futures.ThreadPoolExecutor(
                    max_workers=16, thread_name_prefix='courier-fetch')
            return self._fetchers

    def close(self) -> None:
        with self._lock:
            self.closed = True
            fetchers, self._fetchers = self._fetchers, None
        self.channel.close()
        if fetchers is not None:
            fetchers.shutdown(wait=False)


class GrpcServerTransport(_base.ServerTransport):
    """gRPC server on one address, running calls in a thread pool."""

    def __init__(self, address: str, endpoint: _base.Endpoint, handle_call: _base.HandleCall,
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

    def _bind(self, address: str, endpoint: _base.Endpoint,
              tls: Optional[security.TLSConfig]) -> str:
        if endpoint.kind == 'unix':
            # Absolute, so that the address means the same in a process with another cwd.
            endpoint = _base.Endpoint('unix', path=os.path.abspath(endpoint.path))
            _base.check_unix_path_free(endpoint.path)
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
            return _base.UNIX_PREFIX + endpoint.path
        return _base.tcp_address(_base.connectable_host(endpoint.host), port)

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
            decoded = wire.decode_call_stream_start(header)
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
        self._refuse_missing = _refusals(_base.NO_TOKEN)
        self._refuse_wrong = _refusals(_base.WRONG_TOKEN)

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
