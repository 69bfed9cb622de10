"""Which protocol carries a TCP client's calls: courier's framed protocol by default, gRPC when
the server speaks only gRPC (an older courier, dm-launchpad's C++ one), without an option;
and the one a client is told to speak (``protocol=``).

The proof is on both sides: the client's ``protocol``, and whether the server's gRPC
service (started only when a gRPC client comes to its port) ever started.
"""

from __future__ import annotations

import pickle

import pytest

import courier
from courier import transport
from courier.transport import grpc as grpc_transport
from tests.courier.conftest import serve_add
from tests.pki import Pki


def _grpc_service_started(server: courier.Server) -> bool:
    # The gRPC service behind the server's port (pylint: disable=protected-access).
    return server._transport._service._server is not None


def test_a_plain_client_of_a_tcp_address_speaks_the_framed_protocol(make_server):
    server = serve_add(make_server, host='0.0.0.0')  # As a node that other hosts call.
    client = courier.Client(server.address, call_timeout=30)
    assert client.protocol is None  # Nothing is decided before the first call.
    assert client.add(1, 2) == 3 and client.futures.add(3, 4).result() == 7
    assert courier.list_methods(client) == ['add']
    assert client.protocol == 'framed'
    assert not _grpc_service_started(server)


def test_a_grpc_client_of_the_same_port_is_served_by_the_grpc_service(make_server):
    server = serve_add(make_server)
    assert courier.Client(server.address, call_timeout=30).add(1, 1) == 2
    assert not _grpc_service_started(server)
    client = courier.Client(server.address, call_timeout=30, protocol='grpc')
    assert client.add(2, 2) == 4 and client.protocol == 'grpc'
    assert _grpc_service_started(server)
    copy = pickle.loads(pickle.dumps(client))  # The protocol travels with the client.
    assert copy.add(3, 3) == 6 and copy.protocol == 'grpc'


def _grpc_only_listen(address, handle_call, list_methods, *, thread_pool_size, auth_token=None,
                      tls=None, limits=None):
    """What a server that speaks only gRPC listens with (courier before the framed lane)."""
    del limits
    return grpc_transport.GrpcServerTransport(
        address, transport.parse_address(address), handle_call, list_methods,
        thread_pool_size=thread_pool_size, auth_token=auth_token, tls=tls)


@pytest.mark.parametrize('first_call', ['blocking', 'future', 'list_methods'])
@pytest.mark.parametrize('secure', [False, True], ids=['plaintext', 'tls'])
def test_a_server_that_speaks_only_grpc_is_called_over_grpc(make_server, monkeypatch, first_call,
                                                            secure):
    monkeypatch.setattr(transport, 'listen', _grpc_only_listen)
    server_tls = client_tls = None
    if secure:
        pki = Pki()
        server_tls = courier.TLSConfig(certificate_chain=pki.server_pem,
                                       private_key=pki.server_key)
        client_tls = courier.TLSConfig(root_certificates=pki.ca_pem)
    server = serve_add(make_server, auth_token='s3cret', tls=server_tls)
    client = courier.Client(server.address, call_timeout=30, auth_token='s3cret', tls=client_tls)
    if first_call == 'blocking':
        assert client.add(1, 2) == 3
    elif first_call == 'future':
        assert client.futures.add(1, 2).result() == 3
    else:
        assert courier.list_methods(client) == ['add']
    assert client.protocol == 'grpc'
    assert client.add(5, 5) == 10 and client.futures.add(6, 6).result() == 12
    with pytest.raises(courier.PermissionDeniedError):
        courier.Client(server.address, call_timeout=30, tls=client_tls).add(1, 1)


def test_a_client_told_to_speak_framed_does_not_fall_back_to_grpc(make_server, monkeypatch):
    monkeypatch.setattr(transport, 'listen', _grpc_only_listen)
    server = serve_add(make_server)
    client = courier.Client(server.address, call_timeout=30, protocol='framed')
    with pytest.raises(courier.ProtocolError, match="does not speak courier's framed protocol"):
        client.add(1, 2)


def test_a_client_told_to_speak_grpc_calls_a_grpc_server_on_a_unix_socket(make_server,
                                                                        monkeypatch, socket_dir):
    monkeypatch.setattr(transport, 'listen', _grpc_only_listen)
    server = serve_add(make_server, address=f'unix:{socket_dir}/grpc.sock')
    client = courier.Client(server.address, call_timeout=30, protocol='grpc')
    assert client.add(1, 2) == 3 and client.protocol == 'grpc'


def test_a_protocol_courier_does_not_speak_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"protocol='http' is not one of \('framed', 'grpc'\)"):
        courier.Client('localhost:1', protocol='http')
