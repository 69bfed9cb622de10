"""Over gRPC, large payloads travel as chunk streams (CallStream, Fetch) instead of one message.

Every client here speaks gRPC to the server's gRPC service (through its port's relay).
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import psutil
import pytest

import courier
from courier import serialization
from courier.transport import grpc as grpc_transport
from courier import wire
from tests.courier.conftest import speak_grpc


@pytest.fixture(autouse=True)
def small_streaming_sizes(monkeypatch):
    """Streams anything above 64 KiB, in 16 KiB chunks, so tests stay small and fast."""
    speak_grpc(monkeypatch)
    monkeypatch.setattr(grpc_transport, 'STREAM_THRESHOLD', 64 * 1024)
    monkeypatch.setattr(grpc_transport, 'CHUNK_SIZE', 16 * 1024)


@pytest.fixture
def streaming_server(make_server):
    server = make_server()
    server.Bind('echo', lambda *values: values if len(values) != 1 else values[0])
    server.Bind('make', lambda n: np.arange(n, dtype=np.float64))
    server.Bind('total', lambda array: float(array.sum()))
    server.Bind('fail_with', _fail_with)
    server.Start()
    return server


def _fail_with(payload):
    raise ValueError(payload)


def _pending_results(server: courier.Server) -> int:
    # The gRPC service behind the server's port (pylint: disable=protected-access).
    return len(server._transport._service._server._results)


def test_large_arguments_stream_to_the_server(streaming_server):
    client = courier.Client(streaming_server.address, call_timeout=30)
    array = np.random.default_rng(0).random(100_000)
    assert client.total(array) == pytest.approx(array.sum())
    assert client.futures.total(array).result() == pytest.approx(array.sum())


def test_large_results_are_fetched_as_a_stream(streaming_server):
    client = courier.Client(streaming_server.address, call_timeout=30)
    result = client.make(100_000)
    np.testing.assert_array_equal(result, np.arange(100_000.0))
    assert result.flags.writeable
    futures = [client.futures.make(50_000 + i) for i in range(8)]
    for i, future in enumerate(futures):
        assert future.result().shape == (50_000 + i,)
    assert _pending_results(streaming_server) == 0


def test_many_buffers_both_ways(streaming_server):
    client = courier.Client(streaming_server.address, call_timeout=30)
    values = (np.ones(40_000), b'', bytearray(70_000), np.zeros((300, 300), order='F'),
              np.arange(5))
    echoed = client.echo(*values)
    for sent, got in zip(values, echoed):
        if isinstance(sent, np.ndarray):
            np.testing.assert_array_equal(sent, got)
            assert got.flags.f_contiguous == sent.flags.f_contiguous
        else:
            assert bytes(sent) == bytes(got)


def test_exception_with_a_large_payload(streaming_server):
    client = courier.Client(streaming_server.address, call_timeout=30)
    with pytest.raises(ValueError) as info:
        client.fail_with(np.ones(100_000))
    assert info.value.args[0].shape == (100_000,)


def test_cancelling_a_streaming_call(make_server):
    release = threading.Event()
    server = make_server()
    server.Bind('hold', lambda array: release.wait(10) and array.size)
    server.Start()
    client = courier.Client(server.address, call_timeout=30)
    future = client.futures.hold(np.ones(100_000))
    time.sleep(0.2)
    assert future.cancel()
    release.set()
    assert client.hold(np.ones(100_000)) == 100_000


def _raw_stream(server, messages, token=None):
    channel = grpc.insecure_channel(server.address)
    try:
        metadata = (('authorization', 'Bearer ' + token),) if token else None
        reply = channel.stream_unary(grpc_transport.CALL_STREAM)(iter(messages), timeout=20,
                                                            metadata=metadata)
        return wire.decode_response(reply)
    finally:
        channel.close()


@pytest.mark.parametrize('first', ['chunk', 'bare'])
def test_stream_through_a_raw_client(streaming_server, first):
    """The first message is a Chunk wrapping the CallRequest (as protos/courier.proto says,
    and typed clients send it), or the CallRequest itself (as courier's clients send it)."""
    data, buffers = serialization.dumps(((np.arange(20_000.0),), {}), 'x')
    header = wire.encode_request('total', data, buffer_sizes=[b.nbytes for b in buffers])
    if first == 'chunk':
        header = wire.encode_chunk(header)
    chunks = [wire.encode_chunk(buffers[0][i:i + 1000])
              for i in range(0, buffers[0].nbytes, 1000)]
    response = _raw_stream(streaming_server, [header] + chunks)
    assert response.status == wire.OK
    assert serialization.loads(response.pickle, response.buffers, 'x') == sum(range(20_000))


@pytest.mark.parametrize('messages, problem', [
    ([], 'stream is empty'),
    ([b'\xff\xff'], 'malformed'),
    ([wire.encode_chunk(b'\xff\xff')], 'malformed'),
    ([wire.encode_chunk(wire.encode_request('total', b'', buffer_sizes=[10]))], '10 bytes short'),
    ([wire.encode_request('total', b'', [memoryview(b'x')])], 'buffer_sizes'),
    ([wire.encode_request('total', b'', buffer_sizes=[10])], '10 bytes short'),
    ([wire.encode_request('total', b'', buffer_sizes=[2]), wire.encode_chunk(b'abc')],
     'overflows'),
    ([wire.encode_request('total', b'', buffer_sizes=[1]), wire.encode_chunk(b'a'),
      wire.encode_chunk(b'b')], 'more chunks'),
    ([wire.encode_request('total', b'', buffer_sizes=[2**62])], 'cannot allocate'),
])
def test_malformed_streams_are_rejected(streaming_server, messages, problem):
    with pytest.raises(grpc.RpcError) as info:
        _raw_stream(streaming_server, messages)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in info.value.details()
    assert courier.Client(streaming_server.address).total(np.ones(10)) == 10


def test_announced_sizes_cost_no_memory_until_data_arrives(streaming_server):
    before = psutil.Process().memory_info().rss
    header = wire.encode_request('total', b'', buffer_sizes=[4 << 30])  # 4 GiB, never sent.
    with pytest.raises(grpc.RpcError):
        _raw_stream(streaming_server, [header, wire.encode_chunk(b'x' * 1000)])
    assert psutil.Process().memory_info().rss - before < 512 << 20


def _call_raw(server, method, argument):
    channel = grpc.insecure_channel(server.address)
    data, buffers = serialization.dumps(((argument,), {}), 'x')
    reply = channel.unary_unary(grpc_transport.CALL)(wire.encode_request(method, data, buffers),
                                                     timeout=20)
    return channel, wire.decode_response(reply)


def test_a_result_is_fetched_once(streaming_server):
    channel, response = _call_raw(streaming_server, 'make', 100_000)
    try:
        assert response.result_id and response.buffer_sizes == [800_000]
        fetch = channel.unary_stream(grpc_transport.FETCH)
        chunks = list(fetch(wire.encode_fetch_request(response.result_id), timeout=20))
        assert sum(wire.decode_chunk(chunk).nbytes for chunk in chunks) == 800_000
        with pytest.raises(grpc.RpcError) as info:
            list(fetch(wire.encode_fetch_request(response.result_id), timeout=20))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        channel.close()


def test_unfetched_results_expire(streaming_server, monkeypatch):
    monkeypatch.setattr(grpc_transport, 'RESULT_TTL', 0.2)
    channel, response = _call_raw(streaming_server, 'make', 100_000)
    channel.close()
    assert _pending_results(streaming_server) == 1
    deadline = time.monotonic() + 10
    while _pending_results(streaming_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pending_results(streaming_server) == 0
    assert response.result_id


def test_streaming_rpcs_require_the_token(make_server):
    server = make_server(auth_token='s3cret')
    server.Bind('total', lambda array: float(array.sum()))
    server.Bind('make', lambda n: np.zeros(n))
    server.Start()
    header = wire.encode_request('total', b'', buffer_sizes=[1])
    with pytest.raises(grpc.RpcError) as info:
        _raw_stream(server, [header, wire.encode_chunk(b'x')])
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel = grpc.insecure_channel(server.address)
    try:
        with pytest.raises(grpc.RpcError) as info:
            fetch = channel.unary_stream(grpc_transport.FETCH)
            list(fetch(wire.encode_fetch_request(1), timeout=20))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    client = courier.Client(server.address, auth_token='s3cret', call_timeout=30)
    assert client.total(np.ones(100_000)) == 100_000
    assert client.make(100_000).shape == (100_000,)
