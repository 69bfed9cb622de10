"""courier: call Python functions in other processes and on other machines.

    server = courier.Server()                 # binds a free local port
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    client = courier.Client(server.address)
    client.add(2, 3)                          # 5, computed in the server
    client.futures.add(4, 5).result()         # a concurrent.futures.Future
    server.Stop()

Calls travel in courier's own frames, over a Unix socket (``unix:/path``, or
without a socket when the server is in the same process) or TCP ``host:port``
(with TLS if asked for; without, a client on the server's own host switches to
a Unix socket of the server). A server's TCP port also serves gRPC clients of
any language (``protos/courier.proto``), and a client calls a server that speaks
only gRPC over gRPC: grpc is imported only then. Arguments and results are
pickled (protocol 5, large buffers out-of-band).
"""

from courier.batching import batched_handler
from courier.client import AddressResolver, Client, list_methods
from courier.errors import (CallTimeoutError, CourierError, PermissionDeniedError,
                            ProtocolError, RemoteError, SerializationError,
                            ServerUnavailableError, ServerUnreachableTimeoutError,
                            UnknownMethodError)
from courier.security import AUTH_TOKEN_ENV, TLSConfig
from courier.server import Server
from courier.transport.shm import shared_array

__all__ = [
    'AUTH_TOKEN_ENV',
    'AddressResolver',
    'CallTimeoutError',
    'Client',
    'CourierError',
    'PermissionDeniedError',
    'ProtocolError',
    'RemoteError',
    'SerializationError',
    'Server',
    'ServerUnavailableError',
    'ServerUnreachableTimeoutError',
    'TLSConfig',
    'UnknownMethodError',
    'batched_handler',
    'list_methods',
    'shared_array',
]
