"""The CPython internals that a call's future reaches into, for speed, in one place.

Every call makes a ``concurrent.futures.Future``, and most are completed before anyone waits
for them; ``Future()`` builds a ``threading.Condition`` and ``result()`` takes its lock even
then. :class:`LightFuture` is a ``Future`` that builds ``Future.__init__``'s attributes itself,
with :class:`LightCondition` (cheaper to make, free to notify without waiters, entered with
no Python code), and returns a completed result without the lock: a measured part of a call's cost
(``benchmarks/courier_bench.py``). It relies on what CPython 3.9 to 3.13 have:

- ``Future``'s instance attributes (``_condition``, ``_state``, ``_result``, ``_exception``,
  ``_waiters``, ``_done_callbacks``) and its state names (``concurrent.futures._base``'s
  ``PENDING``, ``CANCELLED``, ``CANCELLED_AND_NOTIFIED``, ``FINISHED``), a completed future's
  ``_exception`` set before its ``_state``;
- ``threading.Condition``'s methods using no attribute but ``_lock``, ``acquire``,
  ``release``, ``_release_save``, ``_acquire_restore``, ``_is_owned`` and ``_waiters``, and its
  ``notify`` releasing the waiter locks it takes out of ``_waiters``;
- ``_thread.RLock``'s ``_release_save``, ``_acquire_restore`` and ``_is_owned``, and its
  being a type that can be subclassed.

``tests/courier/test_compat.py`` checks each of them on the running Python, so a Python that
changes them fails there, by name, rather than as a call that hangs.
"""

from __future__ import annotations

import _thread
import collections
import concurrent.futures
from concurrent.futures import _base as _futures  # pylint: disable=protected-access
import threading
from typing import Any, Callable, ContextManager, List, Optional

PENDING, CANCELLED, FINISHED = _futures.PENDING, _futures.CANCELLED, _futures.FINISHED
DONE = (CANCELLED, _futures.CANCELLED_AND_NOTIFIED, FINISHED)  # what a wait ends on

# What LightCondition provides of threading.Condition's instance attributes.
CONDITION_ATTRIBUTES = ('_lock', 'acquire', 'release', '_release_save', '_acquire_restore',
                        '_is_owned', '_waiters')
RLOCK_METHODS = ('_release_save', '_acquire_restore', '_is_owned')


class LightCondition(_thread.RLock):
    """A ``threading.Condition`` that is its own reentrant lock, made for less than one costs.

    It has ``threading.Condition``'s methods, which use only what it provides (the lock's own
    save/restore, and its waiters), and notifying it without waiters does nothing. Being the
    lock, it is entered by the lock's own (C) ``__enter__``: an exception raised in the thread
    from outside (a local_mt stop raising in a thread node) cannot land between taking the
    lock and entering the block, where ``Condition.__enter__`` (Python code) leaves it held and
    the thread completing the future waits for ever.
    """

    __slots__ = ('_waiters',)

    def __init__(self):  # pylint: disable=super-init-not-called
        self._waiters: 'collections.deque' = collections.deque()

    @property
    def _lock(self) -> 'LightCondition':
        return self

    wait = threading.Condition.wait
    wait_for = threading.Condition.wait_for
    notify = threading.Condition.notify

    def notify_all(self) -> None:
        if self._waiters:
            self.notify(len(self._waiters))


class LightFuture(concurrent.futures.Future):
    """A ``concurrent.futures.Future`` with a :class:`LightCondition`, whose ``result()`` of a
    completed future takes no lock, and whose ``cancel()`` notifies as an executor does."""

    def __init__(self):  # pylint: disable=super-init-not-called
        self._condition = LightCondition()
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: List[Any] = []
        self._done_callbacks: List[Callable[[Any], Any]] = []

    def result(self, timeout: Optional[float] = None) -> Any:
        if self._state == FINISHED and self._exception is None:
            return self._result
        self._wait_done(timeout)
        return super().result(0)  # done: it neither waits nor releases the condition

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait_done(timeout)
        return super().exception(0)

    def _wait_done(self, timeout: Optional[float]) -> None:
        """Waits until the future is done, or raises TimeoutError after `timeout` seconds.

        ``Future.result`` waits in ``Condition.wait``, which releases the condition's lock
        inside the ``with`` that took it and takes it again at the end: an exception raised in
        the thread from outside (a local_mt stop) landing between the two left the ``with`` to
        release a lock it no longer held, and the thread ended by a RuntimeError instead of the
        exception. Here the lock is held only in blocks entered and left by C code, and the
        thread blocks on a waiter of its own outside them, as ``Condition.wait`` does.
        """
        condition = self._condition
        with condition:
            if self._state in DONE:
                return
            waiter = _thread.allocate_lock()
            waiter.acquire()
            condition._waiters.append(waiter)  # pylint: disable=protected-access
        try:  # A notify (under the lock) releases the waiter and takes it out of the waiters.
            if timeout is None:
                waiter.acquire()
            elif timeout > 0:
                waiter.acquire(True, timeout)
        finally:
            with condition:  # not notified: out of the waiters (where a notify would free it)
                if waiter in condition._waiters:  # pylint: disable=protected-access
                    condition._waiters.remove(waiter)  # pylint: disable=protected-access
        if self._state not in DONE:
            raise concurrent.futures.TimeoutError()

    def locked(self) -> ContextManager[bool]:
        """The future's condition, to hold while changing it (a context manager)."""
        return self._condition

    def replace_exception(self, old: BaseException, new: BaseException) -> None:
        """Makes a completed future that failed with `old` fail with `new` (hold `locked()`)."""
        if self._exception is old:
            self._exception = new

    def exception_now(self) -> Optional[BaseException]:
        """The exception of a completed future, without waiting."""
        return self._exception

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        # What an executor does for a cancelled work item: concurrent.futures.wait() and
        # as_completed() count only a cancelled future that was "notified" as done. (The
        # condition's lock is reentrant; holding it, a concurrent cancel cannot notify too.)
        with self._condition:
            if self._state == CANCELLED:
                self.set_running_or_notify_cancel()
        return True
