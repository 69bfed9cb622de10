"""The framed server under a hostile or careless load: its limits, and what a client gets at each.

A connection must cost no thread; a server out of file descriptors must serve again once
they are back; the limits on connections, hellos and calls in flight refuse or pace with a
clear error instead of failing somewhere else.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import courier
from courier.transport import _here
from courier.transport import frames
from courier import wire
from tests.core.conftest import wait_until
from tests.courier.conftest import (NoServersHere, free_tcp_address, hello_frame, over_tcp_only,
                                    raw_connect, serve_add_and_sleep)


@pytest.fixture(params=['unix', 'tcp'])
def address(request, socket_dir, monkeypatch):
    """The address of a server reached through its socket (Unix or TCP), even from this process."""
    monkeypatch.setattr(_here, 'servers', NoServersHere())
    if request.param == 'tcp':
        over_tcp_only(monkeypatch)
        return free_tcp_address()
    return f'unix:{socket_dir}/s.sock'


@contextlib.contextmanager
def _connections(address: str, count: int, hello: bool):
    """Opens ``count`` connections to ``address`` (saying hello, or nothing), closes them after."""
    socks = []
    try:
        for _ in range(count):
            sock = raw_connect(address)
            socks.append(sock)
            if hello:
                sock.sendall(hello_frame())
        for sock in socks if hello else ():
            assert frames.HEADER.unpack(_receive(sock, frames.HEADER.size))[0] == frames.WELCOME
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b''
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_idle_connections_hold_no_thread(make_server, address):
    before = threading.active_count()
    server = serve_add_and_sleep(make_server, address, thread_pool_size=4)
    with _connections(address, 300, hello=True), _connections(address, 300, hello=False):
        assert threading.active_count() <= before + 1 + 4  # The loop, and at most the pool.
        client = courier.Client(address, call_timeout=20)
        assert client.add(1, 2) == 3 and client.futures.add(2, 3).result() == 5
        assert threading.active_count() <= before + 1 + 4 + 2  # + the client's reader and timer.
        client.close()
    server.Stop()
    assert wait_until(lambda: threading.active_count() <= before, timeout=10)


def test_at_the_connection_limit_a_client_is_refused_with_a_clear_error(make_server, address,
                                                                          monkeypatch):
    monkeypatch.setenv('COURIER_MAX_CONNECTIONS', '4')
    server = serve_add_and_sleep(make_server, address)
    assert server._transport.limits.max_connections == 4  # pylint: disable=protected-access
    with _connections(address, 4, hello=False):
        client = courier.Client(address, call_timeout=20)
        with pytest.raises(courier.ServerUnavailableError, match='max_connections') as info:
            client.add(1, 2)
        assert "'add'" in str(info.value) and address in str(info.value)
        with pytest.raises(courier.ServerUnavailableError, match='max_connections'):
            client.futures.add(1, 2).result(timeout=20)
    # The connections closed: the limit no longer applies.
    assert wait_until(lambda: _call_works(address), timeout=10)


def test_one_client_at_its_limit_is_refused(make_server, address, monkeypatch):
    monkeypatch.setenv('COURIER_MAX_CONNECTIONS_PER_CLIENT', '2')
    serve_add_and_sleep(make_server, address)
    with _connections(address, 2, hello=True):
        with pytest.raises(courier.ServerUnavailableError, match='max_connections_per_client'):
            courier.Client(address, call_timeout=20).add(1, 2)
    assert wait_until(lambda: _call_works(address), timeout=10)


def _call_works(address: str) -> bool:
    with courier.Client(address, call_timeout=20) as client:
        try:
            return client.add(1, 1) == 2
        except courier.ServerUnavailableError:
            return False


def test_a_connection_that_never_says_hello_is_closed(make_server, address, monkeypatch):
    monkeypatch.setenv('COURIER_HELLO_TIMEOUT', '1')
    serve_add_and_sleep(make_server, address)
    with _connections(address, 3, hello=False) as socks:
        for sock in socks:
            assert sock.recv(100) == b''  # Closed by the server (the timeout would raise).


def test_calls_beyond_the_in_flight_limit_wait_their_turn(make_server, address, monkeypatch):
    monkeypatch.setenv('COURIER_MAX_CALLS_IN_FLIGHT', '3')
    serve_add_and_sleep(make_server, address, thread_pool_size=8)
    client = courier.Client(address, call_timeout=30)
    futures = [client.futures.sleep(0.01) for _ in range(40)]
    assert [future.result() for future in futures] == ['slept'] * 40


def test_connections_silent_in_the_middle_of_a_frame_hold_no_worker(make_server, address,
                                                                    monkeypatch):
    """Clients that stop mid-frame (a host dropped off, or a hostile peer) hold no worker: other
    clients' calls go on, and the silent connections are dropped after stall_timeout."""
    monkeypatch.setenv('COURIER_STALL_TIMEOUT', '5')
    serve_add_and_sleep(make_server, address, thread_pool_size=4)
    call = b''.join(frames.encode(frames.CALL, 0, 1, b'add', pickle.dumps(((1, 2), {}))))
    stalled = []
    try:
        for mode in [frames.SYNC, frames.PIPELINED] * 10:  # Far more than the pool's 4 workers.
            sock = raw_connect(address)
            stalled.append(sock)
            sock.sendall(hello_frame(mode=mode) + call[:20])
        for sock in stalled:
            assert frames.HEADER.unpack(_receive(sock, frames.HEADER.size))[0] == frames.WELCOME
        with courier.Client(address, call_timeout=10) as client:
            for _ in range(3):
                assert client.add(1, 2) == 3
                assert client.futures.add(2, 3).result() == 5
        for sock in stalled:  # Each is told why, then closed.
            header = frames.HEADER.unpack(_receive(sock, frames.HEADER.size))
            assert header[0] == frames.FAULT
            assert b'stall_timeout' in _receive(sock, header[2])
            assert sock.recv(1) == b''
    finally:
        for sock in stalled:
            sock.close()


def test_clients_that_take_none_of_their_answers_hold_no_worker(make_server, address,
                                                                monkeypatch):
    """A client that stops reading (a host that dropped off, or a hostile peer) while its
    answer goes out loses its connection after stall_timeout, and the worker goes on."""
    monkeypatch.setenv('COURIER_STALL_TIMEOUT', '2')
    server = serve_add_and_sleep(make_server, address, thread_pool_size=2)
    server.Bind('make', lambda: bytearray(16 << 20))  # Far more than the sockets buffer.
    call = b''.join(frames.encode(frames.CALL, 0, 1, b'make', pickle.dumps(((), {}))))
    deaf = []
    try:
        for mode in [frames.SYNC, frames.PIPELINED] * 2:  # More than the pool's 2 workers.
            sock = raw_connect(address)
            deaf.append(sock)
            sock.sendall(hello_frame(mode=mode) + call)  # And never reads its answer.
        with courier.Client(address, call_timeout=20) as client:
            assert client.add(1, 2) == 3 and client.futures.add(2, 3).result() == 5
        for sock in deaf[:2]:  # Those that held the workers first were hung up: what did go
            while sock.recv(1 << 20):  # out, then the end. (Reading lets the others' go on.)
                pass
    finally:
        for sock in deaf:
            sock.close()


def test_a_frame_may_take_longer_than_stall_timeout_while_its_bytes_keep_coming(
        make_server, address, monkeypatch):
    monkeypatch.setenv('COURIER_STALL_TIMEOUT', '2')
    serve_add_and_sleep(make_server, address, thread_pool_size=2)
    argument = bytes(range(256)) * 4096  # 1 MiB, sent in 16 pieces over about 3 s.
    call = b''.join(frames.encode(frames.CALL, 0, 1, b'add', pickle.dumps(
        ((argument, b'!'), {}), protocol=5)))
    with raw_connect(address) as sock:
        sock.sendall(hello_frame())
        assert frames.HEADER.unpack(_receive(sock, frames.HEADER.size))[0] == frames.WELCOME
        piece = len(call) // 16 + 1
        for start in range(0, len(call), piece):
            sock.sendall(call[start:start + piece])
            time.sleep(0.2)
        header = frames.HEADER.unpack(_receive(sock, frames.HEADER.size))
        assert header[0] == frames.RESPONSE and header[1] == wire.OK
        assert pickle.loads(_receive(sock, header[5])) == argument + b'!'


_EXHAUSTED_SERVER = '''
import logging, resource, sys, time
import courier
logging.basicConfig(level=logging.WARNING)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
server = courier.Server(address=sys.argv[1])
server.Bind('add', lambda x, y: x + y)
server.Start()
print('serving', flush=True)
sys.stdin.read()  # Until the test closes it.
server.Stop()
'''


def test_a_server_out_of_file_descriptors_serves_again_once_they_are_back(
        socket_dir, subprocess_env, address):
    environment = {**subprocess_env, 'COURIER_MAX_CONNECTIONS': '100000'}
    child = subprocess.Popen([sys.executable, '-c', textwrap.dedent(_EXHAUSTED_SERVER), address],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=environment)
    try:
        assert child.stdout.readline().strip() == 'serving'
        with _connections(address, 150, hello=False):  # Far more than its 64 descriptors.
            time.sleep(0.5)
        assert wait_until(lambda: _call_works(address), timeout=20)
        with courier.Client(address, call_timeout=20) as client:
            assert client.futures.add(2, 2).result() == 4
    finally:
        _, errors = child.communicate('', timeout=30)
    assert child.returncode == 0, errors[-3000:]
    assert 'cannot accept connections' in errors and 'Too many open files' in errors
