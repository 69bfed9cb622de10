"""courier.Server: binding, addresses and lifecycle."""

from __future__ import annotations

import os
import socket
import stat
import threading
import weakref

import pytest

import courier


def test_readme_example(make_server):
    server = make_server(port=None, thread_pool_size=16)
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    client = courier.Client(server.address, call_timeout=None, wait_for_ready=True)
    assert client.add(2, 3) == 5
    assert client.futures.add(4, 5).result() == 9
    assert courier.list_methods(client) == ['add']
    server.Stop()
    server.Join()


def test_address_is_final_before_start_and_reports_the_picked_port(make_server):
    server = make_server()
    host, port = server.address.rsplit(':', 1)
    assert host == '127.0.0.1' and int(port) > 0
    # The port is already bound: nobody else can take it before Start.
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(('127.0.0.1', int(port)))
    server.Bind('f', lambda: 1)
    server.Start()
    assert courier.Client(server.address).f() == 1


def test_explicit_port_and_its_release_on_stop(make_server):
    first = make_server()
    port = int(first.address.rsplit(':', 1)[1])
    first.Stop()
    second = make_server(port=port)
    assert second.address == f'127.0.0.1:{port}'


def test_binding_a_taken_port_fails_clearly(make_server):
    first = make_server()
    port = int(first.address.rsplit(':', 1)[1])
    with pytest.raises(OSError, match='in use'):
        courier.Server(port=port)


def test_address_argument_overrides_host_and_port(make_server):
    server = make_server(port=1, host='192.0.2.1', address='localhost:0')
    assert server.address.startswith('localhost:')
    server.Bind('f', lambda: 'ok')
    server.Start()
    assert courier.Client(server.address).f() == 'ok'


def test_ipv6_loopback(make_server):
    if not socket.has_ipv6:
        pytest.skip('no IPv6 on this machine')
    try:
        server = make_server(host='::1')
    except OSError:
        pytest.skip('IPv6 loopback is not configured')
    assert server.address.startswith('[::1]:')
    server.Bind('f', lambda: 6)
    server.Start()
    assert courier.Client(server.address).f() == 6


def test_unix_socket_round_trip_and_cleanup(make_server, tmp_path):
    path = tmp_path / 'server.sock'
    server = make_server(address=f'unix:{path}')
    assert server.address == f'unix:{path}'
    server.Bind('pid', os.getpid)
    server.Start()
    assert courier.Client(server.address).pid() == os.getpid()
    server.Stop()
    assert not path.exists()


@pytest.mark.parametrize('name', ['server.sock', 'x'])
def test_a_unix_sockets_file_appears_only_once_it_accepts_connections(make_server, socket_dir,
                                                                     monkeypatch, name):
    """A client that finds the socket file can connect: the file never exists unlistened
    (the registry of running programs lists a program by its observer's socket file)."""
    path = os.path.join(socket_dir, name)
    with open(path, 'w'):  # A stale file where the socket goes: replaced.
        pass
    seen_before_listening = []
    listen = socket.socket.listen

    def watching_listen(sock, *args):
        if sock.family == socket.AF_UNIX:
            seen_before_listening.append(_is_socket(path))
        return listen(sock, *args)

    monkeypatch.setattr(socket.socket, 'listen', watching_listen)
    server = make_server(address=f'unix:{path}')
    assert seen_before_listening == [False]
    assert sorted(os.listdir(socket_dir)) == [name]  # No temporary name left behind.
    server.Bind('name', lambda: name)
    server.Start()
    assert courier.Client(server.address).name() == name


def _is_socket(path: str) -> bool:
    return os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode)


def test_unix_socket_of_a_live_server_is_not_stolen(make_server, tmp_path):
    address = f'unix:{tmp_path / "server.sock"}'
    live = make_server(address=address)
    live.Bind('who', lambda: 'first')
    live.Start()
    with pytest.raises(OSError, match='another server is listening'):
        courier.Server(address=address)
    assert courier.Client(address).who() == 'first'


def test_unix_socket_path_too_long_is_refused(tmp_path):
    with pytest.raises(OSError, match='longer than'):
        courier.Server(address='unix:' + str(tmp_path / ('x' * 120)))


@pytest.mark.parametrize('address', ['nonsense', 'host:port', 'unix:', 'h:99999'])
def test_malformed_address_is_refused(address):
    with pytest.raises(ValueError, match='address'):
        courier.Server(address=address)


@pytest.mark.parametrize('kwargs', [{'thread_pool_size': 0}, {'port': -1}, {'port': 'x'}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        courier.Server(**kwargs)


@pytest.mark.parametrize('kwargs, env', [({'stall_timeout': 0}, {}), ({'hello_timeout': -1}, {}),
                                         ({}, {'COURIER_STALL_TIMEOUT': 'soon'})])
def test_bad_limits_are_refused_naming_the_limit(kwargs, env, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    name = next(iter(kwargs), None) or next(iter(env))
    with pytest.raises(ValueError, match=name):
        courier.Server(**kwargs)


def test_bind_validates(make_server):
    server = make_server()
    with pytest.raises(TypeError, match='not callable'):
        server.Bind('x', 42)
    with pytest.raises(TypeError, match='non-empty str'):
        server.Bind('', print)


def test_bind_replaces_and_works_after_start(server):
    client = courier.Client(server.address)
    server.Bind('late', lambda: 'v1')
    assert client.late() == 'v1'
    server.Bind('late', lambda: 'v2')
    assert client.late() == 'v2'


def test_start_is_idempotent_stop_too_and_restart_is_refused(make_server):
    server = make_server()
    server.Start()
    server.Start()
    server.Stop()
    server.Stop()
    with pytest.raises(RuntimeError, match='cannot be restarted'):
        server.Start()


def test_join_blocks_until_stop(make_server):
    server = make_server()
    server.Start()
    joined = threading.Event()
    joiner = threading.Thread(target=lambda: (server.Join(), joined.set()))
    joiner.start()
    assert not joined.wait(0.2)
    server.Stop()
    assert joined.wait(5)
    joiner.join()


def test_stop_without_start_releases_the_port(make_server):
    server = make_server()
    port = int(server.address.rsplit(':', 1)[1])
    server.Stop()
    server.Join()
    with socket.socket() as other:
        other.bind(('127.0.0.1', port))


def test_a_stopped_server_lets_what_it_served_be_freed(make_server):
    """A stopped server may be kept (by its owner, a launcher): the object it served is not, so
    that what the object holds (a Reverb writer's stream to its server, say) is freed with it."""

    class Served:
        def ping(self):
            return 'pong'

    served = Served()
    freed = threading.Event()
    weakref.finalize(served, freed.set)
    server = make_server()
    server.bind_object(served)
    server.Start()
    assert courier.Client(server.address).ping() == 'pong'
    del served
    assert not freed.is_set()  # the running server holds it
    server.Stop()
    assert freed.is_set()


class _Node:
    """An object as launchpad would serve it."""

    def __init__(self):
        self.server = None
        self.data = 'not callable'

    def public(self, x):
        return x * 2

    def _private(self):
        return 'hidden'

    def run(self):
        raise AssertionError('run must never be bound')

    @property
    def handler(self):
        return lambda: 'from property'

    @staticmethod
    def static():
        return 'static'

    def __call__(self, x):
        return x + 1


def test_from_object_binds_the_public_callables(make_server):
    server = courier.Server.from_object(_Node())
    try:
        server.Start()
        client = courier.Client(server.address)
        assert courier.list_methods(client) == ['__call__', 'handler', 'public', 'static']
        assert client.public(21) == 42
        assert client.handler() == 'from property'
        assert client.static() == 'static'
        assert client(1) == 2
    finally:
        server.Stop()


def test_from_object_passes_server_kwargs(make_server, tmp_path):
    address = f'unix:{tmp_path / "s.sock"}'
    server = courier.Server.from_object(_Node(), address=address, thread_pool_size=2)
    try:
        assert server.address == address
    finally:
        server.Stop()


class _SelfServing:
    """Owns its server: binds, and starts it itself."""

    def __init__(self):
        self.server = None

    def set_courier_server(self, server):
        self.server = server
        server.Start()

    def ping(self):
        return 'pong'


def test_bind_object_hands_the_server_to_set_courier_server(make_server):
    node = _SelfServing()
    server = make_server()
    server.bind_object(node)
    assert node.server is server
    client = courier.Client(server.address, call_timeout=5)
    assert client.ping() == 'pong'
    assert courier.list_methods(client) == ['ping']


def test_bind_object_reports_a_failing_property(make_server):
    class Broken:
        @property
        def bad(self):
            raise KeyError('not ready')

    with pytest.raises(RuntimeError, match="attribute 'bad' raised KeyError"):
        make_server().bind_object(Broken())


def test_binding_a_function_serves_it_as_call(make_server):
    server = courier.Server.from_object(lambda x: -x)
    try:
        server.Start()
        assert courier.Client(server.address)(5) == -5
    finally:
        server.Stop()


def test_server_warns_when_reachable_without_a_token(make_server, caplog, monkeypatch):
    monkeypatch.delenv(courier.AUTH_TOKEN_ENV, raising=False)
    make_server(host='0.0.0.0')
    assert 'without an auth token' in caplog.text
    caplog.clear()
    make_server()
    assert 'without an auth token' not in caplog.text


def test_relative_unix_socket_path_is_reported_absolute(make_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = make_server(address='unix:relative.sock')
    assert server.address == f'unix:{tmp_path / "relative.sock"}'
    monkeypatch.chdir('/')
    server.Bind('f', lambda: 'found')
    server.Start()
    assert courier.Client(server.address).f() == 'found'
    server.Stop()
    assert not (tmp_path / 'relative.sock').exists()
