"""Maps an address to the transport that carries courier calls to it.

Courier's own framed protocol (:mod:`.framed_client`, :mod:`.framed_server`) carries
every call it can: on ``unix:/path`` addresses (where it also serves clients in the
server's own process without a socket) and on TCP ``host:port`` addresses, with TLS if
asked for. A TCP server owns one port for two protocols: courier's clients speak the
framed protocol there, and gRPC clients (any language, from ``protos/courier.proto``)
are told by their first bytes or TLS's ALPN and relayed to the server's gRPC service
(:mod:`.grpc`), which listens on a private Unix socket and is started when the first
gRPC client comes. A TCP client tries the framed protocol first and calls over gRPC a
server that turns out to speak only gRPC (an older courier, dm-launchpad's C++ one).
A ``unix:`` address with TLS is served over gRPC, as before.

Clients talk to the small :class:`ClientTransport` interface and servers hand
:func:`listen` two plain callables, so a transport can be added here without touching
either. A transport's module is imported on first use: grpc is loaded only by processes
that call or serve gRPC.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional

from courier import security
from courier.transport._base import (CallFuture, ClientTransport, Endpoint, HandleCall,
                                     NotFramedError, ServerTransport, parse_address, tcp_address)

__all__ = ['ClientTransport', 'Endpoint', 'HandleCall', 'ServerTransport', 'connect', 'listen',
           'parse_address', 'tcp_address']

# Whether TCP clients try courier's framed protocol first ('framed'), or speak gRPC only
# ('grpc': what the tests and benchmarks set to measure the gRPC service).
tcp_protocol = 'framed'


def connect(address: str, *, auth_token: Optional[str] = None,
            tls: Optional[security.TLSConfig] = None,
            wait_for_ready: bool = True) -> ClientTransport:
    """Returns a transport that calls the server at ``address``."""
    endpoint = parse_address(address)
    if endpoint.kind == 'unix' and tls is not None or (
            endpoint.kind == 'tcp' and tcp_protocol == 'grpc'):
        return _grpc_client(address, endpoint, auth_token, tls, wait_for_ready)
    from courier.transport import framed_client  # pylint: disable=import-outside-toplevel
    framed = framed_client.connect(address, endpoint, auth_token=auth_token,
                                   wait_for_ready=wait_for_ready, tls=tls)
    if endpoint.kind == 'unix':
        return framed
    return _EitherProtocol(framed, lambda: _grpc_client(address, endpoint, auth_token, tls,
                                                        wait_for_ready))


def listen(address: str, handle_call: HandleCall, list_methods: Callable[[], List[str]],
           *, thread_pool_size: int, auth_token: Optional[str] = None,
           tls: Optional[security.TLSConfig] = None,
           limits: Optional[Dict[str, Any]] = None) -> ServerTransport:
    """Binds ``address`` (port 0 picks a free port) and returns the unstarted transport.

    ``handle_call(method, pickle, buffers)`` runs in one of ``thread_pool_size``
    threads per call; the buffers it receives are writable and its own. ``limits`` are
    :class:`courier.transport.limits.ServerLimits` fields (None: from the environment).

    Raises:
      OSError: the address cannot be bound (e.g. it is in use).
      ValueError: a limit or the TLS configuration is unusable.
    """
    endpoint = parse_address(address)
    limits = {name: value for name, value in (limits or {}).items() if value is not None}
    if endpoint.kind == 'unix' and tls is not None:
        if limits:
            raise ValueError(f'{", ".join(sorted(limits))}: a unix: server with TLS serves gRPC, '
                             f'which has none of these limits; leave them out, or serve without '
                             f'TLS (a Unix socket is private to its machine)')
        from courier.transport import grpc  # pylint: disable=import-outside-toplevel
        return grpc.GrpcServerTransport(address, endpoint, handle_call, list_methods,
                                        thread_pool_size=thread_pool_size,
                                        auth_token=auth_token, tls=tls)
    from courier.transport import framed_server  # pylint: disable=import-outside-toplevel
    from courier.transport.limits import ServerLimits  # pylint: disable=import-outside-toplevel
    server_limits = ServerLimits(**limits)
    if endpoint.kind == 'unix':
        return framed_server.listen(endpoint.path, handle_call, list_methods,
                                    thread_pool_size=thread_pool_size, auth_token=auth_token,
                                    limits=server_limits)
    service = _GrpcService(handle_call, list_methods, thread_pool_size, auth_token)
    framed = framed_server.listen_tcp(endpoint.host, endpoint.port, handle_call, list_methods,
                                      thread_pool_size=thread_pool_size, auth_token=auth_token,
                                      limits=server_limits, tls=tls, grpc_service=service.path)
    return _WithGrpcService(framed, service)


def _grpc_client(address: str, endpoint: Endpoint, auth_token: Optional[str],
                 tls: Optional[security.TLSConfig], wait_for_ready: bool) -> ClientTransport:
    from courier.transport import grpc  # pylint: disable=import-outside-toplevel
    return grpc.GrpcClientTransport(address, endpoint, auth_token=auth_token, tls=tls,
                                    wait_for_ready=wait_for_ready)


class _EitherProtocol(ClientTransport):
    """A TCP server's client: the framed protocol, or gRPC for good once the server turns out to
    speak only gRPC (its calls fail with NotFramedError, and go again over gRPC)."""

    def __init__(self, framed: ClientTransport, make_grpc: Callable[[], ClientTransport]):
        self.address = framed.address
        self._lane = framed
        self._make_grpc = make_grpc
        self._lock = threading.Lock()
        self._settled = False  # The framed protocol carried a call: no need to watch for gRPC.

    @property
    def protocol(self) -> str:
        return self._lane.protocol

    def _grpc(self, framed: ClientTransport) -> ClientTransport:
        with self._lock:
            if self._lane is framed:
                self._lane = self._make_grpc()
                framed.close()
            return self._lane

    def call(self, method, pickle, buffers, timeout):
        lane = self._lane
        try:
            response = lane.call(method, pickle, buffers, timeout)
        except NotFramedError:
            return self._grpc(lane).call(method, pickle, buffers, timeout)
        self._settled = True
        return response

    def list_methods(self, timeout):
        lane = self._lane
        try:
            return lane.list_methods(timeout)
        except NotFramedError:
            return self._grpc(lane).list_methods(timeout)

    def call_async(self, method, pickle, buffers, timeout, finish):
        lane = self._lane
        if self._settled or lane.protocol == 'grpc':
            return lane.call_async(method, pickle, buffers, timeout, finish)
        outer = CallFuture()
        inner = lane.call_async(method, pickle, buffers, timeout, finish)
        outer.track(inner.cancel)

        def done(inner_future) -> None:
            if inner_future.cancelled():
                outer.cancel()
                return
            error = inner_future.exception()
            if isinstance(error, NotFramedError):
                again = self._grpc(lane).call_async(method, pickle, buffers, timeout, finish)
                outer.track(again.cancel)
                again.add_done_callback(lambda f: _copy(f, outer))
                return
            if error is None:
                self._settled = True
            _copy(inner_future, outer)

        inner.add_done_callback(done)
        return outer

    def close(self):
        self._lane.close()


def _copy(source, target: CallFuture) -> None:
    """Completes ``target`` as ``source`` (a done future) completed."""
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.fail(source.exception())
    else:
        target.resolve(lambda result: result, source.result())


class _GrpcService:
    """A TCP server's gRPC service, on a Unix socket in a private directory, started when the
    first gRPC client comes (:meth:`path`, on the relay's thread)."""

    def __init__(self, handle_call: HandleCall, list_methods: Callable[[], List[str]],
                 thread_pool_size: int, auth_token: Optional[str]):
        self._arguments = (handle_call, list_methods, thread_pool_size, auth_token)
        self._lock = threading.Lock()
        self._server: Optional[ServerTransport] = None
        self._directory: Optional[str] = None
        self._stopped = False

    def path(self) -> str:
        with self._lock:
            if self._stopped:
                raise RuntimeError('the server stopped')
            if self._server is None:
                from courier.transport import grpc  # pylint: disable=import-outside-toplevel
                handle_call, list_methods, thread_pool_size, auth_token = self._arguments
                self._directory = tempfile.mkdtemp(prefix='courier-grpc-')  # Mode 0700.
                address = f'unix:{self._directory}/grpc.sock'
                server = grpc.GrpcServerTransport(
                    address, parse_address(address), handle_call, list_methods,
                    thread_pool_size=thread_pool_size, auth_token=auth_token, tls=None)
                server.start()
                self._server = server
            return self._directory + '/grpc.sock'

    def stop(self, grace: Optional[float]) -> None:
        with self._lock:
            self._stopped = True
            server, self._server = self._server, None
        if server is not None:
            server.stop(grace)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


class _WithGrpcService(ServerTransport):
    """A TCP server: the framed server on its port, and the gRPC service it relays to."""

    def __init__(self, framed: ServerTransport, service: _GrpcService):
        self.address = framed.address
        self._framed = framed
        self._service = service
        self.limits = getattr(framed, 'limits', None)

    def start(self):
        self._framed.start()

    def stop(self, grace):
        self._framed.stop(grace)
        self._service.stop(grace)

