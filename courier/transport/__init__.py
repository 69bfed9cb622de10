"""Maps an address to the transport that carries courier calls to it.

Courier's own framed protocol (:mod:`.framed_client`, :mod:`.framed_server`) carries every
call it can: on ``unix:/path`` addresses (where it also serves clients in the server's own
process without a socket) and on TCP ``host:port`` addresses, with TLS if asked for, where
the server relays gRPC clients to its gRPC service and a client falls back to gRPC for a
server that speaks only gRPC (:mod:`.tcp`). A ``unix:`` address with TLS is served over gRPC
(:mod:`.grpc`). A client may also be told which protocol to speak (``protocol=``).

Clients and servers see only :class:`ClientTransport` and :func:`listen`; tables pick the
transport, whose module is imported on first use (grpc only where gRPC is spoken).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from courier import security
from courier.transport import tcp
from courier.transport._base import (ClientTransport, Endpoint, HandleCall, ServerTransport,
                                     parse_address, tcp_address)

__all__ = ['PROTOCOLS', 'ClientTransport', 'Endpoint', 'HandleCall', 'ServerTransport',
           'connect', 'listen', 'parse_address', 'tcp_address']

def _framed_client(address: str, endpoint: Endpoint, **options: Any) -> ClientTransport:
    from courier.transport import framed_client  # pylint: disable=import-outside-toplevel
    return framed_client.connect(address, endpoint, **options)


def _grpc_client(address: str, endpoint: Endpoint, **options: Any) -> ClientTransport:
    from courier.transport import grpc  # pylint: disable=import-outside-toplevel
    return grpc.GrpcClientTransport(address, endpoint, **options)


def _framed_else_grpc_client(address: str, endpoint: Endpoint, **options: Any) -> ClientTransport:
    return tcp.EitherProtocol(_framed_client(address, endpoint, **options),
                              lambda: _grpc_client(address, endpoint, **options))


def _framed_unix_server(address, endpoint, handle_call, list_methods, *, tls, limits, **options):
    del address, tls  # A unix: server with TLS is _grpc_server's.
    from courier.transport import framed_server  # pylint: disable=import-outside-toplevel
    from courier.transport.limits import ServerLimits  # pylint: disable=import-outside-toplevel
    return framed_server.listen(endpoint.path, handle_call, list_methods,
                                limits=ServerLimits(**limits), **options)


def _grpc_server(address, endpoint, handle_call, list_methods, *, limits, **options):
    if limits:
        raise ValueError(f'{", ".join(sorted(limits))}: a unix: server with TLS serves gRPC, '
                         f'which has none of these limits; leave them out, or serve without '
                         f'TLS (a Unix socket is private to its machine)')
    from courier.transport import grpc  # pylint: disable=import-outside-toplevel
    return grpc.GrpcServerTransport(address, endpoint, handle_call, list_methods, **options)


# What a client speaks when told (see PROTOCOLS), and when not, by (address kind, with TLS):
# a unix: server with TLS serves gRPC. How a server listens, by (address kind, with TLS).
_CLIENTS = {'framed': _framed_client, 'grpc': _grpc_client}
_DEFAULT_CLIENTS = {('unix', False): _framed_client, ('unix', True): _grpc_client,
                    **{('tcp', tls): _framed_else_grpc_client for tls in (False, True)}}
_SERVERS = {('unix', False): _framed_unix_server, ('unix', True): _grpc_server,
            **{('tcp', tls): tcp.listen for tls in (False, True)}}
# What a client may be told to speak (courier.Client's protocol=): courier's frames only, or
# gRPC only. Not told, it speaks the framed protocol where the server does.
PROTOCOLS = tuple(_CLIENTS)


def connect(address: str, *, auth_token: Optional[str] = None,
            tls: Optional[security.TLSConfig] = None, wait_for_ready: bool = True,
            protocol: Optional[str] = None) -> ClientTransport:
    """Returns a transport that calls the server at ``address``, speaking ``protocol`` (one of
    :data:`PROTOCOLS`, or None)."""
    endpoint = parse_address(address)
    make = _CLIENTS[protocol] if protocol else _DEFAULT_CLIENTS[endpoint.kind, tls is not None]
    return make(address, endpoint, auth_token=auth_token, tls=tls, wait_for_ready=wait_for_ready)


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
    return _SERVERS[endpoint.kind, tls is not None](
        address, endpoint, handle_call, list_methods, thread_pool_size=thread_pool_size,
        auth_token=auth_token, tls=tls, limits=limits)
