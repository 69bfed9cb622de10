"""Waking a node's thread so that an exception raised in it lands (`launchpad.process.interrupt`):
a queue wait is woken unseen, with or without such an exception; other waits are left alone."""
import queue
import sys
import threading

from launchpad.process import interrupt
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
