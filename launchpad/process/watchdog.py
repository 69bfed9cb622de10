"""Hang detection: a node silent past its progress deadline is reported with every thread's stack.

A node reports progress with `lp.heartbeat()` (a server's served calls count too), which stamps
its context's `progress`. One watchdog thread per process compares each watched node's silence
with its deadline; a node past it is handed to `on_hang(name, summary, stacks)` once, with the
stack of every thread of the process, the node's own thread last (next to the summary, and in the
tail of a log). The worker then reports the node failed and exits (a thread node is ended by its
launcher), and the restart policy decides.

    watched node threads --lp.heartbeat()--> context.progress.last
    lp-watchdog thread:  every deadline/4 s (at most 1 s), and when a silent node's deadline
                         passes, compares; on a hang calls on_hang

Silence counts only the time the node could have used (`_Excused`): each round, the time its
thread waited for a CPU (Linux: the thread's run-queue delay in /proc; everywhere: how late the
watchdog itself woke, which covers a throttled cgroup or a stopped process) or for the answer of
a blocking courier call (`courier.inflight`), whichever is longest, is not counted. A loaded
machine, or a node that waits on a slow, restarting or unreachable peer, is not hung; the peer
has its own deadline.

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
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from courier import inflight
from courier import metrics as courier_metrics
from launchpad.process.frames import current_frames

_MAX_INTERVAL = 1.0
_MIN_INTERVAL = 0.01


def format_stacks(last: Optional[int] = None, skip: Tuple[int, ...] = ()) -> str:
    """The current stack of every thread of this process (thread `last` last), as text."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = current_frames()
    order = sorted(frames, key=lambda ident: (ident == last, names.get(ident, '')))
    parts = []
    for ident in order:
        if ident in skip:
            continue
        stack = ''.join(traceback.format_stack(frames[ident]))
        parts.append(f'Thread {names.get(ident, "?")} ({ident}):\n{stack}')
    return '\n'.join(parts)


def _run_delay(native_id: Optional[int]) -> Optional[float]:
    """Seconds thread `native_id` of this process has waited on a run queue (Linux), or None."""
    if native_id is None:
        return None
    try:
        with open(f'/proc/self/task/{native_id}/schedstat', 'rb') as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _call_wait(ident: Optional[int], since: float) -> float:
    """Seconds since `since` (a courier clock time) that thread `ident` has been waiting for the
    answer of the blocking courier call it is in now (0 if none)."""
    if ident is None:
        return 0.0
    starts = [entry[2] for entry in list(inflight.waiting.values())
              if len(entry) == 4 and entry[3] == ident]
    return max(0.0, courier_metrics.clock() - max(min(starts), since)) if starts else 0.0


def until_next_look(nodes: Iterable[Tuple[float, float]]) -> float:
    """Seconds until the watchdog looks again at nodes given as (deadline, silence counted so
    far): every quarter deadline (at most every second), and when a deadline would pass if the
    node stays silent, so that a hang is reported then rather than up to a round later."""
    nodes = list(nodes)
    return max(_MIN_INTERVAL, min([_MAX_INTERVAL] + [deadline / 4 for deadline, _ in nodes]
                                  + [deadline - counted for deadline, counted in nodes]))


class _Excused:
    """Seconds of a node's silence that it could not use (see the module docstring)."""

    def __init__(self, ident: Optional[int]):
        self.ident = ident
        self._native_id = next((t.native_id for t in threading.enumerate() if t.ident == ident),
                               None)
        self._delay = _run_delay(self._native_id)
        self._call_clock = courier_metrics.clock()
        self._last: Optional[float] = None
        self._total = 0.0

    def of_silence(self, last: float, now: float, elapsed: float, late: float) -> float:
        """The excused part of the silence since progress `last`, after a round of `elapsed` s
        in which the watchdog woke `late` s late. What the round excuses is taken to lie after
        a progress reported during it."""
        delay = _run_delay(self._native_id)
        queued = 0.0 if delay is None or self._delay is None else delay - self._delay
        self._delay = delay
        waited = _call_wait(self.ident, self._call_clock)
        self._call_clock = courier_metrics.clock()
        excused = min(elapsed, max(late, queued, waited))
        if last != self._last:
            self._last, self._total = last, 0.0
        self._total = min(now - last, self._total + excused)
        return self._total


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
        excused: Dict[str, _Excused] = {}
        woke = time.monotonic()
        interval = 0.0
        while not self._closed:
            if self._tick is not None:
                self._tick()
            with self._lock:
                watched = dict(self._watched)
            now = time.monotonic()
            elapsed, late = now - woke, max(0.0, now - woke - interval)
            for name in set(excused) - set(watched):
                del excused[name]
            silences = []
            for name, (context, deadline, ident) in watched.items():
                last = context.progress.last
                if name not in excused or excused[name].ident != ident:
                    excused[name] = _Excused(ident)
                silent = now - last
                counted = silent - excused[name].of_silence(last, now, elapsed, late)
                if counted > deadline:
                    self.forget(name)
                    stacks = format_stacks(ident, skip=(threading.get_ident(),))
                    self._on_hang(name, f'no progress for {silent:.1f} s, {counted:.1f} s of it '
                                        f'counted (its progress deadline is {deadline:g} s)',
                                  stacks)
                else:
                    silences.append((deadline, counted))
            interval = until_next_look(silences)
            woke = time.monotonic()
            self._wakeup.wait(interval)
            self._wakeup.clear()


def arm_fallback(deadline: float) -> None:
    """(Re)arms the faulthandler that ends a process frozen with the GIL held (see above); the
    worker's watchdog re-arms it on every round, which stops when the GIL is stuck."""
    faulthandler.dump_traceback_later(2 * deadline + 5, repeat=False, file=sys.stderr, exit=True)
