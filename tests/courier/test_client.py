"""courier.Client: pickling, threads, lazy connection, values on the wire."""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import pickle
import resource
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import courier
from courier import transport
from tests.core.conftest import wait_until
from courier.transport import _here
from tests.courier.conftest import (FreezableRelay, NoServersHere, serve_add,
                                    serve_add_and_sleep)

def _call_in_child(client, queue):
    queue.put(client.add(20, 22))


def test_client_pickled_into_another_process_works(server):
    context = multiprocessing.get_context('spawn')
    queue = context.Queue()
    client = courier.Client(server.address, call_timeout=30)
    client.add(0, 0)  # Connected in this process first: the pickle must not carry that.
    child = context.Process(target=_call_in_child, args=(client, queue))
    child.start()
    try:
        assert queue.get(timeout=60) == 42
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0


def test_pickling_is_cheap_and_connects_lazily(server):
    client = courier.Client(server.address)
    assert client._transport is None  # pylint: disable=protected-access
    clone = pickle.loads(pickle.dumps(client))
    assert clone._transport is None  # pylint: disable=protected-access
    assert len(pickle.dumps(client)) < 500
    assert clone.add(1, 2) == 3
    assert clone._transport is not None  # pylint: disable=protected-access


def test_address_callable_is_resolved_once_at_the_first_call(server, monkeypatch):
    calls = []

    def address():
        calls.append(1)
        return server.address

    client = courier.Client(address)
    assert calls == []
    assert client.add(1, 1) == 2 and client.add(2, 2) == 4
    assert calls == [1]
    assert repr(client) == f'courier.Client({server.address!r})'
    # Once resolved, a pickle carries the string.
    assert pickle.loads(pickle.dumps(client))._address == server.address  # pylint: disable=protected-access


def test_picklable_address_callable_travels_unresolved(server):
    client = courier.Client(functools.partial(str, server.address))
    clone = pickle.loads(pickle.dumps(client))
    assert isinstance(clone._address, functools.partial)  # pylint: disable=protected-access
    assert clone.add(5, 5) == 10


def test_many_threads_share_one_client(server, monkeypatch):
    connects = []
    real_connect = transport.connect
    monkeypatch.setattr(transport, 'connect',
                        lambda *a, **k: connects.append(1) or real_connect(*a, **k))
    client = courier.Client(server.address, call_timeout=30)
    threads_count, calls_each = 16, 40
    barrier = threading.Barrier(threads_count)
    failures = []

    def work(worker):
        barrier.wait()  # All threads race for the first (lazy) connection.
        for i in range(calls_each):
            if i % 2:
                result = client.futures.add(worker, i).result()
            else:
                result = client.add(worker, i)
            if result != worker + i:
                failures.append((worker, i, result))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert len(connects) == 1


def test_keyword_arguments_and_none(server):
    client = courier.Client(server.address)
    assert client.echo(1, 2, key='value') == ((1, 2), {'key': 'value'})
    assert client.echo(None) is None


def test_lambdas_and_local_classes_travel_via_cloudpickle(server):
    class Local:
        def __init__(self, value):
            self.value = value

    server.Bind('apply', lambda fn, x: fn(x))
    client = courier.Client(server.address)
    assert client.apply(lambda x: x * 3, 5) == 15
    assert client.echo(Local(7)).value == 7


def test_arrays_round_trip_writable_and_exact(server):
    client = courier.Client(server.address)
    values = {
        'big': np.random.default_rng(0).random((300, 200)),
        'fortran': np.asfortranarray(np.arange(30000.0).reshape(100, 300)),
        'strided': np.arange(100000)[::3],
        'small': np.arange(5, dtype=np.int8),
        'bytes': b'\x00' * 100000,
        'bytearray': bytearray(b'\x01' * 100000),
    }
    echoed = client.echo(values)
    for name in ('big', 'fortran', 'strided', 'small'):
        np.testing.assert_array_equal(echoed[name], values[name])
        assert echoed[name].dtype == values[name].dtype
        assert echoed[name].flags.writeable, name
        echoed[name][0] = 1  # Writable like a local array.
    assert echoed['fortran'].flags.f_contiguous
    assert echoed['bytes'] == values['bytes'] and echoed['bytearray'] == values['bytearray']


def test_import_courier_is_light():
    code = ('import sys, courier; '
            'print(sorted(m for m in ("launchpad", "grpc", "numpy", "cloudpickle") '
            'if m in sys.modules))')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == '[]'


# Runs in a fresh interpreter: whether gRPC was used before the fork is the point.
_FORK_SCRIPT = '''
import multiprocessing, sys
import courier

def serve(ready, stop):
    server = courier.Server()
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    ready.put(server.address)
    stop.wait()
    server.Stop()

def call_in_child(client, results):
    results.put(client.add(3, 4))

if __name__ == '__main__':
    spawn = multiprocessing.get_context('spawn')
    ready, stop = spawn.Queue(), spawn.Event()
    server = spawn.Process(target=serve, args=(ready, stop))
    server.start()
    try:
        client = courier.Client(ready.get(timeout=60), call_timeout=30)
        if sys.argv[1] == 'used-before-fork':
            assert client.add(1, 1) == 2
        fork = multiprocessing.get_context('fork')
        results = fork.Queue()
        child = fork.Process(target=call_in_child, args=(client, results))
        child.start()
        print(results.get(timeout=60), client.add(5, 5))
        child.join(timeout=30)
    finally:
        stop.set()
        server.join(timeout=30)
'''


@pytest.mark.parametrize('scenario, environment', [
    ('unused-before-fork', {}),
    ('used-before-fork', {}),  # The framed protocol reconnects in the child by itself.
])
def test_client_works_in_a_forked_child(scenario, environment, tmp_path, subprocess_env):
    script = tmp_path / 'fork_script.py'
    script.write_text(_FORK_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), scenario], capture_output=True, text=True, timeout=120,
        check=False, env={**subprocess_env, **environment})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ['7', '10']


# ----- releasing a client -----------------------------------------------------------------------

def _resources():
    """The client threads and the open file descriptors of this process."""
    import psutil  # pylint: disable=import-outside-toplevel
    threads = [thread for thread in threading.enumerate()
               if thread.name.startswith(('courier-client', 'courier-deadlines', 'courier-fetch'))]
    return len(threads), psutil.Process().num_fds()


def _use(client):
    assert client.add(1, 2) == 3
    assert client.futures.add(2, 3).result(timeout=30) == 5


def test_close_releases_the_client_and_later_calls_fail_clearly(server):
    client = courier.Client(server.address, call_timeout=30)
    _use(client)
    client.close()
    for call in (lambda: client.add(1, 2), lambda: client.futures.add(1, 2).result(timeout=30),
                 lambda: courier.list_methods(client)):
        with pytest.raises(courier.ServerUnavailableError, match='closed') as info:
            call()
        assert server.address in str(info.value)
    client.close()  # Twice is harmless.
    with courier.Client(server.address) as fresh:
        assert fresh.add(2, 2) == 4
    with pytest.raises(courier.ServerUnavailableError, match="'add'.*closed"):
        fresh.add(2, 2)
    unused = courier.Client(server.address)
    unused.close()  # Never connected: its calls still fail.
    with pytest.raises(courier.ServerUnavailableError, match='closed'):
        unused.add(1, 1)


def test_a_future_in_flight_fails_when_its_client_closes(server, transport_kind):
    client = courier.Client(server.address, call_timeout=30)
    future = client.futures.sleep(1)
    client.close()
    if transport_kind == 'in_process':  # Holds nothing of the client: it completes.
        assert future.result(timeout=30) == 'slept'
        return
    with pytest.raises(courier.ServerUnavailableError):
        future.result(timeout=30)


def test_dropped_clients_release_their_connections_and_threads(server):
    import gc  # pylint: disable=import-outside-toplevel
    _use(courier.Client(server.address, call_timeout=30))  # Warms up what every client shares.
    gc.collect()
    threads, fds = _resources()
    for _ in range(30):
        client = courier.Client(server.address, call_timeout=30)
        _use(client)
        del client
    gc.collect()
    assert wait_until(lambda: _resources()[0] <= threads + 2, timeout=20), _resources()
    assert wait_until(lambda: _resources()[1] <= fds + 4, timeout=20), (fds, _fds())


def _fds():
    import os  # pylint: disable=import-outside-toplevel
    return sorted(os.readlink(f'/proc/self/fd/{fd}') for fd in os.listdir('/proc/self/fd')
                  if os.path.exists(f'/proc/self/fd/{fd}'))


def test_a_client_dropped_with_a_future_in_flight_still_answers_it(server):
    import gc  # pylint: disable=import-outside-toplevel
    future = courier.Client(server.address, call_timeout=30).futures.sleep(0.3)
    gc.collect()
    assert future.result(timeout=30) == 'slept'


@pytest.mark.grpc_only
def test_a_large_result_arriving_after_close_fails_its_future(server):
    import time  # pylint: disable=import-outside-toplevel
    server.Bind('big_later', lambda: time.sleep(0.5) or np.ones(5 << 20, dtype=np.uint8))
    client = courier.Client(server.address, call_timeout=30)
    assert client.futures.big_later().result().nbytes == 5 << 20  # Fetching works at all.
    future = client.futures.big_later()
    client.close()
    with pytest.raises(courier.ServerUnavailableError, match="'big_later'"):
        future.result(timeout=30)


def test_a_completed_future_is_not_kept_until_its_deadline(server):
    import gc  # pylint: disable=import-outside-toplevel
    import weakref  # pylint: disable=import-outside-toplevel
    client = courier.Client(server.address, call_timeout=600)
    future = client.futures.echo(np.ones(1000))
    assert future.result(timeout=30).sum() == 1000
    finished = weakref.ref(future)
    del future
    gc.collect()
    assert finished() is None  # Nor its result, which may be large.


class _Resolver(courier.AddressResolver):
    """Resolves to ``address``; starts the server through ``start`` at its third retry."""

    def __init__(self, address, start=None):
        self.address = address
        self.start = start
        self.retries = 0

    def __call__(self):
        return self.address

    def retry(self, elapsed):
        self.retries += 1
        if self.retries == 3:
            self.start()
        return self.retries <= 3

    def __getstate__(self):
        return {'address': self.address, 'start': None, 'retries': 0}


def test_an_address_resolver_has_a_call_that_never_reached_its_server_tried_again(
        make_server, socket_dir):
    address = f'unix:{socket_dir}/later.sock'
    servers = []
    resolver = _Resolver(address, start=lambda: servers.append(
        serve_add(make_server, address=address)))
    client = courier.Client(resolver, call_timeout=20, wait_for_ready=False)
    assert client.add(1, 2) == 3
    assert resolver.retries == 3 and len(servers) == 1
    # A pickled client carries the resolver, not the address it resolved to.
    copy = pickle.loads(pickle.dumps(client))
    assert isinstance(copy.address, _Resolver) and copy.add(2, 2) == 4
    # A call on a connection that has carried calls may have reached the server: never retried.
    servers[0].Stop()
    with pytest.raises(courier.ServerUnavailableError):
        client.add(3, 3)
    assert resolver.retries == 3
    assert courier.AddressResolver().retry(0.0) is False  # The default never retries.



class _Moving(courier.AddressResolver):
    """Resolves to ``address`` as it is now; any call that lost its server goes again."""

    def __init__(self, address):
        self.address = address

    def __call__(self):
        return self.address

    def resends(self, method):
        return True

    def resend(self, method, sent):
        return sent < 3


def test_redial_sends_calls_hung_on_a_silent_server_to_the_one_found_next(make_server,
                                                                         socket_dir):
    """A server gone without a reset (its host or pod lost) leaves its connections open and
    silent: calls on them wait out their timeout. `redial()` drops them: the calls, which the
    resolver sends again, reach the server found next at once, and so do later calls. Without
    it, the calls below would wait their 300 s."""
    old = serve_add(make_server, address=f'unix:{socket_dir}/old.sock')
    relay = FreezableRelay(f'{socket_dir}/old.sock')
    try:
        resolver = _Moving(relay.address)
        with courier.Client(resolver, call_timeout=300) as client:
            calling = concurrent.futures.ThreadPoolExecutor(1)  # (its thread's connection)
            assert calling.submit(client.add, 1, 1).result(timeout=30) == 2
            assert client.futures.add(1, 1).result(timeout=30) == 2
            relay.freeze()
            resolver.address = serve_add(make_server).address  # its successor
            hung = calling.submit(client.add, 1, 2)
            future = client.futures.add(2, 3)
            assert not wait_until(hung.done, timeout=0.5) and not future.done()
            client.redial()
            assert hung.result(timeout=30) == 3 and future.result(timeout=30) == 5
            assert client.add(2, 2) == 4 and client.address == resolver.address
    finally:
        relay.close()
        old.Stop()


class _Resending(courier.AddressResolver):
    """Resolves to ``first`` once, then to ``then``; re-sends each call once sent (attempts=1:
    only calls known never to have gone out go again), noting what it was asked."""

    def __init__(self, first, then):
        self.addresses = [first, then]
        self.asked = []

    def __call__(self):
        return self.addresses.pop(0) if len(self.addresses) > 1 else self.addresses[0]

    def resends(self, method):
        return True

    def resend(self, method, sent):
        self.asked.append((method, sent))
        return sent < 1


def test_a_call_a_dying_server_closed_before_it_went_out_is_not_counted_as_sent(
        make_server, socket_dir):
    """A restarting server's old socket may still take a connection and close it in the hello:
    the call never went out (``unsent``), so a resolver allowing one send sends it again."""
    dying_path = f'{socket_dir}/dying.sock'
    dying = socket.socket(socket.AF_UNIX)
    dying.bind(dying_path)
    dying.listen()
    closer = threading.Thread(target=lambda: dying.accept()[0].close())
    closer.start()
    plain = courier.Client(f'unix:{dying_path}', call_timeout=20, wait_for_ready=False)
    with pytest.raises(courier.ServerUnavailableError) as raised:
        plain.add(1, 2)
    closer.join()
    assert raised.value.unsent
    closer = threading.Thread(target=lambda: dying.accept()[0].close())
    closer.start()
    server = serve_add(make_server, address=f'unix:{socket_dir}/new.sock')
    resolver = _Resending(f'unix:{dying_path}', server.address)
    client = courier.Client(resolver, call_timeout=20, wait_for_ready=False)
    assert client.add(1, 2) == 3
    closer.join()
    assert resolver.asked == [('add', 0)]  # not ('add', 1): it was not sent
    # The same for a future: it goes again, to the new server, as not sent.
    closer = threading.Thread(target=lambda: dying.accept()[0].close())
    closer.start()
    resolver = _Resending(f'unix:{dying_path}', server.address)
    client = courier.Client(resolver, call_timeout=20, wait_for_ready=False)
    assert client.futures.add(2, 2).result(timeout=20) == 4
    closer.join()
    dying.close()
    assert resolver.asked == [('add', 0)]
    # With no server left, its failures to connect are forgiven a few times, then counted as
    # sends; past what the resolver allows, the future raises the error.
    server.Stop()
    with pytest.raises(courier.ServerUnavailableError):
        client.futures.add(3, 3).result(timeout=20)
    assert resolver.asked[-1] == ('add', 1) and set(resolver.asked[:-1]) == {('add', 0)}

class _ResendingOnce(_Resending):
    """As _Resending, but lets a call that may have reached its server go once more."""

    def resend(self, method, sent):
        self.asked.append((method, sent))
        return sent <= 1


def test_a_connected_clients_blocking_calls_keep_their_outcomes(make_server, socket_dir,
                                                                monkeypatch):
    """Once connected, a blocking call goes straight to its transport, without the retry loop
    of a first call: a remote error, a timeout naming the method (the connection then serves
    the next call), a server dying during the call (re-sent where the resolver allows, else
    ServerUnavailableError) all come out as from the loop, and the calls are counted."""
    monkeypatch.setattr(_here, 'servers', NoServersHere())  # Through the socket.
    first = serve_add_and_sleep(make_server, f'unix:{socket_dir}/first.sock')
    second = serve_add_and_sleep(make_server, f'unix:{socket_dir}/second.sock')
    resolver = _ResendingOnce(first.address, second.address)
    # (Each send of a call may take call_timeout: the sleeps leave seconds to spare either way
    # on a busy machine, for the stop to come during the first send, and for the second.)
    client = courier.Client(resolver, call_timeout=4, wait_for_ready=False)
    assert client.add(1, 2) == 3
    with pytest.raises(TypeError):
        client.add(1, 'x')
    with pytest.raises(courier.CallTimeoutError, match="'sleep'.*Deadline Exceeded"):
        client.sleep(10)
    assert client.add(2, 2) == 4 and resolver.asked == []
    threading.Timer(0.5, first.Stop, kwargs={'grace': 0}).start()
    assert client.sleep(2.5) == 'slept'  # Its server died during it: sent again, to `second`.
    assert resolver.asked == [('sleep', 1)] and client.add(3, 3) == 6
    counts = {table['role']: table['methods'] for table in courier.metrics.snapshot()
              if table['address'] == second.address}
    assert counts['client']['add']['calls'] == 1 and counts['client']['sleep']['calls'] == 1
    plain = courier.Client(second.address, call_timeout=20, wait_for_ready=False)
    assert plain.add(1, 1) == 2
    threading.Timer(0.5, second.Stop, kwargs={'grace': 0}).start()
    with pytest.raises(courier.ServerUnavailableError, match="'sleep'.*went away"):
        plain.sleep(2.5)


class _Gone(courier.ServerUnavailableError):
    pass


class _Explaining(courier.AddressResolver):
    """Resolves to ``address``; explains a missing server as ``_Gone``, noting each thread
    that asked."""

    def __init__(self, address):
        self.address = address
        self.threads = []

    def __call__(self):
        return self.address

    def explain(self, error):
        self.threads.append(threading.current_thread())
        return _Gone(f'explained: {error}')


def test_an_address_resolver_explains_a_call_that_found_no_server(make_server, socket_dir):
    """The first call on a connection whose server went away raises what the resolver says,
    sync or through its future (asked in the thread reading it, once per future)."""
    address = f'unix:{socket_dir}/gone.sock'
    server = serve_add(make_server, address=address)
    resolver = _Explaining(address)
    client = courier.Client(resolver, call_timeout=20, wait_for_ready=False)
    futures_client = courier.Client(resolver, call_timeout=20, wait_for_ready=False)
    assert client.add(1, 2) == 3 and futures_client.futures.add(1, 2).result() == 3
    server.Stop()
    with pytest.raises(_Gone, match='explained: .*unavailable') as raised:
        client.add(3, 3)
    assert isinstance(raised.value.__cause__, courier.ServerUnavailableError)
    future = futures_client.futures.add(3, 3)
    assert wait_until(future.done, timeout=20)
    assert resolver.threads == [threading.current_thread()]  # not explained where it failed
    assert isinstance(future.exception(), _Gone) and isinstance(future.exception(), _Gone)
    with pytest.raises(_Gone):
        future.result()
    assert resolver.threads == [threading.current_thread()] * 2
    assert courier.AddressResolver().explain(raised.value) is raised.value  # the default


@pytest.fixture
def more_than_1024_open_files():
    """Opens files until this process has descriptors above 1,024 (select()'s limit), raising
    the soft RLIMIT_NOFILE if needed; a socket opened now gets a descriptor beyond it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1024 + 256
    if soft != resource.RLIM_INFINITY and soft < 2 * wanted:
        if hard != resource.RLIM_INFINITY and hard < 2 * wanted:
            pytest.skip(f'the hard limit on open files ({hard}) is too low to open more than '
                        f'1,024 (raise it with ulimit -Hn)')
        resource.setrlimit(resource.RLIMIT_NOFILE, (2 * wanted, hard))
    files = []
    try:
        while not files or files[-1] < wanted:
            files.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in files:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_calls_work_in_a_process_with_more_than_1024_open_files(server,
                                                                more_than_1024_open_files):
    client = courier.Client(server.address, call_timeout=30)
    for _ in range(3):
        assert client.add(1, 2) == 3
        assert client.futures.add(3, 4).result(timeout=30) == 7
        time.sleep(0.1)  # Idle long enough for a blocking call to check its connection first.
    assert courier.list_methods(client) == ['add', 'echo', 'sleep']
    client.close()
