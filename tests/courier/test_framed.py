"""The framed transport (unix: and TCP addresses): what differs from gRPC, and what must not.

Tests taking the ``server`` fixture elsewhere already run on this transport; these
cover its own ground, over a Unix socket and over TCP: waiting for and losing servers, raw bytes on its socket,
thread_pool_size, the in-process path's copies, large buffers and fork.
"""

from __future__ import annotations

import concurrent.futures
import os
import pickle
import socket
import threading
import time

import numpy as np
import pytest

import courier
from courier.transport import _here
from courier.transport import frames
from courier.transport import framed_server
from courier import wire
from tests.courier.conftest import (NoServersHere, free_tcp_address, hello_frame, over_tcp_only,
                                    raw_connect, serve_add_and_sleep)


def pytest_generate_tests(metafunc):
    """Runs a test taking ``address`` over a Unix socket and over TCP (what clients on other
    hosts use); one also taking ``kind`` runs through the in-process path as well."""
    if 'address' in metafunc.fixturenames:
        ways = ['unix', 'in_process', 'tcp'] if 'kind' in metafunc.fixturenames else ['unix',
                                                                                        'tcp']
        metafunc.parametrize('way', ways, indirect=True)


@pytest.fixture
def way(request):
    return request.param


@pytest.fixture
def kind(way, monkeypatch):
    """How the test's clients reach the server: its socket (Unix or TCP), or in-process."""
    if way == 'unix':
        monkeypatch.setattr(_here, 'servers', NoServersHere())
    return way


@pytest.fixture
def address(way, socket_dir, monkeypatch):
    if way == 'tcp':
        over_tcp_only(monkeypatch)
        return free_tcp_address()
    return f'unix:{socket_dir}/s.sock'


# ----- servers that are not there, or go away ---------------------------------------------------

def test_no_server_without_wait_for_ready_fails_at_once(address):
    client = courier.Client(address, call_timeout=30, wait_for_ready=False)
    start = time.monotonic()
    with pytest.raises(courier.ServerUnavailableError, match='wait_for_ready=True') as info:
        client.anything()
    assert time.monotonic() - start < 5
    assert "'anything'" in str(info.value) and address in str(info.value)
    with pytest.raises(courier.ServerUnavailableError, match="'later'"):
        client.futures.later().result(timeout=10)


def test_no_server_with_wait_for_ready_waits_for_the_deadline(address):
    client = courier.Client(address, call_timeout=0.3)
    for call in (lambda: client.anything(), lambda: client.futures.anything().result(10)):
        start = time.monotonic()
        with pytest.raises(courier.ServerUnreachableTimeoutError, match='not reachable'):
            call()
        assert time.monotonic() - start >= 0.25


def test_calls_wait_for_a_server_that_comes_up_later(make_server, address, kind):
    client = courier.Client(address, call_timeout=20)
    future = client.futures.add(1, 2)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(client.add, 3, 4)
        time.sleep(0.2)
        assert not future.done() and not blocking.done()
        serve_add_and_sleep(make_server, address)
        assert future.result(timeout=20) == 3
        assert blocking.result(timeout=20) == 7


def test_cancelled_call_waiting_for_its_server_never_runs(make_server, address):
    client = courier.Client(address)
    future = client.futures.record('cancelled')
    time.sleep(0.1)
    assert future.cancel()
    recorded = []
    server = make_server(address=address)
    server.Bind('record', recorded.append)
    server.Start()
    assert client.record('after') is None
    assert client.futures.record('future').result(timeout=10) is None
    time.sleep(0.1)
    assert recorded == ['after', 'future']


def _serve_sleep_saying_it_started(make_server, address: str):
    """A started server whose ``sleep`` releases the returned semaphore as each call begins."""
    started = threading.Semaphore(0)

    def sleep(seconds: float) -> str:
        started.release()
        time.sleep(seconds)
        return 'slept'

    server = make_server(address=address)
    server.Bind('sleep', sleep)
    server.Start()
    return server, started


def test_server_stopping_during_calls(make_server, address, kind):
    server, started = _serve_sleep_saying_it_started(make_server, address)
    client = courier.Client(address, wait_for_ready=False)
    future = client.futures.sleep(2)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(client.sleep, 2)
        assert started.acquire(timeout=30) and started.acquire(timeout=30)
        server.Stop()
        with pytest.raises(courier.ServerUnavailableError, match="'sleep'"):
            future.result(timeout=10)
        with pytest.raises(courier.ServerUnavailableError, match="'sleep'"):
            blocking.result(timeout=10)
    if address.startswith('unix:'):
        assert not os.path.exists(address[len('unix:'):])


def test_graceful_stop_lets_calls_in_flight_answer(make_server, address, kind):
    server, started = _serve_sleep_saying_it_started(make_server, address)
    client = courier.Client(address, call_timeout=20)
    future = client.futures.sleep(0.3)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(client.sleep, 0.3)
        assert started.acquire(timeout=30) and started.acquire(timeout=30)
        server.Stop(grace=5)
        assert future.result() == 'slept' and blocking.result() == 'slept'


def test_a_restarted_server_is_found_again(make_server, address, kind):
    client = courier.Client(address, call_timeout=20)
    first = serve_add_and_sleep(make_server, address)
    assert client.add(1, 1) == 2 and client.futures.add(2, 2).result() == 4
    first.Stop()
    second = serve_add_and_sleep(make_server, address)
    second.Bind('add', lambda x, y: x * y)
    assert client.add(3, 3) == 9
    assert client.futures.add(4, 4).result() == 16


def test_socket_that_is_not_a_courier_server(socket_dir):
    path = f'{socket_dir}/other.sock'
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()

    def answer_nonsense():
        connection, _ = listener.accept()
        connection.recv(1000)
        connection.sendall(frames.HEADER.pack(42, 0, 0, 0, 0, 0))
        connection.close()

    thread = threading.Thread(target=answer_nonsense)
    thread.start()
    try:
        with pytest.raises(courier.ProtocolError, match='courier protocol'):
            courier.Client(f'unix:{path}', call_timeout=10).anything()
    finally:
        thread.join()
        listener.close()


# ----- auth -------------------------------------------------------------------------------------

@pytest.mark.parametrize('token, message', [(None, 'carried none'), ('guess', 'wrong auth token')])
def test_calls_without_the_token_are_refused(make_server, address, kind, token, message,
                                             monkeypatch):
    monkeypatch.delenv(courier.AUTH_TOKEN_ENV, raising=False)
    serve_add_and_sleep(make_server, address, auth_token='s3cret')
    client = courier.Client(address, call_timeout=10, auth_token=token)
    with pytest.raises(courier.PermissionDeniedError, match=message) as info:
        client.add(1, 2)
    assert "'add'" in str(info.value) and address in str(info.value)
    with pytest.raises(courier.PermissionDeniedError, match=message):
        client.futures.add(1, 2).result(timeout=10)
    with pytest.raises(courier.PermissionDeniedError):
        courier.list_methods(client)
    good = courier.Client(address, auth_token='s3cret')
    assert good.add(1, 2) == 3 and courier.list_methods(good) == ['add', 'sleep']


# ----- raw bytes on the socket ------------------------------------------------------------------

def _raw(address: str, data: bytes) -> bytes:
    """Sends ``data`` on a fresh connection and returns what comes back before it closes."""
    with raw_connect(address) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return _read_all(sock)



def _frames(data: bytes):
    left, right = socket.socketpair()
    with left, right:
        left.sendall(data)
        left.shutdown(socket.SHUT_WR)
        reader = frames.FrameReader(right)
        received = []
        while True:
            try:
                received.append(reader.read_frame())
            except EOFError:
                return received


def test_garbage_never_hurts_the_server(make_server, address):
    serve_add_and_sleep(make_server, address)
    import random  # pylint: disable=import-outside-toplevel
    rng = random.Random(3)
    for size in (0, 1, 27, 28, 100, 5000):
        _raw(address, rng.randbytes(size))
    # Well-framed, but claiming far more than an unauthenticated peer may send.
    _raw(address, frames.HEADER.pack(frames.HELLO, 0, 1 << 30, 0, 1, 1 << 40))
    # A good hello, then garbage, a huge claim, an unknown kind, a truncated frame.
    for tail in (rng.randbytes(200),
                 frames.HEADER.pack(frames.CALL, 0, 3, 0, 0, 1 << 61) + b'add',
                 frames.HEADER.pack(77, 0, 0, 0, 0, 0),
                 b''.join(frames.encode(frames.CALL, 0, 0, b'add', b'x' * 100))[:60],
                 frames.HEADER.pack(frames.CALL, 0, 2, 0, 0, 0) + b'\xff\xfe'):
        for mode in (frames.SYNC, frames.PIPELINED):
            _raw(address, hello_frame(mode=mode) + tail)
    assert courier.Client(address, call_timeout=10).add(20, 22) == 42
    assert courier.Client(address, call_timeout=10).futures.add(1, 1).result() == 2


def test_an_unexpected_error_reading_a_connection_costs_only_that_connection(
        make_server, address, monkeypatch, caplog):
    serve = framed_server.FramedServerTransport._dispatch

    def failing(self, connection, frame):
        if frame.text == b'boom':
            raise RuntimeError('a bug while reading a call')
        return serve(self, connection, frame)

    monkeypatch.setattr(framed_server.FramedServerTransport, '_dispatch', failing)
    monkeypatch.setattr(_here, 'servers', NoServersHere())  # Through the socket.
    serve_add_and_sleep(make_server, address)
    with pytest.raises(courier.ServerUnavailableError, match='went away'):
        courier.Client(address, call_timeout=10).futures.boom().result()
    assert courier.Client(address, call_timeout=10).add(20, 22) == 42
    assert courier.Client(address, call_timeout=10).futures.add(1, 1).result() == 2
    assert 'reading a connection failed' in caplog.text


def test_bad_hello_is_refused_with_a_reason(make_server, address):
    serve_add_and_sleep(make_server, address)
    wrong_version = b''.join(frames.encode(frames.HELLO, 0, 99, b'', frames.MAGIC))
    received = _frames(_raw(address, wrong_version))
    assert [frame.kind for frame in received] == [frames.REFUSED]
    assert b'version' in received[0].text


def test_protocol_fault_is_explained_to_the_peer(make_server, address):
    serve_add_and_sleep(make_server, address)
    received = _frames(_raw(address, hello_frame() + frames.HEADER.pack(77, 0, 0, 0, 0, 0)))
    assert [frame.kind for frame in received] == [frames.WELCOME, frames.FAULT]
    assert b'kind 77' in received[1].text


@pytest.mark.parametrize('payload', [
    b'not a pickle', pickle.dumps('not (args, kwargs)'), b'\x80\x05\x95',
    pickle.dumps(((pickle.PickleBuffer(b'x' * 100),), {}), protocol=5,
                 buffer_callback=lambda _: False),  # Claims a buffer that is not sent.
])
def test_well_framed_bad_pickles_get_a_serialization_error(make_server, address, payload):
    serve_add_and_sleep(make_server, address)
    call = b''.join(frames.encode(frames.CALL, 0, 0, b'add', payload))
    received = _frames(_raw(address, hello_frame() + call))
    assert [frame.kind for frame in received] == [frames.WELCOME, frames.RESPONSE]
    assert received[1].status == wire.SERIALIZATION_ERROR
    assert "arguments of 'add'" in wire.decode_response(received[1].payload).message


# ----- concurrency ------------------------------------------------------------------------------

def test_thread_pool_size_bounds_calls_running_at_once(make_server, address, kind):
    running, peak, lock = [0], [0], threading.Lock()

    def work():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return True

    server = make_server(address=address, thread_pool_size=3)
    server.Bind('work', work)
    server.Start()
    client = courier.Client(address, call_timeout=30)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        blocking = [pool.submit(client.work) for _ in range(12)]
        futures = [client.futures.work() for _ in range(12)]
        assert all(f.result() for f in blocking) and all(f.result() for f in futures)
    assert peak[0] == 3


def test_batched_handler_gathers_calls_from_threads_and_futures(make_server, address, kind):
    batches = []

    @courier.batched_handler(batch_size=4, timeout=10)
    def double(x):
        batches.append(len(x))
        return np.asarray(x) * 2

    server = make_server(address=address, thread_pool_size=8)
    server.Bind('double', double)
    server.Start()
    client = courier.Client(address, call_timeout=20)
    futures = [client.futures.double(i) for i in range(4)]
    assert [f.result() for f in futures] == [0, 2, 4, 6]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(client.double, range(4))) == [0, 2, 4, 6]
    assert batches == [4, 4]


def test_futures_complete_in_any_order(make_server, address, kind):
    server = serve_add_and_sleep(make_server, address)
    held = threading.Event()
    server.Bind('held', held.wait)
    client = courier.Client(address, call_timeout=20)
    slow = client.futures.held(30)
    fast = client.futures.add(1, 2)
    assert fast.result(timeout=20) == 3
    assert not slow.done()
    held.set()
    assert slow.result() is True


def test_a_timed_out_blocking_call_does_not_confuse_the_next_one(make_server, address, kind):
    serve_add_and_sleep(make_server, address)
    client = courier.Client(address, call_timeout=1.0)  # (for an add, even on a busy machine)
    with pytest.raises(courier.CallTimeoutError):
        client.sleep(2)
    assert client.add(1, 2) == 3  # Not the late answer of sleep.
    time.sleep(1.5)  # (it comes meanwhile)
    assert client.add(2, 2) == 4


# ----- values -----------------------------------------------------------------------------------

class _Store:
    def __init__(self):
        self.kept = None
        self.array = np.zeros(10_000)

    def keep(self, value):
        self.kept = value

    def get_array(self):
        return self.array


def test_in_process_calls_never_share_mutable_objects(make_server, address):
    store = _Store()
    server = make_server(address=address)
    server.bind_object(store)
    server.Start()
    client = courier.Client(address)
    value = {'list': [1, 2], 'array': np.arange(10_000.0)}
    client.keep(value)
    value['list'].append(3)
    value['array'][:] = -1
    assert store.kept['list'] == [1, 2] and store.kept['array'][5] == 5.0
    result = client.get_array()
    result[:] = 7
    assert not store.array.any()
    assert client.futures.get_array().result() is not store.array


def test_large_arrays_both_ways(make_server, address, kind):
    server = make_server(address=address)
    server.Bind('echo', lambda x: x)
    server.Bind('total', lambda x: int(x.sum()))
    server.Start()
    client = courier.Client(address, call_timeout=120)
    array = np.random.default_rng(0).integers(0, 255, 48 << 20, dtype=np.uint8)
    echoed = client.echo(array)
    assert np.array_equal(echoed, array)
    # Through a Unix socket a large array arrives mapped read-only onto shared memory; its
    # copy is writable. Otherwise it arrives writable, like a local array.
    assert echoed.flags.writeable == (kind != 'unix')
    echoed = echoed.copy() if kind == 'unix' else echoed
    echoed[0] = 1
    many = [array[i::7].copy() for i in range(3)]
    assert client.futures.echo(many).result()[2].tobytes() == many[2].tobytes()
    assert client.total(array) == int(array.sum())


def test_one_gib_round_trip(make_server, address, monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())
    server = make_server(address=address)
    server.Bind('echo', lambda x: x)
    server.Start()
    array = np.zeros(1 << 30, dtype=np.uint8)  # Untouched pages cost no memory to send.
    array[0], array[-1] = 1, 2
    echoed = courier.Client(address, call_timeout=300).echo(array)
    assert echoed.nbytes == 1 << 30 and echoed[0] == 1 and echoed[-1] == 2
    del echoed


# ----- fork -------------------------------------------------------------------------------------

def test_a_client_used_before_fork_works_in_the_child(make_server, address):
    server = serve_add_and_sleep(make_server, address)
    server.Bind('pid', os.getpid)
    client = courier.Client(address, call_timeout=20)
    assert client.pid() == os.getpid() and client.futures.add(1, 1).result() == 2
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # The child has no server threads: it must go through the socket.
        try:
            answer = (client.pid(), client.futures.add(2, 3).result(timeout=20))
            os.write(write, pickle.dumps(answer))
        finally:
            os._exit(0)  # pylint: disable=protected-access
    os.close(write)
    with os.fdopen(read, 'rb') as pipe:
        answer = pickle.loads(pipe.read())
    os.waitpid(child, 0)
    assert answer == (os.getpid(), 5)


def test_large_receive_buffers_are_reused_only_once_released():
    first = frames.allocate(4 << 20)
    first_id = id(first)
    array = np.frombuffer(first, dtype=np.uint8)  # As an unpickled array holds it.
    array[:3] = (1, 2, 3)
    del first
    others = [frames.allocate(4 << 20) for _ in range(3)]
    assert first_id not in {id(other) for other in others}  # In use: never handed out.
    assert list(array[:3]) == [1, 2, 3]
    del array
    assert id(frames.allocate(4 << 20)) == first_id  # Released: reused.


# ----- peers that misbehave ---------------------------------------------------------------------

class _Peer:
    """A Unix socket server that answers each connection with ``answer(connection)``."""

    def __init__(self, path: str, answer):
        self.connections = 0
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(path)
        self._listener.listen(64)
        self._answer = answer
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with connection:
                self._answer(connection)

    def close(self):
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(10)


def test_a_socket_that_closes_every_hello_is_not_retried_forever(socket_dir):
    path = f'{socket_dir}/closer.sock'
    peer = _Peer(path, lambda connection: None)  # Accepts, then closes at once.
    try:
        for timeout in (None, 30):
            client = courier.Client(f'unix:{path}', call_timeout=timeout)
            with pytest.raises(courier.ProtocolError, match='courier protocol') as info:
                client.anything()
            assert "'anything'" in str(info.value) and path in str(info.value)
            with pytest.raises(courier.ProtocolError):
                client.futures.anything().result(timeout=30)
    finally:
        peer.close()
    assert peer.connections < 30  # A few attempts each, not one per stack frame.


def test_a_call_whose_connections_close_before_it_goes_out(socket_dir):
    path = f'{socket_dir}/welcomer.sock'

    def welcome_and_close(connection):
        connection.recv(4096)
        connection.sendall(b''.join(frames.encode(frames.WELCOME)))

    peer = _Peer(path, welcome_and_close)
    try:
        client = courier.Client(f'unix:{path}', call_timeout=30)
        with pytest.raises(courier.ServerUnavailableError) as info:
            client.method(b'x' * (8 << 20))  # Too large to leave before the peer closes.
        assert "'method'" in str(info.value) and path in str(info.value)
    finally:
        peer.close()


def test_a_server_refusing_a_call_mid_send_explains_why(make_server, address, monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())
    serve_add_and_sleep(make_server, address)
    with raw_connect(address) as sock:
        sock.sendall(hello_frame())
        huge = frames.HEADER.pack(frames.CALL, 0, 2 << 20, 0, 0, 0)  # A 2 MiB method name.
        sock.sendall(huge)
        received = _frames(_read_all(sock))
    assert [frame.kind for frame in received] == [frames.WELCOME, frames.FAULT]
    assert b'too large' in received[1].text


def _read_all(sock: socket.socket) -> bytes:
    received = b''
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def test_pipelined_calls_sharing_a_call_id_each_get_their_answer(make_server, address):
    serve_add_and_sleep(make_server, address)
    call = frames.encode(frames.CALL, 0, 7, b'add', pickle.dumps(((1, 2), {})))[0]
    slow = frames.encode(frames.CALL, 0, 7, b'sleep', pickle.dumps(((0.2,), {})))[0]
    received = _frames(_raw(address, hello_frame(mode=frames.PIPELINED) + slow + call))
    assert [frame.kind for frame in received] == [frames.WELCOME] + [frames.RESPONSE] * 2
    assert all(frame.status == wire.OK for frame in received[1:])
    assert {pickle.loads(frame.payload) for frame in received[1:]} == {3, 'slept'}


def test_a_frame_is_read_in_pieces_as_its_bytes_come():
    """A reader that finds no more bytes keeps what it read and goes on later: so the server's
    loop reads frames without waiting, and no worker waits long on one that is slow to come."""
    left, right = socket.socketpair()
    with left, right:
        frames.set_receive_timeout(right, 0.05)
        reader = frames.FrameReader(right)
        with pytest.raises(BlockingIOError):  # Nothing came within the receive timeout.
            reader.read_frame()
        assert not reader.partial
        large = bytes(range(256)) * 800  # Over 64 KiB: received in place, not through the buffer.
        frame = b''.join(frames.encode(frames.CALL, 0, 3, b'add', b'x' * 1000, [large]))
        cuts = [0, 10, 30, 36, 500, 1100, 50_000, 150_000]
        for start, end in zip(cuts, cuts[1:]):
            left.sendall(frame[start:end])
            with pytest.raises(BlockingIOError):  # The rest has not come: what came is kept.
                reader.read_frame(wait=False)
            assert reader.partial
        left.sendall(frame[cuts[-1]:])
        received = reader.read_frame(wait=False)
        assert (received.call_id, received.text, bytes(received.payload)) == (
            3, b'add', b'x' * 1000)
        assert [bytes(buffer) for buffer in received.buffers] == [large]
        assert not reader.partial
        left.sendall(frame[:50])  # A reader that waits stops mid-frame at the receive timeout,
        with pytest.raises(BlockingIOError):
            reader.read_frame()
        assert reader.partial
        reader.patience = 0.0  # or once out of patience, whatever still comes.
        left.sendall(frame[50:60])
        with pytest.raises(BlockingIOError):
            reader.read_frame()
        reader.patience = None
        left.sendall(frame[60:])
        assert [bytes(buffer) for buffer in reader.read_frame().buffers] == [large]
