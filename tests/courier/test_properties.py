"""Property tests of what courier reads from the wire, on both transports.

Whatever bytes arrive, arbitrary or mutated from well-formed messages: a decoder returns a
message or raises its one error type; a server answers or closes the connection, never
crashes, never wedges, and holds no more connections, threads or descriptors afterwards
than a bound. The examples are few and derandomized so that the whole file runs in CI
within a fixed budget (under 30 s on two busy cores).
"""

from __future__ import annotations

import pickle
import socket
import threading

import grpc
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import courier
from courier import wire
from courier.transport import _here
from courier.transport import frames
from courier.transport import grpc as grpc_transport
from tests.core.conftest import wait_until
from tests.courier.conftest import NoServersHere, hello_frame

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])
_POOL = 4


def _frame(kind=frames.CALL, status=0, call_id=1, text=b'add',
           payload=pickle.dumps(((1, 2), {})), buffers=()) -> bytes:
    return b''.join(bytes(part) for part in frames.encode(kind, status, call_id, text, payload,
                                                          buffers))


_VALID_FRAMES = [
    _frame(), _frame(call_id=2, text=b'echo', payload=pickle.dumps(((b'x' * 100,), {}))),
    _frame(frames.LIST), _frame(frames.CANCEL, call_id=1),
    _frame(buffers=[b'abc', b'\x00' * 70]),
    _frame(kind=frames.HELLO, call_id=frames.VERSION, text=b'', payload=frames.MAGIC),
]


@st.composite
def _mutated(draw, valid):
    """A well-formed message with bytes flipped, cut, duplicated or inserted."""
    data = bytearray(draw(st.sampled_from(valid)))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(['flip', 'cut', 'insert', 'repeat']))
        position = draw(st.integers(0, len(data)))
        if action == 'flip' and position < len(data):
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif action == 'cut':
            del data[position:position + draw(st.integers(1, 16))]
        elif action == 'insert':
            data[position:position] = draw(st.binary(max_size=16))
        else:
            data += data[:position]
    return bytes(data)


_FRAME_BYTES = st.one_of(st.binary(max_size=300), _mutated(_VALID_FRAMES),
                         st.lists(st.sampled_from(_VALID_FRAMES), max_size=4).map(b''.join))
_SMALL_LIMITS = frames.Limits(text=4096, payload=1 << 16, buffers=16)


# ----- decoders ---------------------------------------------------------------------------------

@settings(max_examples=400, **_SETTINGS)
@given(data=_FRAME_BYTES)
def test_the_frame_reader_returns_frames_or_one_of_its_errors(data):
    left, right = socket.socketpair()
    with left, right:
        left.sendall(data)
        left.shutdown(socket.SHUT_WR)
        reader = frames.FrameReader(right)
        for _ in range(len(data) + 1):  # Every frame consumes bytes: this many always ends it.
            try:
                frame = reader.read_frame(_SMALL_LIMITS)
            except (EOFError, frames.ProtocolViolation):
                return
            assert len(frame.text) <= _SMALL_LIMITS.text
            assert len(frame.buffers) <= _SMALL_LIMITS.buffers
        pytest.fail('the reader kept returning frames from finite bytes')


_VALID_MESSAGES = [
    wire.encode_request('add', pickle.dumps(((1, 2), {})), [memoryview(b'abc')]),
    wire.encode_request('big', b'', buffer_sizes=[1 << 30, 5]),
    wire.encode_response(wire.Response(wire.EXCEPTION, b'p', [memoryview(b'b')], message='m',
                                       exception_type='ValueError', traceback='t',
                                       methods=['a', 'b'])),
    wire.encode_method_list(['add', 'échec']), wire.encode_chunk(b'chunk'),
    wire.encode_fetch_request(12345),
]
_DECODERS = [wire.decode_request, wire.decode_response, wire.decode_method_list,
             wire.decode_chunk, wire.decode_fetch_request]


@settings(max_examples=400, **_SETTINGS)
@given(data=st.one_of(st.binary(max_size=300), _mutated(_VALID_MESSAGES)),
       decode=st.sampled_from(_DECODERS))
def test_the_grpc_message_decoders_return_a_message_or_raise_value_error(data, decode):
    try:
        decode(data)
    except ValueError:
        pass


# ----- servers ----------------------------------------------------------------------------------

def _bounded(server_threads_before: int, fds_before: int) -> bool:
    process = psutil.Process()
    return (threading.active_count() <= server_threads_before + _POOL + 1
            and process.num_fds() <= fds_before + 8)


@pytest.fixture
def framed_server(make_server, socket_dir, monkeypatch):
    """A framed server reached through its socket, even from this process."""
    monkeypatch.setattr(_here, 'servers', NoServersHere())
    threads, fds = threading.active_count(), psutil.Process().num_fds()
    server = make_server(address=f'unix:{socket_dir}/p.sock', thread_pool_size=_POOL)
    server.Bind('add', lambda x, y: x + y)
    server.Bind('echo', lambda *args: args)
    server.Start()
    yield server
    assert wait_until(lambda: not _connections(server), timeout=10)
    assert wait_until(lambda: _bounded(threads, fds), timeout=10)
    with courier.Client(server.address, call_timeout=20) as client:
        assert client.add(20, 22) == 42 and client.futures.add(1, 1).result() == 2


def _connections(server: courier.Server) -> list:
    return server._transport._loop.connections()  # pylint: disable=protected-access


@settings(max_examples=400, **_SETTINGS)
@given(hello=st.sampled_from([b'', hello_frame(frames.SYNC), hello_frame(frames.PIPELINED)]),
       data=_FRAME_BYTES)
def test_a_framed_server_answers_or_closes_whatever_it_is_sent(framed_server, hello, data):
    path = framed_server.address[len('unix:'):]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)  # A wedged server makes recv time out: the test fails.
        sock.connect(path)
        try:
            sock.sendall(hello + data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # The server closed first (it refused the hello or the frame).
            pass
        received = b''
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
            assert len(received) < 1 << 20  # Answers are small: nothing grows without bound.
    assert len(_connections(framed_server)) <= 2


@pytest.fixture
def grpc_server(make_server):
    threads, fds = threading.active_count(), psutil.Process().num_fds()
    server = make_server(thread_pool_size=_POOL)
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    channel = grpc.insecure_channel(server.address)
    yield server, channel
    channel.close()
    with courier.Client(server.address, call_timeout=20) as client:
        assert client.add(20, 22) == 42
    # gRPC keeps its own threads and descriptors (completion queues, epoll): a loose bound.
    assert threading.active_count() <= threads + _POOL + 16 and (
        psutil.Process().num_fds() <= fds + 64)


_VALID_REQUESTS = [wire.encode_request('add', pickle.dumps(((1, 2), {}))),
                   wire.encode_request('nope', b''),
                   wire.encode_request('add', b'', buffer_sizes=[3])]


@settings(max_examples=400, **_SETTINGS)
@given(rpc=st.sampled_from([grpc_transport.CALL, grpc_transport.LIST_METHODS,
                            grpc_transport.FETCH]),
       data=st.one_of(st.binary(max_size=300), _mutated(_VALID_REQUESTS)))
def test_a_grpc_server_answers_whatever_it_is_sent(grpc_server, rpc, data):
    _, channel = grpc_server
    try:
        reply = channel.unary_unary(rpc)(data, timeout=20)
    except grpc.RpcError as error:
        assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (
            error.code(), error.details())
        return
    if rpc == grpc_transport.CALL:
        assert wire.decode_response(reply).status in (wire.OK, wire.SERIALIZATION_ERROR,
                                                      wire.UNKNOWN_METHOD, wire.EXCEPTION)
    elif rpc == grpc_transport.LIST_METHODS:
        assert wire.decode_method_list(reply) == ['add']
