"""lp.Pool behaves as multiprocessing.Pool where a user can tell: each test is written from what
multiprocessing documents, and runs on lp.Pool (local_mt, local_mp) and, where multiprocessing
has that behaviour, on multiprocessing.Pool itself, which proves the expectation is its own."""
from __future__ import annotations

import functools
import gc
import multiprocessing
import multiprocessing.pool
import os
import signal
import time
import warnings

import pytest

import launchpad as lp
from launchpad.pool import PoolTerminatedError, PoolWorker
from launchpad.pool.worker import pack_chunk, pack_function

pytestmark = pytest.mark.timeout(180)

OURS = ['local_mt', 'local_mp']
THEIRS = 'multiprocessing'


def _multiprocessing_pool(*args, **kwargs):
    """multiprocessing's Pool, forked (as tests/pool/test_pool_api.py explains: spawn leaves a
    resource tracker behind) with SIGTERM's default action: a launch of an earlier test may have
    left its handler in place, and forked workers that inherit it outlive terminate()."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        return multiprocessing.get_context('fork').Pool(*args, **kwargs)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _pool_factory(kind):
    if kind == THEIRS:
        return _multiprocessing_pool
    return functools.partial(lp.Pool, launch_type=kind)


@pytest.fixture(params=OURS + [THEIRS])
def make_pool(request):
    """`Pool` of lp (on each local launch type) or of multiprocessing."""
    return _pool_factory(request.param)


@pytest.fixture(params=OURS)
def make_our_pool(request):
    """lp.Pool on each local launch type, for what multiprocessing does not do at all."""
    return _pool_factory(request.param)


def square(x):
    return x * x


class SayWhenError(ValueError):
    pass


def raising_at(total, when):
    for i in range(total):
        if i == when:
            raise SayWhenError(f'the iterable failed at {i}')
        yield i


# --- imap: results that come before an iterable's error are yielded first --------------------

@pytest.mark.parametrize('chunksize, before', [(1, 3), (2, 3), (3, 3)])
def test_imap_yields_the_results_before_an_iterables_error_then_raises_it(make_pool, chunksize,
                                                                          before):
    # The items read before the error, in whole chunks, are computed; the error comes after them.
    with make_pool(2) as pool:
        iterator = pool.imap(square, raising_at(10, before), chunksize)
        assert [next(iterator) for _ in range(before - before % chunksize)] == [
            x * x for x in range(before - before % chunksize)]
        with pytest.raises(SayWhenError, match='failed at'):
            next(iterator)
        with pytest.raises(StopIteration):
            next(iterator)


def test_imap_raises_an_iterable_that_fails_at_once_at_the_first_next(make_pool):
    with make_pool(1) as pool:
        iterator = pool.imap(square, raising_at(10, 0))
        with pytest.raises(SayWhenError):
            next(iterator)


# --- map frees its tasks' arguments and results once it returns (bpo-29861) ----------------

class Counted:
    """Counts its live instances in this process (copies that come back included)."""
    alive = 0

    def __new__(cls):
        cls.alive += 1
        return object.__new__(cls)

    def __del__(self):
        type(self).alive -= 1


def identity(x):
    return x


def test_map_keeps_no_argument_or_result_alive_after_it_returns(make_pool):
    with make_pool(2) as pool:
        objects = [Counted() for _ in range(10)]
        results = pool.map(identity, objects, 1)
        assert len(results) == 10
        del objects, results
        deadline = time.monotonic() + 30  # no other pool event comes: nothing else frees them
        while Counted.alive and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert Counted.alive == 0


# --- Manager() proxies as initializer and task arguments -----------------------------------

def append_to(shared, value):
    shared.append(value)


def append_pid(shared):
    shared.append(os.getpid())
    return len(shared)


def test_manager_proxies_work_as_initializer_and_task_arguments(make_pool):
    manager = multiprocessing.get_context('fork').Manager()
    try:
        shared = manager.list()
        with make_pool(2, initializer=append_to, initargs=(shared, 'initialized')) as pool:
            assert pool.apply(append_pid, (shared,)) >= 1
            assert len(pool.map(append_pid, [shared] * 3)) == 3  # a proxy as a map item, too
            assert pool.starmap(append_to, [(shared, 'star')]) == [None]
        values = list(shared)
    finally:
        manager.shutdown()
    assert values.count('initialized') in (1, 2)  # once per worker that started in time
    assert values.count('star') == 1 and len([v for v in values if isinstance(v, int)]) == 4


# --- A failing initializer fails the pool's construction with its traceback ----------------

def failing_initializer():
    raise KeyError('no configuration here')  # the initializer's own line


def test_a_failing_initializer_fails_the_construction_with_its_traceback(make_our_pool):
    # multiprocessing restarts such workers forever; here the pool fails, naming the cause.
    # start_timeout: the error must be the initializer's, not that of a timeout.
    with pytest.raises(PoolTerminatedError, match='initializer') as caught:
        make_our_pool(2, initializer=failing_initializer, start_timeout=90)
    cause = caught.value.__cause__
    assert isinstance(cause, KeyError) and cause.args == ('no configuration here',)
    assert type(cause.__cause__) is multiprocessing.pool.RemoteTraceback
    assert "raise KeyError('no configuration here')  # the initializer's own line" in (
        cause.__cause__.tb)


# --- Prefetch never queues a task behind a running one while a worker is idle ---------------

def wait_for_task_two(index, directory):
    """Task 0 waits (30 s at most) for the file task 2 writes; True if it saw it."""
    if index == 2:
        with open(os.path.join(directory, 'two'), 'w'):
            pass
    if index != 0:
        return True
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(directory, 'two')):
            return True
        time.sleep(0.01)
    return False


def test_a_task_waiting_for_a_later_task_is_not_stuck_behind_it(make_pool, tmp_path):
    # Two workers, three tasks: task 0 can only end once task 2 ran. multiprocessing runs task 2
    # on the worker that finished task 1; a prefetch must not park it behind task 0.
    with make_pool(2) as pool:
        pool.map(square, range(4))  # both workers are up
        assert pool.starmap(wait_for_task_two, [(i, str(tmp_path)) for i in range(3)], 1) == [
            True, True, True]


def test_a_worker_gives_back_only_a_task_that_has_not_started():
    worker = PoolWorker()
    key, function = pack_function(square)
    data, buffers = pack_chunk([3])
    assert worker.withdraw('sent-later')  # withdrawn before its call arrives: it never runs
    assert worker.execute(key, function, data, buffers, 'call', None, 'sent-later') is None
    assert worker.execute(key, function, data, buffers, 'call', None, 'ran') == [(True, 9)]
    assert not worker.withdraw('ran')


# --- A pool left running warns as it goes ---------------------------------------------------

def test_a_pool_never_closed_warns_with_a_resource_warning_when_collected(make_pool):
    pool = make_pool(1)
    assert pool.map(square, [3]) == [9]
    with pytest.warns(ResourceWarning, match='unclosed running multiprocessing pool'):
        del pool
        gc.collect()
    # (no_leftovers: collecting it also stopped its workers)


def test_a_closed_or_terminated_pool_gives_no_warning(make_pool):
    with warnings.catch_warnings():
        warnings.simplefilter('error', ResourceWarning)
        pool = make_pool(1)
        pool.close()
        pool.join()
        del pool
        with make_pool(1):
            pass
        gc.collect()


# --- Unknown keyword arguments --------------------------------------------------------------

@pytest.mark.parametrize('keyword', [{'maxtasks': 5}, {'error_handling': True}])
def test_an_unknown_keyword_argument_raises_type_error(make_pool, keyword):
    with pytest.raises(TypeError, match=list(keyword)[0]):
        make_pool(1, **keyword)


# --- The remote traceback is multiprocessing's ---------------------------------------------

def raise_runtime_error(x):
    raise RuntimeError(x)  # the failing line, as written


@pytest.mark.parametrize('method', ['apply', 'map', 'imap', 'apply_async'])
def test_a_task_error_has_multiprocessings_remote_traceback_as_its_cause(make_pool, method):
    errors = []
    with make_pool(1) as pool:
        with pytest.raises(RuntimeError) as caught:
            if method == 'apply':
                pool.apply(raise_runtime_error, (123,))
            elif method == 'apply_async':
                pool.apply_async(raise_runtime_error, (123,),
                                 error_callback=errors.append).get(60)
            else:
                list(getattr(pool, method)(raise_runtime_error, [123]))
    assert type(caught.value) is RuntimeError and caught.value.args == (123,)
    cause = caught.value.__cause__
    assert type(cause) is multiprocessing.pool.RemoteTraceback
    assert 'raise RuntimeError(x)  # the failing line, as written' in cause.tb
    assert cause.tb in str(cause)
    if method == 'apply_async':
        assert errors == [caught.value]
