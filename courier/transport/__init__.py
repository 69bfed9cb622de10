"""Maps an address to the transport that carries courier calls to it.

``unix:/path`` addresses use courier's framed protocol (:mod:`.framed_client`,
:mod:`.framed_server`), which also serves clients in the server's own process
without a socket; ``host:port`` addresses, and ``unix:`` ones with TLS, use gRPC
(:mod:`.grpc`). Clients talk to the small :class:`ClientTransport` interface and
servers hand :func:`listen` two plain callables, so a transport can be added
here without touching either. A transport's module is imported on first use:
grpc is loaded only by processes that call or serve a TCP address or use TLS.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from courier import security
from courier.transport._base import (ClientTransport, Endpoint, HandleCall, ServerTransport,
                                     parse_address, tcp_address)

__all__ = ['ClientTransport', 'Endpoint', 'HandleCall', 'ServerTransport', 'connect', 'listen',
           'parse_address', 'tcp_address']


def connect(address: str, *, auth_token: Optional[str] = None,
            tls: Optional[security.TLSConfig] = None,
            wait_for_ready: bool = True) -> ClientTransport:
    """Returns a transport that calls the server at ``address``."""
    endpoint = parse_address(address)
    if endpoint.kind == 'unix' and tls is None:
        from courier.transport import framed_client  # pylint: disable=import-outside-toplevel
        return framed_client.connect(address, endpoint.path, auth_token=auth_token,
                                     wait_for_ready=wait_for_ready)
    from courier.transport import grpc  # pylint: disable=import-outside-toplevel
    return grpc.GrpcClientTransport(address, endpoint, auth_token=auth_token,
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
        from courier.transport import framed_server  # pylint: disable=import-outside-toplevel
        return framed_server.listen(endpoint.path, handle_call, list_methods,
                                    thread_pool_size=thread_pool_size, auth_token=auth_token)
    from courier.transport import grpc  # pylint: disable=import-outside-toplevel
    return grpc.GrpcServerTransport(address, endpoint, handle_call, list_methods,
                                    thread_pool_size=thread_pool_size, auth_token=auth_token,
                                    tls=tls)
