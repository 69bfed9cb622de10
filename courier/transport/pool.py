"""A bounded pool of worker threads for the framed server: they run calls and read busy connections.

    submit(fn, *args) ──▶ jobs (SimpleQueue) ──▶ worker 1 .. size ──▶ fn(*args)
                                                      │
            a worker serving a connection that keeps calling waits on it between calls:
            while the pool is roomy() it just reads (the socket's receive timeout ends
            the wait); otherwise linger() polls the connection and the wake pipe
                                                      ▲
    submit() finding no waiting worker and no room for another thread writes the wake
    pipe: lingering workers then give their connections back and take the waiting work.

Threads start as needed, up to ``size``, and live until :meth:`Pool.stop`. Whatever a
worker does (a call, or serving a connection's calls one after another) holds one of
the ``size`` threads, so ``size`` bounds the calls running at once.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time
import weakref
from typing import Any, Callable, List

_logger = logging.getLogger('courier')


class Pool:
    """Up to ``size`` threads running submitted functions, started as needed."""

    def __init__(self, size: int, name: str):
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: List[None] = []  # One entry per thread waiting for a job.
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._lingering: List[None] = []  # One entry per lingering worker (append/pop are atomic).
        self._nudged = False
        self._stopped = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        # The threads hold the pool until they end: only then may the pipe's numbers be reused.
        weakref.finalize(self, _close_all, (self._wake_read, self._wake_write))

    def submit(self, fn: Callable, *args: Any) -> None:
        """Runs ``fn(*args)`` on a worker thread, now or once one is free."""
        self._jobs.put((fn, args))
        if self._waiting:  # A waiting worker takes it.
            return
        self._make_room()

    def _make_room(self) -> None:
        """Finds a thread for a job that waits: a new one, or a lingering worker let go."""
        if len(self._threads) < self._size:
            with self._lock:
                if len(self._threads) < self._size and not self._stopped:
                    thread = threading.Thread(target=self._work, daemon=True, name=self._name)
                    self._threads.append(thread)
                    thread.start()
                    return
        if self._lingering:
            self._nudge()

    def pressed(self) -> bool:
        """Whether submitted work waits for a thread (a worker should let go of what it holds)."""
        return (not self._jobs.empty() and not self._waiting
                and len(self._threads) >= self._size)

    def roomy(self) -> bool:
        """Whether at least two more jobs would find a thread at once.

        A worker may then wait for its connection's next call in a plain blocking read (with
        the socket's receive timeout), which costs no system call of its own but cannot be cut
        short: the room left takes what comes meanwhile.
        """
        return len(self._waiting) + self._size - len(self._threads) >= 2

    def poller(self, sock: Any) -> 'select.poll':
        """Returns what :meth:`linger` waits on: ``sock`` and the pool's wake pipe."""
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        return poller

    def linger(self, poller: 'select.poll', milliseconds: int) -> bool:
        """Waits until the poller's socket is readable (True), or up to ``milliseconds`` (False).

        Returns False at once when work waits for a thread, and as soon as some comes.
        """
        if self.pressed():
            return False
        lingering = self._lingering
        lingering.append(None)
        try:
            events = poller.poll(milliseconds)
        finally:
            lingering.pop()
        if not events:
            return False
        for fd, _ in events:
            if fd == self._wake_read:
                self._drain()
                return False
        return True

    def _nudge(self) -> None:
        with self._lock:
            if self._nudged or self._stopped:
                return
            self._nudged = True
        try:
            os.write(self._wake_write, b'!')
        except OSError:  # Full (it is nudged already) or closed (stopped).
            pass

    def _drain(self) -> None:
        with self._lock:
            if not self._nudged:
                return
            self._nudged = False
            try:
                os.read(self._wake_read, 64)
            except OSError:
                pass

    def _work(self) -> None:
        get = self._jobs.get
        waiting = self._waiting
        while True:
            waiting.append(None)
            try:
                item = get()
            finally:
                waiting.pop()
            if item is None:
                return
            if not waiting and not self._jobs.empty():
                # A job came while this worker still counted as waiting (between `get` and
                # `pop`): its submitter left it to us, but we may be gone for long (a
                # connection that keeps calling), so it needs a thread of its own.
                self._make_room()
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # pylint: disable=broad-except
                _logger.exception('courier server worker failed')
            del item, fn, args

    def stop(self, timeout: float = 0.0) -> None:
        """Ends the threads once they are done with the work submitted so far.

        Waits up to ``timeout`` seconds for them (a method that never returns keeps its thread).
        """
        with self._lock:
            self._stopped = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        try:
            os.write(self._wake_write, b'!')  # Lingering workers let go of their connections.
        except OSError:
            pass
        end = time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, end - time.monotonic()))


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
