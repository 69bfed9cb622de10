"""courier.metrics: every server and client counts its calls, errors and latencies per method."""

from __future__ import annotations

import gc
import os
import subprocess
import threading
import sys

import pytest

import courier
from courier import metrics


def _table(role: str, address: str, owner=None) -> dict:
    found = [t for t in metrics.snapshot()
             if t['role'] == role and t['address'] == address and t['owner'] == owner]
    assert len(found) == 1, metrics.snapshot()
    return found[0]['methods']


def test_server_and_client_count_calls_errors_and_latency_per_method(server):
    client = courier.Client(server.address)
    assert client.add(1, 2) == 3
    assert client.futures.add(3, 4).result() == 7
    with pytest.raises(TypeError):
        client.add(1)  # raises in the server
    served, made = _table('server', server.address), _table('client', server.address)
    for methods in (served, made):
        assert methods['add']['calls'] == 3
        assert methods['add']['errors'] == 1
        assert methods['add']['seconds'] > 0
        assert sum(methods['add']['buckets']) == 3
        assert len(methods['add']['buckets']) == len(metrics.LATENCY_BUCKETS)


def test_a_call_that_times_out_is_a_client_error_and_a_served_call(server):
    client = courier.Client(server.address, call_timeout=0.05)
    with pytest.raises(courier.CallTimeoutError):
        client.sleep(0.5)
    made = _table('client', server.address)['sleep']
    assert (made['calls'], made['errors']) == (1, 1)


def test_unknown_methods_are_not_counted_by_the_server(server):
    client = courier.Client(server.address)
    with pytest.raises(courier.UnknownMethodError):
        client.no_such_method()
    assert 'no_such_method' not in _table('server', server.address)
    assert _table('client', server.address)['no_such_method']['errors'] == 1


def test_tables_carry_their_owner_and_are_shared_per_address_and_owner(server, monkeypatch):
    monkeypatch.setattr(metrics, '_owner', lambda: 'node-a')
    first, second = courier.Client(server.address), courier.Client(server.address)
    first.add(1, 1)
    second.add(2, 2)
    assert _table('client', server.address, 'node-a')['add']['calls'] == 2


def test_a_table_goes_with_the_last_server_or_client_holding_it(socket_dir):
    server = courier.Server(address=f'unix:{socket_dir}/gone.sock')
    try:
        server.Bind('f', lambda: 1)
        server.Start()
        client = courier.Client(server.address)
        client.f()
        assert {t['role'] for t in metrics.snapshot() if t['address'] == server.address} == {
            'server', 'client'}
    finally:
        server.Stop()
    address = server.address
    del server, client
    gc.collect()
    assert not [t for t in metrics.snapshot() if t['address'] == address]


def test_counting_can_be_turned_off_for_a_process(server, subprocess_env):
    code = ('import courier, courier.metrics as m\n'
            f'c = courier.Client({server.address!r})\n'
            'assert c.add(1, 2) == 3\n'
            'print(m.snapshot())\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env={**subprocess_env, 'COURIER_METRICS': 'off'}, check=True)
    assert done.stdout.strip() == '[]'


def test_a_forked_child_counts_its_own_calls(make_server, socket_dir):
    server = make_server(address=f'unix:{socket_dir}/fork.sock')
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    client = courier.Client(server.address)
    client.add(1, 1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its table starts empty
        try:
            client.add(2, 2)
            calls = _table('client', server.address)['add']['calls']
            os.write(write, str(calls).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        assert f.read() == '1'
    assert _table('client', server.address)['add']['calls'] == 1


def test_calls_from_many_threads_are_all_counted(server):
    client = courier.Client(server.address)
    client.add(1, 1)  # connected; counted from here (an earlier test's server or client of a
    # reused port that is not yet collected shares the table: tables go by address)

    def counts():
        tables = {role: _table(role, server.address)['add'] for role in ('server', 'client')}
        return {role: (added['calls'], sum(added['buckets'])) for role, added in tables.items()}

    before = counts()
    threads = [threading.Thread(target=lambda: [client.add(1, 1) for _ in range(200)])
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = counts()
    for role in ('server', 'client'):
        assert [a - b for a, b in zip(after[role], before[role])] == [1600, 1600], role


def test_calls_after_close_are_client_errors(server):
    client = courier.Client(server.address)
    assert client.add(1, 1) == 2
    client.close()
    with pytest.raises(courier.ServerUnavailableError):
        client.add(2, 2)
    with pytest.raises(courier.ServerUnavailableError):
        client.futures.add(3, 3).result()
    made = _table('client', server.address)['add']
    # The future failed without a response, which only a sync call counts (see the client).
    assert (made['calls'], made['errors']) == (2, 1)
    assert _table('server', server.address)['add']['calls'] == 1


def test_a_client_that_moves_to_a_new_server_counts_its_calls_there(make_server, socket_dir):
    addresses = iter([f'unix:{socket_dir}/old.sock', f'unix:{socket_dir}/new.sock'])
    current = [next(addresses)]
    old = make_server(address=current[0])
    old.Bind('add', lambda x, y: x + y)
    old.Start()
    client = courier.Client(lambda: current[0], wait_for_ready=False)
    assert client.add(1, 1) == 2
    old.Stop()
    with pytest.raises(courier.ServerUnavailableError):
        client.add(2, 2)  # counted as failed, and the next call resolves the address again
    made = _table('client', old.address)['add']
    assert (made['calls'], made['errors']) == (2, 1)
    current[0] = next(addresses)
    new = make_server(address=current[0])
    new.Bind('add', lambda x, y: x + y)
    new.Start()
    assert client.add(3, 3) == 6
    made = _table('client', new.address)['add']
    assert (made['calls'], made['errors']) == (1, 0)


def test_threads_that_ended_keep_their_counts_and_leave_no_counts_of_their_own():
    table = metrics.CallTable('client', 'unix:/nowhere', None)
    for index in range(50):  # one thread after another, each gone before the next starts
        worker = threading.Thread(target=table.record,
                                  args=('f', metrics.clock(), index % 10 == 0))
        worker.start()
        worker.join()
    table.record('g', metrics.clock(), False)  # this thread's counts fold the ended ones
    assert len(table._shards) == 1  # pylint: disable=protected-access  (this thread's only)
    methods = table.read()['methods']
    assert (methods['f']['calls'], methods['f']['errors']) == (50, 5)
    assert sum(methods['f']['buckets']) == 50 and methods['g']['calls'] == 1
