"""A TCP address's lane: courier's framed protocol, else gRPC, on one port.

A TCP server owns one port for two protocols: courier's clients speak the framed protocol
there, and gRPC clients (any language, from ``protos/courier.proto``) are told by their first
bytes or TLS's ALPN and relayed to the server's gRPC service (:mod:`.grpc`), which listens on a
private Unix socket and is started when the first gRPC client comes. A TCP client tries the
framed protocol first and calls over gRPC a server that turns out to speak only gRPC (an older
courier, dm-launchpad's C++ one).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional

from courier import security
from courier.transport._base import (CallFuture, ClientTransport, Endpoint, HandleCall,
                                     NotFramedError, ServerTransport, parse_address)


def listen(address: str, endpoint: Endpoint, handle_call: HandleCall,
           list_methods: Callable[[], List[str]], *, thread_pool_size: int,
           auth_token: Optional[str], tls: Optional[security.TLSConfig],
           limits: Dict[str, Any]) -> ServerTransport:
    """Binds ``endpoint``'s port for the framed protocol and relays gRPC clients to the gRPC
    service, started when the first comes; ``limits`` are ``limits.ServerLimits`` fields."""
    del address  # The bound port names it.
    from courier.transport import framed_server  # pylint: disable=import-outside-toplevel
    from courier.transport.limits import ServerLimits  # pylint: disable=import-outside-toplevel
    limits = ServerLimits(**limits)
    service = _GrpcService(handle_call, list_methods, thread_pool_size, auth_token)
    framed = framed_server.listen_tcp(endpoint.host, endpoint.port, handle_call, list_methods,
                                      thread_pool_size=thread_pool_size, auth_token=auth_token,
                                      limits=limits, tls=tls, grpc_service=service.path)
    return _WithGrpcService(framed, service)


class EitherProtocol(ClientTransport):
    """A TCP server's client: the framed protocol, or gRPC (``make_grpc()``) for good once the
    server turns out to speak only gRPC (its calls fail with NotFramedError, and go again)."""

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

