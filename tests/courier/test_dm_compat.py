"""courier.Server and courier.Client with dm-launchpad's signatures and methods (issue 19)."""
import datetime
import pickle

import numpy as np
import pytest

import courier
from courier import serialization


class Callable:
    def __call__(self, x):
        return ('called', x)


def test_server_takes_a_name_first(make_server):
    server = make_server('my_server')
    assert server.name == 'my_server'
    assert "'my_server'" in repr(server)
    named_with_port = make_server('other', 0, 4)
    assert isinstance(named_with_port.port, int) and named_with_port.port > 0
    assert named_with_port.address.endswith(f':{named_with_port.port}')
    with pytest.raises(TypeError, match=r'courier.Server\(port=8080\)'):
        courier.Server(8080)


def test_server_methods_of_dm_launchpad(make_server):
    server = make_server()
    assert not server.has_started
    server.Bind('rebind', lambda: 1234, is_priority=True)
    server.BindHandler('twice', lambda x: 2 * x)
    server.Start()
    assert server.has_started
    client = courier.Client(server.address)
    assert client.rebind() == 1234 and client.twice(4) == 8
    server.Unbind('rebind')
    server.Unbind('never_bound')
    with pytest.raises(courier.UnknownMethodError, match="'rebind'"):
        client.rebind()
    assert courier.list_methods(client) == ['twice']
    server.SetIsHealthy(False)
    assert not server.is_healthy
    assert client.twice(1) == 2  # an unhealthy server still serves
    server.Stop()
    server.Join()
    assert server.has_started


def test_unix_server_has_no_port(make_server, socket_dir):
    assert make_server(address=f'unix:{socket_dir}/s.sock').port is None


@pytest.mark.parametrize('timeout', [0, 0.0, datetime.timedelta(0)])
def test_a_zero_call_timeout_means_no_deadline(server, timeout):
    client = courier.Client(server.address, call_timeout=timeout)
    assert client.sleep(0.2) == 'slept'
    assert client.futures.sleep(0.2).result() == 'slept'


def test_client_takes_dm_launchpads_arguments(server):
    client = courier.Client(server.address, False, 30, True, False, load_balancing_policy=None)
    assert client.add(1, 2) == 3
    client = courier.Client(server.address, chunk_tensors=True,
                            load_balancing_policy='round_robin', propagate_deadline=False)
    assert client.add(2, 2) == 4
    assert client.address == server.address
    with pytest.raises(TypeError, match='load_balancing_policy'):
        courier.Client(server.address, load_balancing_policy=3)


def test_futures_call_the_served_object(make_server):
    server = make_server()
    server.bind_object(Callable())
    server.Start()
    client = courier.Client(server.address)
    assert client(1) == ('called', 1)
    assert client.futures(2).result() == ('called', 2)


def test_compression_shrinks_large_values_and_round_trips():
    value = {'zeros': np.zeros(1 << 20), 'text': 'x' * 100_000}
    plain, plain_buffers = serialization.dumps(value, 'v')
    packed, packed_buffers = serialization.dumps(value, 'v', compress=True)
    assert serialization.is_compressed(packed) and not packed_buffers
    assert len(packed) * 100 < len(plain) + sum(b.nbytes for b in plain_buffers)
    restored = serialization.loads(packed, [], 'v')
    assert np.array_equal(restored['zeros'], value['zeros']) and restored['text'] == value['text']
    restored['zeros'][0] = 1  # writable, like received arrays
    small, _ = serialization.dumps(3, 'v', compress=True)  # stored, so the server answers in kind
    assert serialization.is_compressed(small) and serialization.loads(small, [], 'v') == 3


def test_a_compressing_client_sends_and_receives_compressed(server, monkeypatch):
    compressed = []
    original = serialization._compressed  # pylint: disable=protected-access

    def counting(data, buffers):
        compressed.append(len(data) + sum(b.nbytes for b in buffers))
        return original(data, buffers)

    monkeypatch.setattr(serialization, '_compressed', counting)
    array = np.arange(1 << 18) % 7
    client = courier.Client(server.address, compress=True)
    assert np.array_equal(client.echo(array), array)
    assert np.array_equal(client.futures.echo(array).result(), array)
    assert len(compressed) == 4  # each call and each result
    assert all(size > array.nbytes for size in compressed)
    compressed.clear()
    assert courier.Client(server.address).add(1, 1) == 2
    assert not compressed  # the default sends values as they are


def test_a_compressing_client_pickles_with_its_settings(server):
    client = pickle.loads(pickle.dumps(courier.Client(server.address, compress=True,
                                                      call_timeout=0)))
    assert client._compress and client._call_timeout is None  # pylint: disable=protected-access
    assert client.add(2, 3) == 5
