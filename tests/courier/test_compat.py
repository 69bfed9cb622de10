"""The CPython internals that courier.transport._compat relies on, checked on the running Python.

A Python that changes them fails here, naming what changed, rather than as a call that hangs or
a future that never completes. Each check is what the module's docstring lists.
"""

from __future__ import annotations

import _thread
import concurrent.futures
import inspect
import re
import threading

import pytest

from courier.transport import _compat


def _private_names_used(cls: type) -> set:
    """The ``self._name`` attributes the methods of ``cls`` (its own source) use."""
    return set(re.findall(r'\bself\.(_[A-Za-z]\w*)', inspect.getsource(cls)))


def test_a_light_future_has_exactly_the_attributes_future_makes():
    assert set(vars(_compat.LightFuture())) == set(vars(concurrent.futures.Future())), (
        'concurrent.futures.Future.__init__ changed: make LightFuture.__init__ match it')


def test_futures_methods_use_only_the_attributes_a_light_future_makes():
    used = {name for name in _private_names_used(concurrent.futures.Future)
            if not name.startswith('__')}  # Its own name-mangled helpers are methods.
    assert used <= set(vars(_compat.LightFuture())) | set(dir(concurrent.futures.Future))


def test_futures_state_names_are_the_ones_a_light_future_compares():
    future = concurrent.futures.Future()
    assert future._state == _compat.PENDING  # pylint: disable=protected-access
    future.set_result(1)
    assert future._state == _compat.FINISHED  # pylint: disable=protected-access
    cancelled = concurrent.futures.Future()
    assert cancelled.cancel()
    assert cancelled._state == _compat.CANCELLED  # pylint: disable=protected-access


def test_conditions_methods_use_only_what_a_light_condition_provides():
    assert _private_names_used(threading.Condition) <= set(_compat.CONDITION_ATTRIBUTES), (
        'threading.Condition uses an attribute LightCondition does not make')
    made = set(vars(threading.Condition(_thread.RLock())))
    assert made <= set(_compat.CONDITION_ATTRIBUTES), (
        'threading.Condition.__init__ changed: make LightCondition.__init__ match it')
    condition = _compat.LightCondition()
    assert all(hasattr(condition, name) for name in _compat.CONDITION_ATTRIBUTES)
    assert type(condition).__enter__ is _thread.RLock.__enter__  # no Python code on entering


def test_a_reentrant_lock_saves_and_restores_its_owner():
    lock = _thread.RLock()
    assert all(hasattr(lock, name) for name in _compat.RLOCK_METHODS)
    lock.acquire()
    lock.acquire()
    assert lock._is_owned()  # pylint: disable=protected-access
    state = lock._release_save()  # pylint: disable=protected-access
    assert not lock._is_owned()  # pylint: disable=protected-access
    lock._acquire_restore(state)  # pylint: disable=protected-access
    lock.release()
    assert lock._is_owned()  # pylint: disable=protected-access
    lock.release()


def test_a_light_condition_wakes_a_waiter_in_another_thread():
    condition, woken = _compat.LightCondition(), []

    def wait() -> None:
        with condition:
            woken.append(condition.wait(timeout=30))  # True: notified, not timed out.

    waiter = threading.Thread(target=wait)
    waiter.start()
    while True:  # Until the waiter waits (wait released the lock for it).
        with condition:
            if condition._waiters:  # pylint: disable=protected-access
                condition.notify_all()
                break
    waiter.join(timeout=30)
    assert woken == [True]


@pytest.mark.parametrize('outcome', ['result', 'exception', 'cancel'])
def test_a_light_future_completes_for_waiters_in_other_threads(outcome):
    future = _compat.LightFuture()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waited = pool.submit(concurrent.futures.wait, [future], 30)
        completed = pool.submit(lambda: list(concurrent.futures.as_completed([future], 30)))
        if outcome == 'result':
            future.set_result('done')
        elif outcome == 'exception':
            future.set_exception(KeyError('failed'))
        else:
            assert future.cancel()
        done, _ = waited.result(timeout=30)
        assert done == {future} and completed.result(timeout=30) == [future]
    if outcome == 'result':
        assert future.result() == 'done' and future.result(timeout=0) == 'done'
    elif outcome == 'exception':
        with pytest.raises(KeyError):
            future.result()
    else:
        with pytest.raises(concurrent.futures.CancelledError):
            future.result()
