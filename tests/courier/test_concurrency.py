"""Mixed concurrent traffic: results stay matched to their calls, nothing wedges."""

from __future__ import annotations

import concurrent.futures
import random
import threading

import numpy as np

import courier


def _fail(tag):
    raise ValueError(tag)


def test_mixed_concurrent_traffic(make_server):
    server = make_server(thread_pool_size=8)
    server.Bind('scale', lambda array, factor: array * factor)
    server.Bind('fail', _fail)
    server.Bind('wait', lambda seconds: threading.Event().wait(seconds))
    server.Start()
    clients = [courier.Client(server.address, call_timeout=30) for _ in range(3)]
    rng = random.Random(0)
    checks = []
    for i in range(300):
        client = rng.choice(clients)
        kind = rng.choice(['scale', 'scale', 'fail', 'wait', 'cancel'])
        if kind == 'scale':
            array = np.full(rng.choice([1, 1000, 100_000]), i, dtype=np.int64)
            checks.append(('scale', i, array.size, client.futures.scale(array, 2)))
        elif kind == 'fail':
            checks.append(('fail', i, None, client.futures.fail(f'tag-{i}')))
        elif kind == 'wait':
            checks.append(('wait', i, None, client.futures.wait(0.001)))
        else:
            future = client.futures.wait(0.05)
            future.cancel()
            checks.append(('cancel', i, None, future))
    for kind, i, size, future in checks:
        if kind == 'scale':
            result = future.result(timeout=30)
            assert result.size == size and (result == 2 * i).all()
        elif kind == 'fail':
            error = future.exception(timeout=30)
            assert isinstance(error, ValueError) and error.args == (f'tag-{i}',)
        elif kind == 'wait':
            assert future.result(timeout=30) is False
        else:
            assert future.cancelled() or future.result(timeout=30) is False
    # Still healthy afterwards.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda c: c.scale(np.ones(3), 3).sum(), clients * 4)) == [9.0] * 12
