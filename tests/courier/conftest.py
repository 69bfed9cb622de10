"""Fixtures for courier's tests: servers that are always stopped, leak checks.

Every test taking the ``server`` fixture runs once per transport: courier's framed
protocol over TCP (what clients on other hosts use), gRPC over TCP (the same server,
its clients speaking gRPC, which the server relays to its gRPC service), the framed
protocol over a Unix socket, and the in-process path (a client in the server's own
process). Tests that speak gRPC themselves are marked ``grpc_only``.
"""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import pathlib
import shutil
import socket
import tempfile
import threading
import time

import pytest

import courier
from courier.transport import _here
from courier.transport import frames
from courier.transport import same_host
from tests.leftovers import no_new_children

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_SECONDS = 60


def pytest_collection_modifyitems(items):
    """Gives every courier test without its own timeout a default one: none may hang."""
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker('timeout') is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_SECONDS))


TRANSPORTS = ('tcp', 'grpc', 'unix', 'in_process')

_hypothesis_home = None  # pytest_configure makes it


def pytest_configure(config):
    """Hypothesis (test_properties.py) writes caches, and patches for failing examples, into a
    directory of the working directory unless told another: a temporary one, removed at the end.
    Made here, not on import: processes that import this module to unpickle a test's function
    (spawned children) would leave theirs behind, and pay for importing Hypothesis."""
    global _hypothesis_home  # pylint: disable=global-statement
    from hypothesis import configuration  # pylint: disable=import-outside-toplevel
    _hypothesis_home = tempfile.mkdtemp(prefix='courier-hypothesis-')
    configuration.set_hypothesis_home_dir(_hypothesis_home)
    config.addinivalue_line(
        'markers', 'grpc_only: the test talks gRPC to the server fixture itself')


def pytest_unconfigure(config):
    del config
    if _hypothesis_home is not None:
        shutil.rmtree(_hypothesis_home, ignore_errors=True)


def pytest_generate_tests(metafunc):
    if 'server' in metafunc.fixturenames:
        grpc_only = metafunc.definition.get_closest_marker('grpc_only') is not None
        metafunc.parametrize('transport_kind', ('grpc',) if grpc_only else TRANSPORTS,
                             indirect=True)


class NoServersHere(dict):
    """Stands in for the in-process registry: every client then goes through the socket."""

    def __setitem__(self, key, value):
        pass


def serve_add(make_server, **kwargs) -> courier.Server:
    """A started server (``make_server(**kwargs)``) with the method ``add``."""
    server = make_server(**kwargs)
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    return server


def serve_add_and_sleep(make_server, address: str, **kwargs) -> courier.Server:
    """A started server at ``address`` with methods ``add`` and ``sleep``."""
    server = make_server(address=address, **kwargs)
    server.Bind('add', lambda x, y: x + y)
    server.Bind('sleep', lambda seconds: time.sleep(seconds) or 'slept')
    server.Start()
    return server


def free_tcp_address() -> str:
    """A loopback ``host:port`` nobody listens on now, for a server a test starts later."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return f'127.0.0.1:{probe.getsockname()[1]}'


def raw_connect(address: str, timeout: float = 20) -> socket.socket:
    """A plain socket connected to a server's ``unix:/path`` or ``host:port`` address."""
    if address.startswith('unix:'):
        sock = socket.socket(socket.AF_UNIX)
        target = address[len('unix:'):]
    else:
        sock = socket.socket()
        host, port = address.rsplit(':', 1)
        target = (host, int(port))
    sock.settimeout(timeout)
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock


def hello_frame(mode: int = frames.SYNC, token: bytes = b'') -> bytes:
    """The bytes of a framed client's hello."""
    return b''.join(frames.encode(frames.HELLO, mode, frames.VERSION, token, frames.MAGIC))


@pytest.fixture
def transport_kind(request, monkeypatch) -> str:
    """Which transport the ``server`` fixture's clients use (see TRANSPORTS)."""
    kind = getattr(request, 'param', 'grpc')
    if kind == 'unix':
        monkeypatch.setattr(_here, 'servers', NoServersHere())
    elif kind == 'tcp':
        over_tcp_only(monkeypatch)
    elif kind == 'grpc':
        speak_grpc(monkeypatch)
    return kind


def over_tcp_only(monkeypatch) -> None:
    """Turns the same-host upgrade off in this process (courier/transport/same_host.py): its
    TCP clients then call its TCP servers over TCP, as clients on other hosts do."""
    monkeypatch.setattr(same_host, 'ENABLED', False)


def speak_grpc(monkeypatch) -> None:
    """Makes the test's ``courier.Client(...)`` of a TCP address (or of a callable one) speak
    gRPC, the servers' gRPC service: ``protocol='grpc'`` unless the test passes another."""
    monkeypatch.setattr(courier, 'Client', _GrpcClient)


class _GrpcClient(courier.Client):
    """A ``courier.Client`` whose ``protocol`` defaults to 'grpc' unless its address is unix:."""

    def __init__(self, server_address, *args, protocol=None, **kwargs):
        unix = isinstance(server_address, str) and server_address.startswith('unix:')
        super().__init__(server_address, *args, protocol=protocol or (None if unix else 'grpc'),
                         **kwargs)


@pytest.fixture
def socket_dir():
    """A private directory with a short path (Unix socket paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix='courier-')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Fails a test that leaves a child process behind."""
    # multiprocessing's helper lives as long as this process by design: not a leak.
    multiprocessing.resource_tracker.ensure_running()
    with no_new_children(grace=0):
        yield


@pytest.fixture
def make_server():
    """Returns a factory of courier servers that are stopped after the test."""
    servers = []

    def make(*args, **kwargs) -> courier.Server:
        server = courier.Server(*args, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.Stop()


@pytest.fixture
def server(make_server, transport_kind, socket_dir):
    """A started server with a few methods bound, reached through ``transport_kind``."""
    server = make_server() if transport_kind in ('tcp', 'grpc') else make_server(
        address=f'unix:{socket_dir}/server.sock')
    server.Bind('add', lambda x, y: x + y)
    server.Bind('echo', lambda *args, **kwargs: (args, kwargs) if kwargs or len(args) != 1
                else args[0])
    server.Bind('sleep', _sleep)
    server.Start()
    return server


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return 'slept'


@pytest.fixture
def subprocess_env():
    """Environment for a child Python process that imports this checkout's courier."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))
    return {**os.environ, 'PYTHONPATH': path}


class FreezableRelay:
    """A loopback TCP relay to the server at `path` (a Unix socket) that `freeze()` silences:
    it passes nothing on from then, and keeps every connection open. So a server's host or pod
    lost without a reset looks to its clients: their connections stay up, and nothing answers."""

    def __init__(self, path: str):
        self._path = path
        self._listener = socket.create_server(('127.0.0.1', 0))
        self.address = f'127.0.0.1:{self._listener.getsockname()[1]}'
        self._frozen = threading.Event()
        self._sockets = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def freeze(self) -> None:
        self._frozen.set()

    def close(self) -> None:
        for sock in [self._listener] + self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # (wakes the thread reading it)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(10)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(self._path)
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                thread = threading.Thread(target=self._pass, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pass(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
                if not data or self._frozen.is_set():
                    return  # (frozen: the bytes are dropped, the connections stay open)
                sink.sendall(data)
            except OSError:
                return
