"""Reaching a node's thread at a stop: raising an exception in it, and waking it from a wait.

Python delivers an exception raised in another thread (`raise_in`, or Acme's `runtime_terminator`,
which raises SystemExit in the node's thread) only when that thread runs Python code. A thread
that waits for a lock runs none until the lock is released, so the stop handlers' exception
would wait as long as the node does. `wake` ends such a wait without changing what the node sees:

- the main thread: a signal whose handler does nothing (`install`, done by the worker) interrupts
  any wait there (a lock, a queue, a sleep, a select); the handler is Python code, so a pending
  exception lands in it, and without one the wait goes on. dm-launchpad runs its stop handlers
  in the main thread's signal handler, which interrupts it the same way.
- another thread: signals cannot interrupt its lock waits, so a thread that waits in one of
  the standard library's waits that re-check their condition after waking (a queue's `get` or
  `put`, `Condition.wait_for`, a semaphore) is woken as if by a notify; it runs Python code, where
  a pending exception lands, and without one it checks its condition and waits again. Other
  waits (an `Event.wait`, a bare `Condition.wait`, a call blocked in C) are left alone.
- a sleep in a node's thread: `time.sleep` is a call blocked in C that no signal ends in a
  thread, and Acme's checkpointing counter sleeps a second at a time under its stop handler's
  SystemExit. While node threads run (`wakeable_sleeps`: a thread launch, a thread colocation),
  `time.sleep` in a thread with a node context of its own (not the main thread, not threads the
  node started) waits in `Condition.wait_for` instead, which `wake` ends: a pending exception
  lands, and without one it sleeps on until its time is up, as `time.sleep` would.
"""
from __future__ import annotations

import ctypes
import queue
import signal
import threading
import time
from typing import Callable, Hashable, List, Mapping

from launchpad import runtime
from launchpad.process.coordinator import NodeStopped
from launchpad.process.frames import current_frames

SIGNAL = signal.SIGRTMIN + 2  # sent to the main thread by `wake`; its handler does nothing

# What is raised in a node's thread from outside at a stop: NodeStopped (by its launcher or its
# colocation), SystemExit (by a stop handler, as Acme's runtime_terminator's). Either may land
# after the node's code ended, where it must not end the thread unrecorded (a thread that
# SystemExit ends is not even reported).
RAISED_AT_STOP = (NodeStopped, SystemExit)

# Callers of Condition.wait that wait again unless their condition holds: waking them is safe.
_RECHECKING = frozenset(function.__code__ for function in (
    queue.Queue.get, queue.Queue.put, queue.Queue.join, threading.Condition.wait_for,
    threading.Semaphore.acquire))


_SLEEP = time.sleep  # the interpreter's own
_sleep_holders = 0  # launches and colocations that need node threads' sleeps wakeable
_sleep_lock = threading.Lock()


def _woken(signum, frame) -> None:
    del signum, frame


def install() -> None:
    """Makes `wake` able to interrupt the main thread (a node's process calls it at its start)."""
    signal.signal(SIGNAL, _woken)


def raise_in(thread: threading.Thread, error: type) -> None:
    """Raises `error` in `thread` at its next Python line, waking it if it waits (`wake`)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                               ctypes.py_object(error))
    wake(thread)


def cancel_raise(thread: threading.Thread) -> None:
    """Withdraws an exception raised in `thread` by `raise_in` that has not landed yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), None)


def wake(thread: threading.Thread) -> None:
    """Ends `thread`'s wait if it can be ended unseen (see the module docstring), so that an
    exception raised in it lands now."""
    if thread is threading.main_thread():
        if signal.getsignal(SIGNAL) is _woken:  # else the node took the signal for itself
            signal.pthread_kill(thread.ident, SIGNAL)
        return
    frame = current_frames().get(thread.ident)
    if (frame is None or frame.f_code is not threading.Condition.wait.__code__
            or frame.f_back is None or frame.f_back.f_code not in _RECHECKING):
        return
    names = frame.f_locals
    condition, waiter = names.get('self'), names.get('waiter')
    if waiter is None or not condition.acquire(timeout=0.1):
        return
    try:
        # Under the condition's lock, as notify() does: once out of the waiters, no notify
        # meant for another thread is spent on this one.
        if waiter in condition._waiters:  # pylint: disable=protected-access
            condition._waiters.remove(waiter)  # pylint: disable=protected-access
            waiter.release()
    finally:
        condition.release()


def tell_threads(stops: Mapping[Hashable, runtime.StopSignal],
                 threads: Mapping[Hashable, threading.Thread],
                 end: Callable[[List[Hashable]], None]) -> None:
    """Tells nodes that run as threads (by key: their stop signals and threads) that the program
    stops: each sees the stop before any stop handler runs, their handlers run, then `end` ends
    those that do not cooperate, and those that do are woken (`wake`)."""
    for stop in stops.values():
        stop.event.set()
    for stop in stops.values():
        stop.trigger()
    end([key for key, stop in stops.items() if not stop.cooperating])
    for key, stop in stops.items():
        thread = threads.get(key)
        if stop.cooperating and thread is not None and thread.is_alive():
            wake(thread)


def wakeable_sleeps() -> Callable[[], None]:
    """Makes `time.sleep` in node threads one that `wake` ends (see the module docstring) until
    the returned function is called; holders may nest, and the last one out puts the
    interpreter's own back (unless someone replaced it since)."""
    global _sleep_holders
    with _sleep_lock:
        _sleep_holders += 1
        if _sleep_holders == 1 and time.sleep is _SLEEP:
            time.sleep = _sleep
    released = []

    def release() -> None:
        global _sleep_holders
        with _sleep_lock:
            if released:
                return
            released.append(True)
            _sleep_holders -= 1
            if _sleep_holders == 0 and time.sleep is _sleep:
                time.sleep = _SLEEP

    return release


def _sleep(seconds) -> None:
    """`time.sleep` as node threads see it while `wakeable_sleeps` is held."""
    if (not isinstance(seconds, (int, float)) or not 0 < seconds <= threading.TIMEOUT_MAX
            or threading.current_thread() is threading.main_thread()
            or runtime.thread_context() is None):
        _SLEEP(seconds)  # its errors, its zero sleep, and signals in the main thread
        return
    deadline = time.monotonic() + seconds
    # Nothing else knows this condition, so it is never released: an exception landing anywhere
    # in its wait leaves nothing to undo.
    ended = threading.Condition(threading.Lock())
    ended.acquire()  # pylint: disable=consider-using-with
    left = seconds
    while left > 0:  # a timed wait may end a hair early
        ended.wait_for(lambda: time.monotonic() >= deadline, left)
        left = deadline - time.monotonic()
