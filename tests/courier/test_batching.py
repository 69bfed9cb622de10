"""courier.batched_handler: concurrent calls gathered into batched calls."""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import pickle
import threading
import time

import cloudpickle
import numpy as np
import pytest

import courier

Pair = collections.namedtuple('Pair', ['left', 'right'])


def _call_concurrently(fn, argument_lists, kwargs_lists=None):
    """Calls fn from one thread per argument list; returns results (or exceptions)."""
    kwargs_lists = kwargs_lists or [{}] * len(argument_lists)
    with concurrent.futures.ThreadPoolExecutor(len(argument_lists)) as pool:
        futures = [pool.submit(fn, *args, **kwargs)
                   for args, kwargs in zip(argument_lists, kwargs_lists)]
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=20))
            except Exception as error:  # pylint: disable=broad-except
                outcomes.append(error)
        return outcomes


def test_full_batch_runs_once_with_stacked_arrays():
    seen = []

    @courier.batched_handler(batch_size=4, timeout=10)
    def double(x):
        seen.append(x.shape)
        return x * 2

    results = _call_concurrently(double, [(np.full(3, i),) for i in range(4)])
    assert seen == [(4, 3)]  # One call; a full batch does not wait for the timeout.
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full(3, 2 * i))


def test_nested_arguments_are_batched_leaf_by_leaf():
    seen = []

    @courier.batched_handler(batch_size=2, timeout=10)
    def handler(structure, scale, name=None):
        seen.append((structure, scale, name))
        return {'sum': structure['a'][0] + structure['a'][1][:, None], 'name': name}

    results = _call_concurrently(
        handler,
        [({'a': [np.ones(2), np.float32(1)], 'b': Pair('x', 1)}, 10),
         ({'a': [np.zeros(2), np.float32(2)], 'b': Pair('y', 2)}, 20)],
        [{'name': 'first'}, {'name': 'second'}])
    (structure, scale, name), = seen
    assert sorted(scale) == [10, 20] and sorted(name) == ['first', 'second']
    assert structure['a'][0].shape == (2, 2) and structure['a'][1].shape == (2,)
    assert isinstance(structure['b'], Pair) and sorted(structure['b'].left) == ['x', 'y']
    by_name = {result['name']: result['sum'] for result in results}
    np.testing.assert_array_equal(by_name['first'], [2, 2])
    np.testing.assert_array_equal(by_name['second'], [2, 2])


def test_partial_batch_runs_after_the_timeout():
    sizes = []

    @courier.batched_handler(batch_size=8, timeout=datetime.timedelta(milliseconds=100))
    def handler(x):
        sizes.append(len(x))
        return list(x)

    start = time.monotonic()
    assert _call_concurrently(handler, [(1,), (2,), (3,)]) == [1, 2, 3]
    assert time.monotonic() - start >= 0.09
    assert sum(sizes) == 3


def test_pad_batch_fills_up_with_the_first_call():
    seen = []

    @courier.batched_handler(batch_size=4, timeout=0.05, pad_batch=True)
    def handler(x):
        seen.append(list(x))
        return [value * 10 for value in x]

    assert handler(7) == 70
    assert seen == [[7, 7, 7, 7]]


def test_max_parallelism_limits_concurrent_batches():
    running = [0]
    peak = [0]
    lock = threading.Lock()
    two_running = threading.Event()

    @courier.batched_handler(batch_size=1, max_parallelism=2, timeout=10)
    def handler(x):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == 2:
                two_running.set()
        two_running.wait(10)  # Gives a third batch every chance to start, were it allowed.
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return x

    assert _call_concurrently(handler, [(i,) for i in range(8)]) == list(range(8))
    assert peak[0] == 2


def test_exception_reaches_every_caller_in_the_batch():
    @courier.batched_handler(batch_size=3, timeout=10)
    def handler(x):
        raise ValueError(f'batch of {len(x)} failed')

    outcomes = _call_concurrently(handler, [(1,), (2,), (3,)])
    assert all(isinstance(o, ValueError) and 'batch of 3' in str(o) for o in outcomes)


def test_mismatched_arguments_fail_every_caller_clearly():
    @courier.batched_handler(batch_size=2, timeout=10)
    def handler(*args):
        return list(args[0])

    outcomes = _call_concurrently(handler, [(1,), (1, 2)])
    assert all(isinstance(o, ValueError) and 'same arguments' in str(o) for o in outcomes)

    @courier.batched_handler(batch_size=2, timeout=10)
    def arrays(x):
        return x

    outcomes = _call_concurrently(arrays, [(np.ones(2),), (np.ones(3),)])
    assert all(isinstance(o, ValueError) and 'argument 0' in str(o) for o in outcomes)


@pytest.mark.parametrize('result, message', [
    (5, 'cannot be split'), ([1], '1 entries for a batch of 2'), (np.ones(3), '3 entries')])
def test_results_that_cannot_be_split_fail_clearly(result, message):
    @courier.batched_handler(batch_size=2, timeout=10)
    def handler(x):
        return result

    outcomes = _call_concurrently(handler, [(1,), (2,)])
    assert all(message in str(o) for o in outcomes), outcomes


def test_tuple_and_none_results():
    @courier.batched_handler(batch_size=2, timeout=10)
    def pairs(x):
        return (np.array(x) + 1, list(x))

    assert sorted(_call_concurrently(pairs, [(1,), (2,)]), key=lambda r: r[1]) == [(2, 1), (3, 2)]

    @courier.batched_handler(batch_size=2, timeout=10)
    def nothing(x):
        del x

    assert _call_concurrently(nothing, [(1,), (2,)]) == [None, None]


class _Model:
    def __init__(self, offset):
        self.offset = offset
        self.batches = []

    @courier.batched_handler(batch_size=2, timeout=10)
    def compute(self, x):
        self.batches.append(list(x))
        return [value + self.offset for value in x]


def test_decorated_methods_batch_per_instance():
    first, second = _Model(100), _Model(200)
    assert sorted(_call_concurrently(first.compute, [(1,), (2,)])) == [101, 102]
    assert sorted(_call_concurrently(second.compute, [(1,), (2,)])) == [201, 202]
    assert first.compute is first.compute  # One batcher per instance.
    assert len(first.batches) == 1 and len(second.batches) == 1


def test_batched_method_served_by_courier(make_server):
    model = _Model(1000)
    server = courier.Server.from_object(model, thread_pool_size=8)
    try:
        server.Start()
        client = courier.Client(server.address, call_timeout=20)
        futures = [client.futures.compute(i) for i in range(4)]
        assert [f.result() for f in futures] == [1000, 1001, 1002, 1003]
        assert sorted(len(batch) for batch in model.batches) == [2, 2]
    finally:
        server.Stop()


@pytest.mark.parametrize('kwargs', [
    {'batch_size': 0}, {'batch_size': 2, 'max_parallelism': 0},
    {'batch_size': 2, 'timeout': -1}, {'batch_size': True}])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        courier.batched_handler(**kwargs)


def test_decorator_keeps_the_function_metadata():
    @courier.batched_handler(batch_size=2)
    def documented(x):
        """Docs."""
        return x

    assert documented.__name__ == 'documented' and documented.__doc__ == 'Docs.'


@courier.batched_handler(batch_size=2, timeout=0.05)
def _module_level(x):
    return list(x)


class _QuickModel(_Model):
    @courier.batched_handler(batch_size=2, timeout=0.05)
    def compute(self, x):
        self.batches.append(list(x))
        return [value + self.offset for value in x]


def test_batched_handlers_pickle():
    model = _QuickModel(5)
    assert model.compute(1) == 6  # Caches the instance's own batched handler.
    clone = pickle.loads(pickle.dumps(model))
    assert clone.compute(2) == 7 and clone.batches == [[1], [2]]
    assert model.batches == [[1]]
    assert pickle.loads(pickle.dumps(_module_level)) is _module_level
    local = courier.batched_handler(batch_size=3, timeout=0.05)(lambda x: [v * 2 for v in x])
    copy = cloudpickle.loads(cloudpickle.dumps(local))
    assert copy(4) == 8 and copy.batch_size == 3 and copy is not local
