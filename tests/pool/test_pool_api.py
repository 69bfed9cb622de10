"""Every lp.Pool method against multiprocessing.Pool's results on the same inputs, on one
standalone local_mp pool; and the errors of bad input."""
from __future__ import annotations

import multiprocessing
import operator
import os
import pickle
import threading

import pytest

import courier
import launchpad as lp
from tests.leftovers import no_new_children

pytestmark = pytest.mark.timeout(120)


def square(x):
    return x * x


def fails_on_three(x):
    if x == 3:
        raise ValueError(f'three is bad ({x})')
    return -x


class Unpicklable(Exception):
    def __init__(self, lock):
        super().__init__('carries a lock')
        self.lock = lock


def raise_unpicklable():
    raise Unpicklable(threading.Lock())


_INITIALIZED = []


def remember(value):
    _INITIALIZED.append(value)


def initialized():
    return list(_INITIALIZED), os.getpid()


@pytest.fixture(scope='module')
def pools():
    """(our pool, multiprocessing's pool), two workers each."""
    with no_new_children():
        # Forked before ours starts its threads (a fork copies any lock a thread holds). Not
        # spawn: it would leave a resource tracker process behind for the rest of the run.
        theirs = multiprocessing.get_context('fork').Pool(2)
        ours = lp.Pool(2, launch_type='local_mp', initializer=remember, initargs=('init',))
        try:
            yield ours, theirs
        finally:
            ours.terminate()
            ours.join()
            theirs.terminate()
            theirs.join()


@pytest.mark.parametrize('chunksize', [None, 1, 3, 50])
@pytest.mark.parametrize('size', [0, 1, 17])
def test_map_and_starmap_give_multiprocessings_results(pools, size, chunksize):
    ours, theirs = pools
    assert ours.map(square, range(size), chunksize) == theirs.map(square, range(size), chunksize)
    pairs = [(i, i % 4) for i in range(size)]
    assert (ours.starmap(pow, pairs, chunksize) == theirs.starmap(pow, pairs, chunksize))


@pytest.mark.parametrize('chunksize', [1, 4])
def test_imap_and_imap_unordered_give_multiprocessings_results(pools, chunksize):
    ours, theirs = pools
    items = (i for i in range(23))  # a generator: consumed lazily
    assert list(ours.imap(square, items, chunksize)) == list(theirs.imap(square, range(23),
                                                                         chunksize))
    assert (sorted(ours.imap_unordered(square, range(23), chunksize))
            == sorted(theirs.imap_unordered(square, range(23), chunksize)))


def test_apply_and_async_variants_with_callbacks(pools):
    ours, theirs = pools
    assert ours.apply(divmod, (17, 5)) == theirs.apply(divmod, (17, 5))
    assert ours.apply(int, ('ff',), {'base': 16}) == 255
    got = []
    result = ours.apply_async(operator.mul, (6, 7), callback=got.append)
    assert result.get(timeout=60) == 42 and result.successful() and got == [42]
    mapped = ours.map_async(square, range(5), callback=got.append)
    assert mapped.get(60) == theirs.map_async(square, range(5)).get(60) == got[-1]
    assert ours.starmap_async(pow, [(2, 5)]).get(60) == [32]


def test_a_raising_task_is_not_retried_and_raises_its_exception_with_the_remote_traceback(pools):
    ours, theirs = pools
    with pytest.raises(ValueError) as ours_error:
        ours.map(fails_on_three, range(6))
    with pytest.raises(ValueError) as theirs_error:
        theirs.map(fails_on_three, range(6))
    assert str(ours_error.value) == str(theirs_error.value) == 'three is bad (3)'
    assert 'in fails_on_three' in str(ours_error.value.__cause__)
    assert ours.stats['requeued'] == 0
    # imap (chunksize 1) raises at the item's place and goes on, as multiprocessing's does.
    def outcomes(iterator):
        found = []
        for _ in range(6):
            try:
                found.append(next(iterator))
            except ValueError as e:
                found.append(str(e))
        return found
    assert outcomes(ours.imap(fails_on_three, range(6))) == outcomes(
        theirs.imap(fails_on_three, range(6)))
    errors = []
    result = ours.apply_async(fails_on_three, (3,), error_callback=errors.append)
    with pytest.raises(ValueError):
        result.get(60)
    assert not result.successful() and isinstance(errors[0], ValueError)


def test_an_unpicklable_exception_arrives_as_a_remote_error_naming_it(pools):
    with pytest.raises(courier.RemoteError, match='Unpicklable: carries a lock') as error:
        pools[0].apply(raise_unpicklable)
    assert 'raise_unpicklable' in error.value.remote_traceback


def test_functions_and_arguments_of_the_callers_main_travel_by_value(pools):
    offset = 10

    class Point:  # a local class: importable nowhere
        def __init__(self, x):
            self.x = x

    assert pools[0].map(lambda p: p.x + offset, [Point(1), Point(2)]) == [11, 12]


def test_the_initializer_ran_once_in_every_worker(pools):
    seen = {}
    for _ in range(20):
        values, pid = pools[0].apply(initialized)
        seen[pid] = values
    assert all(values == ['init'] for values in seen.values()), seen


def test_large_arrays_go_both_ways(pools):
    np = pytest.importorskip('numpy')
    arrays = [np.full(300_000, i, dtype=np.float64) for i in range(3)]
    sums = pools[0].map(np.sum, arrays, chunksize=1)
    assert sums == [0.0, 300_000.0, 600_000.0]


def test_close_join_and_terminate_follow_multiprocessing():
    with no_new_children():
        pool = lp.Pool(1, launch_type='local_mp')
        with pytest.raises(ValueError, match='still running'):
            pool.join()
        pending = pool.apply_async(square, (3,))
        pool.close()
        with pytest.raises(ValueError, match='Pool not running'):
            pool.map(square, [1])
        pool.join()  # waits for the task submitted before close()
        assert pending.get(0) == 9
        with lp.Pool(1, launch_type='local_mp') as pool:
            blocked = pool.apply_async(__import__('time').sleep, (60,))
        with pytest.raises(lp.PoolTerminatedError):  # exported, so callers can catch it
            blocked.get(30)  # __exit__ terminated the pool
        pool.join()


@pytest.mark.parametrize('kwargs, message', [
    ({'processes': 0}, 'Number of processes must be at least 1'),
    ({'maxtasksperchild': 5}, 'maxtasksperchild is not supported'),
    ({'workers': []}, 'workers= is empty'),
    ({'workers': ['x'], 'processes': 2}, 'Pass either workers='),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lp.Pool(**kwargs)


def test_a_worker_that_is_not_a_pool_worker_is_refused():
    with pytest.raises(TypeError, match='A pool worker is'):
        lp.Pool(workers=['not a client'])


def test_bad_chunksize_is_named(pools):
    with pytest.raises(ValueError, match='Chunksize must be 1'):
        pools[0].map(square, [1], chunksize=0)
    with pytest.raises(ValueError, match='Chunksize must be 1'):
        pools[0].imap(square, [1], chunksize=-1)


def test_results_pickle_like_multiprocessings(pools):
    assert pickle.loads(pickle.dumps(pools[0].map(square, [5]))) == [25]
