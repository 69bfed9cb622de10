"""A TCP client of a server on its own host calls it on a Unix socket, so that large buffers
travel in shared memory (courier/transport/same_host.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest

import courier
from courier.transport import same_host
from courier.transport import shm
from tests.courier.conftest import free_tcp_address
from tests.courier.test_shared_memory import (LARGE, _SERVE, _end, _memfd_files, _settled,
                                              _start)
from tests.courier.test_shared_memory_reuse import segment_of
from tests.testbeds import require_testbed

pytestmark = [
    pytest.mark.skipif(not shm.ENABLED, reason='no memfd here, or COURIER_SHARED_MEMORY=0'),
    pytest.mark.skipif(not same_host.ENABLED, reason='not Linux, or COURIER_SAME_HOST=0')]


def _in_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array`` arrived read-only, mapped on a segment of courier's shared memory."""
    try:
        segment_of(array)
    except AssertionError:  # Not mapped on shared memory.
        return False
    return not array.flags.writeable


def test_a_tcp_client_on_the_servers_host_gets_large_buffers_in_shared_memory(
        subprocess_env, make_server, monkeypatch):
    address = free_tcp_address()
    server = _start(_SERVE, address, subprocess_env)
    restarted = None
    try:
        client = courier.Client(address)
        params = client.get_params()
        assert params.sum() == LARGE // 8 and _in_shared_memory(params)
        assert _in_shared_memory(client.futures.fresh().result())  # Futures' connection too.
        assert client.address == address and client.protocol == 'framed'
        assert _settled(True, lambda: _memfd_files(server.pid) > 0)  # The server placed them.

        # A client that finds the server on another host (here: the same machine, another
        # network namespace) stays on TCP, and so does one with the upgrade turned off.
        with monkeypatch.context() as patch:
            other_namespace = same_host.host_identity().rsplit(b':', 1)[0] + b':1'
            patch.setattr(same_host, 'host_identity', lambda: other_namespace)
            over_tcp = courier.Client(address).fresh()
        assert over_tcp.flags.writeable and not _in_shared_memory(over_tcp)
        assert over_tcp.sum() == LARGE // 8
        with monkeypatch.context() as patch:
            patch.setattr(same_host, 'ENABLED', False)
            assert not _in_shared_memory(courier.Client(address).get_params())

        # The server restarts on the same port, with another socket: the client's next call
        # finds the old one gone, dials TCP and upgrades again.
        server.send_signal(signal.SIGKILL)
        server.wait()
        restarted = _start(_SERVE, address, subprocess_env)
        assert _in_shared_memory(client.get_params())
        assert _in_shared_memory(client.futures.get_params().result())

        # A server with the upgrade turned off welcomes TCP clients as before.
        with monkeypatch.context() as patch:
            patch.setattr(same_host, 'ENABLED', False)
            plain = make_server()
        plain.Bind('get_params', lambda: np.ones(LARGE // 8))
        plain.Start()
        assert not _in_shared_memory(courier.Client(plain.address).get_params())
    finally:
        _end(server, restarted)


_OTHER_NAMESPACE = '''
import socket, sys
from courier.transport import same_host
print(same_host.host_identity().decode())
try:
    socket.socket(socket.AF_UNIX).connect(b'\\0' + sys.argv[1].encode())
    print('reached')
except OSError as error:
    print(type(error).__name__)
'''


def test_another_network_namespace_is_another_host(make_server, subprocess_env):
    server = make_server()
    server.Start()
    welcome = server._transport._framed._same_host  # pylint: disable=protected-access
    name = welcome.rsplit(b' ', 1)[1]
    here = same_host.host_identity()
    assert same_host.socket_of(welcome, here) == b'\0' + name
    try:
        result = subprocess.run(
            ['unshare', '--net', sys.executable, '-c', _OTHER_NAMESPACE, name.decode()],
            env=subprocess_env, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        require_testbed('unshare (util-linux) is not installed')
    if result.returncode != 0 and 'unshare' in result.stderr:
        require_testbed(f'cannot make a network namespace: {result.stderr.strip()}')
    identity, reached = result.stdout.split()
    # The same kernel, another network namespace: not this host, and the server's socket is
    # out of its reach anyway.
    assert identity.split(':')[0] == here.decode().split(':')[0] and identity != here.decode()
    assert same_host.socket_of(welcome, identity.encode()) is None
    assert reached == 'ConnectionRefusedError'
