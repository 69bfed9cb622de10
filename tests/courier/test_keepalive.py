"""Courier's TCP connections carry the dead-peer bounds of courier/transport/keepalive.py, on
both ends, framed protocol and gRPC. That a silent peer is then found dead within them, and a
shorter silence ridden out, is tested on the SSH bed (tests/launch/test_ssh_keepalive.py)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import shlex
import socket
import subprocess
import time
from typing import Iterator

import psutil
import pytest

import courier
from courier.transport import keepalive
from tests.courier.conftest import REPO, over_tcp_only


def _tcp_sockets(port: int) -> dict:
    """This process's TCP sockets to and from ``port``, as (client side, server side) copies."""
    sockets = {'client': [], 'server': []}
    for connection in psutil.Process().net_connections(kind='tcp'):
        if connection.status != psutil.CONN_ESTABLISHED or not connection.raddr:
            continue
        side = ('client' if connection.raddr.port == port else
                'server' if connection.laddr.port == port else None)
        if side is not None:
            sockets[side].append(socket.socket(fileno=socket.dup(connection.fd)))
    return sockets


def _options(sock: socket.socket) -> dict:
    tcp = socket.IPPROTO_TCP
    return {'keepalive': sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            'idle': sock.getsockopt(tcp, socket.TCP_KEEPIDLE),
            'interval': sock.getsockopt(tcp, socket.TCP_KEEPINTVL),
            'probes': sock.getsockopt(tcp, socket.TCP_KEEPCNT),
            'user_timeout_ms': sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT)}


BOUNDS = {'keepalive': 1, 'idle': keepalive.IDLE, 'interval': keepalive.INTERVAL,
          'probes': keepalive.PROBES, 'user_timeout_ms': keepalive.DEAD_AFTER * 1000}


def test_dialed_and_accepted_tcp_sockets_carry_the_dead_peer_bounds(make_server, monkeypatch):
    assert 30 < keepalive.DEAD_AFTER <= 60  # rides out a 30 s cut, finds a dead peer in a minute
    over_tcp_only(monkeypatch)
    server = make_server()
    server.Bind('echo', lambda value: value)
    server.Start()
    port = int(server.address.rsplit(':', 1)[1])
    with courier.Client(server.address) as client:
        assert client.echo(1) == 1  # this thread's blocking connection
        assert client.futures.echo(2).result() == 2  # the futures' pipelined connection
        sockets = _tcp_sockets(port)
        try:
            assert len(sockets['client']) == len(sockets['server']) == 2
            for sock in sockets['client'] + sockets['server']:
                assert _options(sock) == BOUNDS
        finally:
            for sock in sockets['client'] + sockets['server']:
                sock.close()
    with courier.Client(server.address, protocol='grpc') as client:
        assert client.echo(3) == 3
        sockets = _tcp_sockets(port)
        try:
            assert sockets['client'] and sockets['server']
            for sock in sockets['client']:  # gRPC's own socket: its keepalive is HTTP/2 pings
                assert _options(sock)['user_timeout_ms'] == keepalive.DEAD_AFTER * 1000
            for sock in sockets['server']:  # the server's end, which it relays to gRPC
                assert _options(sock) == BOUNDS
        finally:
            for sock in sockets['client'] + sockets['server']:
                sock.close()


# ----- a host cut off the network (the SSH bed) --------------------------------------------------

SERVER = '''
import sys, time, courier
server = courier.Server(address=sys.argv[1] + ':0', auth_token=sys.argv[2])
server.Bind('echo', lambda value: value)
server.Bind('sleep', lambda seconds: time.sleep(seconds) or 'slept')
server.Start()
print(server.address, flush=True)
sys.stdin.read()  # until the test closes it
server.Stop()
'''
TOKEN = 'keepalive-test'


@contextlib.contextmanager
def _cut_off(host_index: int) -> Iterator[None]:
    """Takes bed host ``lp-h<host_index>`` off the network (its link to the bridge goes down):
    its packets vanish without a reset, as a frozen or unplugged host's do."""
    link = f'lpv{host_index}'
    subprocess.run(['ip', 'link', 'set', link, 'down'], check=True)
    try:
        yield
    finally:
        subprocess.run(['ip', 'link', 'set', link, 'up'], check=True)


@pytest.mark.timeout(90)
def test_a_call_to_a_host_cut_off_fails_within_the_bound_and_a_shorter_cut_is_ridden_out(
        ssh_testbed, monkeypatch):
    # Bounds scaled down for the test (in this process, the client's): found dead after 4 s.
    for name, value in (('IDLE', 1), ('INTERVAL', 1), ('PROBES', 3), ('DEAD_AFTER', 4)):
        monkeypatch.setattr(keepalive, name, value)
    over_tcp_only(monkeypatch)
    host = ssh_testbed[0]  # lp-h1
    command = shlex.join(['env', f'PYTHONPATH={REPO}', host.python, '-c', SERVER, host.ip, TOKEN])
    server = subprocess.Popen(host.ssh_command(command), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().strip()
        assert address.startswith(host.ip), address
        with courier.Client(address, auth_token=TOKEN) as client, \
                concurrent.futures.ThreadPoolExecutor(1) as caller:
            assert client.echo(0) == 0 and client.futures.echo(0).result(timeout=10) == 0
            assert client.protocol == 'framed'

            # A cut shorter than the bound: a blocking call in flight through it (its method
            # runs meanwhile) and a future sent during it are answered.
            blocking = caller.submit(client.sleep, 3)
            time.sleep(0.5)
            with _cut_off(1):
                future = client.futures.echo(1)
                time.sleep(1.5)
            assert blocking.result(timeout=10) == 'slept'
            assert future.result(timeout=10) == 1

            # A longer cut: both fail with ServerUnavailableError naming the server, within the
            # bound (the blocking call by keepalive, the future by TCP_USER_TIMEOUT).
            blocking = caller.submit(client.sleep, keepalive.DEAD_AFTER + 4)
            time.sleep(0.5)
            with _cut_off(1):
                cut = time.monotonic()
                future = client.futures.echo(2)
                for call in (blocking, future):
                    with pytest.raises(courier.ServerUnavailableError) as failed:
                        call.result(timeout=keepalive.DEAD_AFTER + 6)
                    assert address in str(failed.value)
                    assert "the server's host stopped answering" in str(failed.value)
                assert time.monotonic() - cut < keepalive.DEAD_AFTER + 3

            # Back on the network: the next calls connect again.
            assert client.echo(3) == 3
            assert caller.submit(client.echo, 4).result(timeout=10) == 4
            assert client.futures.echo(5).result(timeout=10) == 5
    finally:
        server.stdin.close()
        server.wait(timeout=30)
