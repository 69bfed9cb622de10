"""Waking a node's thread so that an exception raised in it lands (`launchpad.process.interrupt`):
a queue wait is woken unseen, with or without such an exception; other waits are left alone."""
import concurrent.futures
import ctypes
import gc
import queue
import sys
import threading
import time
import weakref

import pytest

from courier.transport import _base, _compat, framed_client
from launchpad import runtime
from launchpad.process import interrupt
from launchpad.process import probe
from launchpad.process import watchdog
from launchpad.process.coordinator import Coordinator, NodeStopped
from launchpad.process.frames import current_frames
from tests.core.conftest import wait_until


def _waits_in(thread: threading.Thread, function) -> bool:
    frame = sys._current_frames().get(thread.ident)  # pylint: disable=protected-access
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


class _Raised(Exception):
    """What the test raises in the waiting thread."""


def test_a_thread_waiting_in_a_queue_is_woken_and_the_raised_exception_lands():
    batches, ended = queue.Queue(), []

    def learner():
        try:
            batches.get()
            ended.append('got a batch')
        except _Raised:
            ended.append('raised')

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    assert wait_until(lambda: _waits_in(thread, threading.Condition.wait), timeout=10)
    interrupt.raise_in(thread, _Raised)
    thread.join(timeout=10)
    assert ended == ['raised']


def test_a_woken_queue_wait_without_an_exception_goes_on_and_loses_no_item():
    batches, got = queue.Queue(), []
    consumers = [threading.Thread(target=lambda: got.append(batches.get()), daemon=True)
                 for _ in range(2)]
    for consumer in consumers:
        consumer.start()
    assert wait_until(lambda: all(_waits_in(c, threading.Condition.wait) for c in consumers),
                      timeout=10)
    interrupt.wake(consumers[0])
    assert wait_until(lambda: _waits_in(consumers[0], threading.Condition.wait), timeout=10)
    assert got == []  # woken, it found no item and waits again
    batches.put(1)
    batches.put(2)  # each put reaches a waiting consumer: the wake spent no notify
    for consumer in consumers:
        consumer.join(timeout=10)
    assert sorted(got) == [1, 2]


def _sleep_in_a_node_thread(seconds: float, ended: list) -> threading.Thread:
    """A thread with a node context of its own (as local_mt's) that sleeps `seconds`."""
    def node():
        runtime.set_thread_context(object())
        began = time.monotonic()
        try:
            time.sleep(seconds)
            ended.append(time.monotonic() - began)
        except _Raised:
            ended.append('raised')

    thread = threading.Thread(target=node, daemon=True)
    thread.start()
    return thread


def test_a_node_thread_s_sleep_is_woken_and_the_raised_exception_lands():
    """Acme's checkpointing counter sleeps in its node's thread, where its stop handler raises
    SystemExit: with node threads' sleeps wakeable, the exception lands in the sleep."""
    release_node_threads, ended = interrupt.hold_for_node_threads(), []
    try:
        thread = _sleep_in_a_node_thread(3600, ended)
        assert wait_until(lambda: _waits_in(thread, threading.Condition.wait), timeout=10)
        interrupt.raise_in(thread, _Raised)
        thread.join(timeout=10)
        assert ended == ['raised']
    finally:
        release_node_threads()
    assert time.sleep is interrupt._SLEEP  # pylint: disable=protected-access


def test_a_woken_sleep_without_an_exception_sleeps_its_whole_time():
    release_node_threads, ended = interrupt.hold_for_node_threads(), []
    try:
        thread = _sleep_in_a_node_thread(0.5, ended)
        assert wait_until(lambda: _waits_in(thread, threading.Condition.wait), timeout=10)
        interrupt.wake(thread)
        thread.join(timeout=10)
        assert len(ended) == 1 and ended[0] >= 0.5
    finally:
        release_node_threads()


def test_a_thread_waiting_for_a_call_s_future_is_woken_and_the_raised_exception_lands():
    """A call's future waits on a lock in C, which no exception raised in the thread ends: it is
    woken as a queue wait is, so that a thread node waiting for a call that does not answer
    ends with the stop."""
    future, ended = _base.CallFuture(), []

    def caller():
        try:
            ended.append(future.result())
        except _Raised:
            ended.append('raised')

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    waiters = future._condition._waiters  # pylint: disable=protected-access
    assert wait_until(lambda: waiters, timeout=10)
    interrupt.raise_in(thread, _Raised)
    thread.join(timeout=10)
    assert ended == ['raised']


def test_a_woken_future_wait_without_an_exception_waits_on_for_the_result():
    future, got = _base.CallFuture(), []
    thread = threading.Thread(target=lambda: got.append(future.result(timeout=60)), daemon=True)
    thread.start()
    waiters = future._condition._waiters  # pylint: disable=protected-access
    assert wait_until(lambda: waiters, timeout=10)
    first = waiters[0]
    interrupt.wake(thread)
    assert wait_until(lambda: waiters and waiters[0] is not first, timeout=10)  # waits again
    assert got == [] and thread.is_alive()
    future.set_result(1)
    thread.join(timeout=10)
    assert got == [1]


def _go_on(seconds: float, ended: list) -> None:
    """Runs Python lines for `seconds` (where an exception raised in the thread lands), then
    records that it went on."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    ended.append('went on')


def test_a_stop_landing_in_a_finalizer_in_a_node_thread_lands_again_after_it():
    """A collection runs finalizers (weakref callbacks, `__del__`) in whatever thread it starts
    in, and Python drops what they raise: NodeStopped raised in a node's thread that lands in
    one (seen: the finalizer of a courier server's worker pool) is raised there again, and
    ends the node after the finalizer, not never."""
    release_node_threads, ended = interrupt.hold_for_node_threads(), []

    class Collected:
        """What a collection finds in the node's thread."""

    def finalizer():  # the stop comes while it runs, and lands in it
        interrupt.raise_in(threading.current_thread(), NodeStopped)
        for _ in range(1000):
            pass

    def node():
        runtime.set_thread_context(object())
        try:
            collected = Collected()
            weakref.finalize(collected, finalizer)
            del collected  # runs the finalizer here
            _go_on(10, ended)
        except NodeStopped:
            ended.append('stopped')

    try:
        thread = threading.Thread(target=node, daemon=True)
        thread.start()
        thread.join(timeout=30)
    finally:
        release_node_threads()
    assert ended == ['stopped']
    assert sys.unraisablehook is not interrupt._unraisable  # pylint: disable=protected-access


@pytest.mark.parametrize('raised_by', ['raise_in', 'ctypes'])
def test_an_exception_raised_in_a_thread_that_starts_one_lands_once_the_new_one_runs(
        monkeypatch, raised_by):
    """Until a new thread runs, CPython 3.11 gives it its starter's id, and raises an exception
    raised by that id in it: it ends before it reports that it started, and its starter waits
    for ever (seen: NodeStopped raised in a node thread whose call started a courier server's
    worker). `raise_in` holds the exception back while its thread is inside `Thread.start` (here
    held there, before the new thread exists): the new thread runs, then the starter gets it; so
    does a stop handler's own raise through ctypes (Acme's `runtime_terminator`)."""
    in_start, go, ran, ended = threading.Event(), threading.Event(), threading.Event(), []
    start_new_thread = threading._start_new_thread  # pylint: disable=protected-access

    def held_start(function, args):
        if threading.current_thread() is starter:
            in_start.set()
            go.wait(30)
        return start_new_thread(function, args)

    def node():
        try:
            threading.Thread(target=ran.set, daemon=True).start()
            _go_on(30, ended)
        except NodeStopped:
            ended.append('stopped')

    monkeypatch.setattr(threading, '_start_new_thread', held_start)
    release_node_threads = interrupt.hold_for_node_threads()
    try:
        starter = threading.Thread(target=node, daemon=True)
        starter.start()
        assert in_start.wait(30)
        if raised_by == 'raise_in':
            interrupt.raise_in(starter, NodeStopped)
        else:
            assert ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_long(starter.ident), ctypes.py_object(NodeStopped)) == 1
        go.set()
        starter.join(30)
    finally:
        release_node_threads()
    assert ran.is_set() and ended == ['stopped']
    assert threading.Thread.start is interrupt._START  # pylint: disable=protected-access
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc is \
        interrupt._SET_ASYNC_EXC  # pylint: disable=protected-access


def test_an_exception_for_a_thread_that_ended_lands_in_no_thread_that_took_its_id():
    """Once a thread has ended, the system gives its id to a thread it starts next: raised in
    the ended thread (a node thread that ended just before `raise_in`), the exception lands
    nowhere, not in the new thread (here given the old one's id as the system would)."""
    ended, go, outcome = threading.Thread(target=lambda: None), threading.Event(), []
    ended.start()
    ended.join()

    def new_thread():
        try:
            go.wait(30)
            _go_on(0.2, outcome)
        except _Raised:
            outcome.append('raised')

    taker = threading.Thread(target=new_thread, daemon=True)
    taker.start()
    ended._ident = taker.ident  # pylint: disable=protected-access
    interrupt.raise_in(ended, _Raised)
    go.set()
    taker.join(30)
    assert outcome == ['went on']


def test_an_event_wait_is_left_alone():
    event, ended = threading.Event(), []

    def waiter():
        ended.append(event.wait())

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert wait_until(lambda: _waits_in(thread, threading.Event.wait), timeout=10)
    interrupt.wake(thread)  # Event.wait would return True unset: it is not woken
    assert thread.is_alive() and ended == []
    event.set()
    thread.join(timeout=10)
    assert ended == [True]


def test_no_collection_can_start_while_the_threads_frames_are_read(monkeypatch):
    """CPython reads them holding its lock on the thread list; a finalizer run by a collection
    started there may let go of the GIL, and a thread that ends or raises in another meanwhile
    deadlocks the process (seen in CI: a local_mt node's removal hung in `interrupt.wake`)."""
    collector_on = []
    read = sys._current_frames  # pylint: disable=protected-access

    def watched():
        collector_on.append(gc.isenabled())
        return read()

    monkeypatch.setattr(sys, '_current_frames', watched)
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait)
    sleeper.start()
    try:
        assert sleeper.ident in current_frames()
        assert interrupt.wake(sleeper) is None and 'Thread' in watchdog.format_stacks()
        assert any(entry['thread'] == sleeper.ident for entry in probe.stacks())
    finally:
        stop.set()
        sleeper.join()
    assert collector_on == [False] * 4 and gc.isenabled()


def _report(coordinator: Coordinator) -> None:
    coordinator.report_metrics('node/0', {'time': time.time()})


def _watch_deadline(deadlines) -> None:
    # (a call's future: one an exception kept alive meets its deadline later in the run)
    deadlines.add(time.monotonic() + 60, _base.CallFuture(), TimeoutError)


def _wait_briefly(future: concurrent.futures.Future) -> None:
    try:
        future.result(timeout=0)
    except concurrent.futures.TimeoutError:
        pass


@pytest.mark.parametrize('make, use', [
    (lambda: Coordinator(['node/0']), _report),
    (framed_client._Deadlines, _watch_deadline),  # pylint: disable=protected-access
    (_compat.LightFuture, _wait_briefly),  # held, the courier loop could not complete the call
], ids=['coordinator', 'call_deadlines', 'call_future'])
def test_an_exception_raised_in_a_thread_leaves_shared_locks_free(make, use):
    """At a stop, local_mt raises NodeStopped in a thread node that does not cooperate
    (`raise_in`). Landing while the node's thread is inside launchpad (reporting to the
    coordinator, starting a call with a timeout, waiting for a call's result), it must not
    leave a lock that other threads take held: entered as a Condition, whose __enter__ is Python code, it did, and the
    launcher's threads then waited for ever (CI: the coordinator's). And the thread ends by
    that exception, not another: landing in Condition.wait after it had released the lock, it
    became `RuntimeError: cannot release un-acquired lock` (a CI warning; here every run of
    200 attempts, before LightFuture waited on its own). The thread is a node's, as local_mt
    runs it: one landing in a finalizer that a collection runs there lands again after it."""
    shared = make()
    release_node_threads = interrupt.hold_for_node_threads()
    try:
        for attempt in range(200):
            running, ended = threading.Event(), []

            def node():
                runtime.set_thread_context(object())
                try:
                    while True:
                        use(shared)
                        running.set()
                except BaseException as error:  # pylint: disable=broad-except
                    ended.append(error)

            thread = threading.Thread(target=node, daemon=True)
            thread.start()
            assert running.wait(10)
            deadline = time.monotonic() + 20
            while thread.is_alive() and time.monotonic() < deadline:  # (should one be lost,
                interrupt.raise_in(thread, NodeStopped)  # it is raised again, as local_mt does)
                thread.join(2)
            assert [type(error) for error in ended] == [NodeStopped], ended  # as raised, no other
            other = threading.Thread(target=use, args=(shared,), daemon=True)
            other.start()
            other.join(5)
            assert not other.is_alive(), f'the lock stayed held after exception {attempt + 1}'
    finally:
        release_node_threads()
