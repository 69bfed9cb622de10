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
- a courier call's wait in a node's thread (`future.result()`, or a blocking call to a server of
  the same process, as every call between local_mt's nodes is) blocks on a lock in C, but as
  `Condition.wait` does: on a waiter lock of its own in its future's condition, waiting again
  unless the future is done. It is woken the same way (a call to another process waits in a
  socket, which nothing wakes).
- a sleep in a node's thread: `time.sleep` is a call blocked in C that no signal ends in a
  thread, and Acme's checkpointing counter sleeps a second at a time under its stop handler's
  SystemExit. While node threads run (`hold_for_node_threads`: a thread launch, a thread
  colocation), `time.sleep` in a thread with a node context of its own (not the main thread,
  not threads the node started) waits in `Condition.wait_for` instead, which `wake` ends: a
  pending exception lands, and without one it sleeps on until its time is up, as `time.sleep`
  would.

An exception raised in a thread lands wherever it runs Python code next, which may be a finalizer
that a collection runs there (a weakref callback or a `__del__`, such as those that close courier's
sockets and pipes), and Python drops what a finalizer raises. While node threads run, such an
exception that landed in a node's thread is raised there again (`sys.unraisablehook`), to land once
the finalizer is over, rather than a second time half a second later, or never.

An exception raised by thread id can also miss its thread when that thread starts one: until a
new thread runs, CPython 3.11 gives it the id of the thread that starts it, and
PyThreadState_SetAsyncExc raises in the newest thread of that id, the new one, which it ends
before it reports that it started, so the starter then waits in `Thread.start` for ever (seen:
NodeStopped raised in a node thread whose call to a server of its process started one of the
server's workers). While node threads run, `raise_in` therefore holds back an exception for a
thread that is starting one, which raises it itself once its start is over (`_start`); and so
does `_set_async_exc`, which is `ctypes.pythonapi.PyThreadState_SetAsyncExc` meanwhile, for a
stop handler that raises by thread id itself (as Acme's `runtime_terminator` raises SystemExit).

A thread's id passes to the next thread the system starts once it has ended, so `raise_in` raises
in a thread only while it is in `threading`'s list of running threads, which it leaves before it
ends (checked right before the raise, not under that list's lock: a signal handler may run inside
`threading`'s own code that holds it): an exception for a node thread that ended just before
(`_raise_again`'s, say) does not land in one that started with its id since.
"""
from __future__ import annotations

import ctypes
import queue
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Dict, Hashable, List, Mapping

from courier.transport import _compat
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
# A courier call's wait for its answer (its future's, a blocking call's to a server of this
# process), which blocks on a waiter of its own in its future's condition and waits again
# unless the future is done.
_FUTURE_WAIT = _compat.LightFuture._wait_done.__code__  # pylint: disable=protected-access


_SLEEP = time.sleep  # the interpreter's own
_START = threading.Thread.start  # the interpreter's own
_SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc  # the interpreter's own
_starts_lock = threading.RLock()  # guards the two below, and `raise_in` against them
_starting: Dict[int, List[object]] = {}  # thread id -> a token per thread start it is inside
_held_back: Dict[int, Any] = {}  # thread id -> what was raised in it while it started one
_holders = 0  # launches and colocations whose node threads run (`hold_for_node_threads`)
_holders_lock = threading.Lock()
_unraisable_before = sys.unraisablehook  # the hook `_unraisable` hands what is not its own to


def _woken(signum, frame) -> None:
    del signum, frame


def install() -> None:
    """Makes `wake` able to interrupt the main thread (a node's process calls it at its start)."""
    signal.signal(SIGNAL, _woken)


def raise_in(thread: threading.Thread, error: type) -> None:
    """Raises `error` in `thread` at its next Python line, waking it if it waits (`wake`); in a
    thread that is starting one, once that start is over (see the module docstring)."""
    ident, raised = ctypes.c_ulong(thread.ident), ctypes.py_object(error)
    with _starts_lock:
        if _hold_back(thread.ident, error):
            return
        if threading._active.get(thread.ident) is not thread:  # pylint: disable=protected-access
            return  # it has ended, and its id may be another thread's now
        _SET_ASYNC_EXC(ident, raised)
    wake(thread)


def _hold_back(ident: int, error) -> bool:
    """(Under `_starts_lock`) holds `error` back for thread `ident` if it is starting a thread,
    to be raised once that start is over (`_start`); True if it did."""
    if not _starting.get(ident):
        return False
    _held_back[ident] = error
    return True


def _set_async_exc(ident, error) -> int:
    """`ctypes.pythonapi.PyThreadState_SetAsyncExc` while `hold_for_node_threads` is held: an
    exception raised through it (by a stop handler itself) in a thread that is starting one is
    held back as `raise_in` holds it; the rest, and withdrawals, go to the interpreter's own."""
    number = getattr(ident, 'value', ident)
    try:
        raised = getattr(error, 'value', error)
    except ValueError:  # (a NULL py_object: a withdrawal)
        raised = None
    raising = isinstance(raised, BaseException) or (isinstance(raised, type)
                                                    and issubclass(raised, BaseException))
    with _starts_lock:
        if not raising:
            _held_back.pop(number, None)
        elif _hold_back(number, raised):
            return 1  # (as many threads as it reached)
        return _SET_ASYNC_EXC(ctypes.c_ulong(number),
                              ctypes.py_object(raised) if raised is not None else None)


def cancel_raise(thread: threading.Thread) -> None:
    """Withdraws an exception raised in `thread` by `raise_in` that has not landed yet."""
    with _starts_lock:
        _held_back.pop(thread.ident, None)
        _SET_ASYNC_EXC(ctypes.c_ulong(thread.ident), None)


def wake(thread: threading.Thread) -> None:
    """Ends `thread`'s wait if it can be ended unseen (see the module docstring), so that an
    exception raised in it lands now."""
    if thread is threading.main_thread():
        if signal.getsignal(SIGNAL) is _woken:  # else the node took the signal for itself
            signal.pthread_kill(thread.ident, SIGNAL)
        return
    frame = current_frames().get(thread.ident)
    condition, waiter = _wakeable_wait(frame) if frame is not None else (None, None)
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


def _wakeable_wait(frame: FrameType) -> tuple:
    """The condition and waiter lock of the wait that `frame` blocks in, if `wake` may end it
    (one that waits again unless its condition holds); else (None, None)."""
    code = frame.f_code
    if code is _FUTURE_WAIT:
        names = frame.f_locals
        return names.get('condition'), names.get('waiter')
    if (code is threading.Condition.wait.__code__ and frame.f_back is not None
            and frame.f_back.f_code in _RECHECKING):
        names = frame.f_locals
        return names.get('self'), names.get('waiter')
    return None, None


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


def hold_for_node_threads() -> Callable[[], None]:
    """While node threads run (a thread launch, a thread colocation): makes `time.sleep` in them
    one that `wake` ends, has an exception raised in them at the stop that lands in a
    finalizer land again after it, and one raised in a thread that starts one (by `raise_in`
    or through ctypes) land after the start (see the module docstring), until the returned
    function is called. Holders may nest; the last one out puts the interpreter's own sleep,
    hook, start and ctypes function back (unless someone replaced them since)."""
    global _holders, _unraisable_before
    with _holders_lock:
        _holders += 1
        if _holders == 1:
            _swap(installing=True)
            if sys.unraisablehook is not _unraisable:
                _unraisable_before, sys.unraisablehook = sys.unraisablehook, _unraisable
    released = []

    def release() -> None:
        global _holders
        with _holders_lock:
            if released:
                return
            released.append(True)
            _holders -= 1
            if _holders == 0:
                _swap(installing=False)
                if sys.unraisablehook is _unraisable:
                    sys.unraisablehook = _unraisable_before

    return release


def _swap(installing: bool) -> None:
    """(Under `_holders_lock`) puts this module's sleep, thread start and ctypes raise in place
    of the interpreter's own (`installing`), or the interpreter's own back; a function that
    someone else replaced meanwhile is left as it is."""
    for owner, name, own, ours in ((time, 'sleep', _SLEEP, _sleep),
                                   (threading.Thread, 'start', _START, _start),
                                   (ctypes.pythonapi, 'PyThreadState_SetAsyncExc',
                                    _SET_ASYNC_EXC, _set_async_exc)):
        before, after = (own, ours) if installing else (ours, own)
        if getattr(owner, name) is before:
            setattr(owner, name, after)


def _unraisable(unraisable) -> None:
    """`sys.unraisablehook` while `hold_for_node_threads` is held: an exception raised in a node's
    thread at the stop that landed in a finalizer run there (a weakref callback or a `__del__`
    of what a collection found; Python drops what they raise) is raised in the thread again,
    once it has left this hook (`_raise_again`); anything else goes to the hook before."""
    if (unraisable.exc_type is not None and issubclass(unraisable.exc_type, RAISED_AT_STOP)
            and threading.current_thread() is not threading.main_thread()
            and runtime.thread_context() is not None):
        threading.Thread(target=_raise_again, args=(threading.current_thread(),
                                                    unraisable.exc_type),
                         daemon=True, name='lp-raise-again').start()
        return
    _unraisable_before(unraisable)


def _raise_again(thread: threading.Thread, error: type) -> None:
    """Raises `error` in `thread` (`raise_in`) once it is out of `_unraisable`: raised from the
    hook itself, it would land there, where it would be lost again."""
    deadline = time.monotonic() + 1.0
    while thread.is_alive() and time.monotonic() < deadline:
        frame = current_frames().get(thread.ident)
        while frame is not None and frame.f_code is not _unraisable.__code__:
            frame = frame.f_back
        if frame is None:
            raise_in(thread, error)
            return
        _SLEEP(0.001)


def _sleep(seconds) -> None:
    """`time.sleep` as node threads see it while `hold_for_node_threads` is held."""
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


def _start(self: threading.Thread) -> None:
    """`Thread.start` while `hold_for_node_threads` is held: an exception that `raise_in` raises
    in the starting thread meanwhile is raised once the new thread runs (see the module
    docstring)."""
    me, token = threading.get_ident(), object()
    try:
        with _starts_lock:
            _starting.setdefault(me, []).append(token)
        _START(self)
    finally:
        with _starts_lock:
            tokens = _starting.get(me, [])
            if token in tokens:
                tokens.remove(token)
            if not tokens:
                _starting.pop(me, None)
            error = None if tokens else _held_back.pop(me, None)
        if error is not None:
            raise error
