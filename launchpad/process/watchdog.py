"""Hang detection: a node silent past its progress deadline is reported with every thread's stack.

A node reports progress with `lp.heartbeat()` (a server's served calls count too), which stamps
its context's `progress`. One watchdog thread per process compares each watched node's last
progress with its deadline; a node past it is handed to `on_hang(name, summary, stacks)` once, with
the stack of every thread of the process, the node's own thread last (next to the summary, and in
the tail of a log). The worker then reports the
node failed and exits (a thread node is ended by its launcher), and the restart policy decides.

    watched node threads --lp.heartbeat()--> context.progress.last
    lp-watchdog thread:  every deadline/4 s (at most 1 s) compares; on a hang calls on_hang

A node whose process holds the GIL for good (stuck in C code) stops every Python thread, this
one included: `arm_fallback` has the interpreter's faulthandler (a C thread) print the stacks and
end the process once the deadline has passed twice over.
"""
from __future__ import annotations

import faulthandler
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Optional, Tuple

_MAX_INTERVAL = 1.0


def format_stacks(last: Optional[int] = None, skip: Tuple[int, ...] = ()) -> str:
    """The current stack of every thread of this process (thread `last` last), as text."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()  # pylint: disable=protected-access
    order = sorted(frames, key=lambda ident: (ident == last, names.get(ident, '')))
    parts = []
    for ident in order:
        if ident in skip:
            continue
        stack = ''.join(traceback.format_stack(frames[ident]))
        parts.append(f'Thread {names.get(ident, "?")} ({ident}):\n{stack}')
    return '\n'.join(parts)


class ProgressWatchdog:
    """Watches nodes' progress against their deadlines (see the module docstring)."""

    def __init__(self, on_hang: Callable[[str, str, str], None],
                 tick: Optional[Callable[[], None]] = None):
        self._on_hang = on_hang
        self._tick = tick
        self._lock = threading.Lock()
        self._watched: Dict[str, Tuple[Any, float, Optional[int]]] = {}
        self._wakeup = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name='lp-watchdog')
        self._thread.start()

    def watch(self, name: str, context, deadline: float, thread_ident: Optional[int] = None):
        """Watches node `name`'s `context.progress` (its thread first in the report)."""
        with self._lock:
            self._watched[name] = (context, deadline, thread_ident)
        self._wakeup.set()

    def forget(self, name: str) -> None:
        with self._lock:
            self._watched.pop(name, None)

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()

    def _run(self) -> None:
        while not self._closed:
            if self._tick is not None:
                self._tick()
            with self._lock:
                watched = dict(self._watched)
            interval = min([_MAX_INTERVAL] + [deadline / 4 for _, deadline, _ in watched.values()])
            now = time.monotonic()
            for name, (context, deadline, ident) in watched.items():
                silent = now - context.progress.last
                if silent > deadline:
                    self.forget(name)
                    stacks = format_stacks(ident, skip=(threading.get_ident(),))
                    self._on_hang(name, f'no progress for {silent:.1f} s (its progress deadline '
                                        f'is {deadline:g} s)', stacks)
            self._wakeup.wait(interval)
            self._wakeup.clear()


def arm_fallback(deadline: float) -> None:
    """(Re)arms the faulthandler that ends a process frozen with the GIL held (see above); the
    worker's watchdog re-arms it on every round, which stops when the GIL is stuck."""
    faulthandler.dump_traceback_later(2 * deadline + 5, repeat=False, file=sys.stderr, exit=True)
