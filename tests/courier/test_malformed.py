"""Bytes from clients that are not ours never crash or wedge a server."""

from __future__ import annotations

import pickle
import random
import socket

import grpc
import pytest

import courier
from courier.transport import grpc as grpc_transport
from courier import wire

pytestmark = pytest.mark.grpc_only  # These tests speak gRPC (tests/courier/test_framed.py: the rest).


@pytest.fixture
def raw_call(server):
    """Calls the server's Call RPC with raw bytes, as a foreign client would."""
    channel = grpc.insecure_channel(server.address)
    call = channel.unary_unary(grpc_transport.CALL)
    yield lambda data: call(data, timeout=10)
    channel.close()


def test_garbage_requests_are_rejected_and_the_server_keeps_serving(server, raw_call):
    rng = random.Random(1)
    codes = set()
    for size in list(range(0, 40)) + [1000, 100_000]:
        try:
            raw_call(rng.randbytes(size))
        except grpc.RpcError as error:
            codes.add(error.code())
    assert codes <= {grpc.StatusCode.INVALID_ARGUMENT}, codes
    assert grpc.StatusCode.INVALID_ARGUMENT in codes
    assert courier.Client(server.address).add(1, 2) == 3


def test_malformed_request_error_says_why(raw_call):
    with pytest.raises(grpc.RpcError) as info:
        raw_call(b'\x0a\x50short')
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'malformed courier CallRequest' in info.value.details()


@pytest.mark.parametrize('payload', [
    b'not a pickle at all',
    pickle.dumps('a string, not (args, kwargs)'),
    pickle.dumps(((1,), 'kwargs not a dict')),
    pickle.dumps((1, 2, 3)),
    b'\x80\x05\x95',  # A truncated pickle.
])
def test_well_framed_bad_pickles_get_a_serialization_error(server, raw_call, payload):
    reply = raw_call(wire.encode_request('add', payload, []))
    response = wire.decode_response(reply)
    assert response.status == wire.SERIALIZATION_ERROR
    assert "arguments of 'add'" in response.message
    assert courier.Client(server.address).add(2, 2) == 4


def test_pickle_claiming_more_out_of_band_buffers_than_sent(server, raw_call):
    data = pickle.dumps(((pickle.PickleBuffer(b'x' * 100),), {}), protocol=5,
                        buffer_callback=lambda _: False)
    response = wire.decode_response(raw_call(wire.encode_request('echo', data, [])))
    assert response.status == wire.SERIALIZATION_ERROR


def test_unknown_grpc_method_and_garbage_method_list_request(server):
    channel = grpc.insecure_channel(server.address)
    try:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary('/courier.Courier/Nope')(b'x', timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # ListMethodsRequest has no fields; whatever is sent is ignored.
        reply = channel.unary_unary(grpc_transport.LIST_METHODS)(b'\xff\x00garbage', timeout=10)
        assert wire.decode_method_list(reply) == ['add', 'echo', 'sleep']
    finally:
        channel.close()


def test_raw_tcp_junk_does_not_hurt_the_server(server):
    host, port = server.address.rsplit(':', 1)
    rng = random.Random(2)
    for size in (0, 1, 24, 100, 10_000):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(rng.randbytes(size))
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + rng.randbytes(500))
    assert courier.Client(server.address, call_timeout=10).add(5, 5) == 10
