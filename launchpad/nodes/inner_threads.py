"""The inner nodes of a thread colocation (`lp.MultiThreadingColocation`), and how they stop.

One inner node runs on the thread that runs the colocation (a node process's main thread on
local_mp), the others on threads of their own. Each has its own stop signal, and the program's
stop reaches them in graph order, as it reaches the program's executables
(`launchpad.process.stop_order`): an inner node that calls another hears it first, and the one
it calls keeps serving until its callers inside the colocation have ended, or for at most a
quarter of the notice period. A learner colocated with its replay thus flushes and ends before
the replay stops.

The node on the calling thread is one that no other inner node calls (a learner rather than its
replay): on a process's main thread, its waits can be interrupted once its stop handlers ran
(`launchpad.process.interrupt`), as a node's in a process of its own. The others are woken from
a queue's wait or a sleep, as local_mt's node threads are.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

from launchpad import runtime
from launchpad.nodes.base import Node
from launchpad.process import interrupt
from launchpad.process.coordinator import NodeStopped, ended_by_stop
from launchpad.process.stop_order import StopOrder

_ABANDON_AFTER = 1.0  # seconds a thread gets to end after NodeStopped before it is left behind
_POLL = 0.05


class InnerThreads:
    """Runs `nodes` (a colocation's, named `label`) as threads of this executable, with the
    colocation's `context` (see the module docstring)."""

    def __init__(self, nodes: Sequence[Node], label: str, context: runtime.NodeContext,
                 return_on_first_completed: bool = False):
        self._nodes = list(nodes)
        self._outer = context
        self._enough = 1 if return_on_first_completed else len(self._nodes)
        self._contexts = [
            dataclasses.replace(context, label=label, index=index,
                                stop=runtime.StopSignal(context.stop.request))
            for index in range(len(self._nodes))]
        calls = _inner_calls(self._nodes)
        self._order = StopOrder({str(i): {str(j) for j in callees} for i, callees in calls.items()},
                                fallback=context.notice_period / 4)
        called = {callee for callees in calls.values() for callee in callees}
        self._here = next((i for i in range(len(self._nodes)) if i not in called), 0)
        self._done = threading.Condition()
        self._threads: Dict[int, threading.Thread] = {}
        self._ended: Set[int] = set()
        self._finished: List[int] = []
        self._failures: List[Tuple[int, BaseException]] = []
        self._stopped: Dict[int, float] = {}  # index -> when NodeStopped was raised in it

    def run(self) -> Optional[Tuple[int, BaseException]]:
        """Runs the inner nodes until they have ended (the first of them, with
        `return_on_first_completed`) or one failed; (index, error) of the first failure."""
        for index, node in enumerate(self._nodes):
            if index != self._here:
                self._threads[index] = threading.Thread(
                    target=self._run_node, args=(index,), name=f'lp-{node.name}', daemon=True)
        self._threads[self._here] = threading.current_thread()
        for index, thread in self._threads.items():
            if index != self._here:
                thread.start()
        self._outer.stop.add_handler(self._heard_stop)
        ordinary_sleeps = interrupt.wakeable_sleeps()
        try:
            try:
                self._run_node(self._here)
            finally:
                runtime.set_thread_context(self._outer)
            with self._done:
                while not self._over():  # a node left behind is seen within a poll
                    self._done.wait(_POLL)
        except interrupt.RAISED_AT_STOP:
            pass  # raised to end the node here (by the colocation or a stop handler): it had ended
        finally:
            interrupt.cancel_raise(threading.current_thread())
            self._outer.stop.remove_handler(self._heard_stop)
            ordinary_sleeps()
        with self._done:
            return self._failures[0] if self._failures else None

    def _run_node(self, index: int) -> None:
        context = self._contexts[index]
        runtime.set_thread_context(context)
        error = None
        try:
            try:
                self._nodes[index].run_in_context()
            except SystemExit as e:  # it ends as a node's process would: by its exit code
                if e.code not in (None, 0):
                    error = e
            except BaseException as e:  # pylint: disable=broad-except
                if not ended_by_stop(e, context):  # else it ended with the program
                    error = e
        except interrupt.RAISED_AT_STOP:
            pass  # raised at the stop as the node ended, it landed in the lines above
        self._record_end(index, error)

    def _record_end(self, index: int, error: Optional[BaseException]) -> None:
        """Records how inner node `index` (the calling thread's) ended; if the colocation ends
        with it, ends the node on the calling thread. An exception raised in this thread at the
        stop as the node ended may land here still: it is withdrawn under the lock."""
        while True:
            try:
                with self._done:
                    interrupt.cancel_raise(threading.current_thread())
                    if index not in self._ended:
                        self._ended.add(index)
                        if error is None:
                            self._finished.append(index)
                        else:
                            self._failures.append((index, error))
                        self._done.notify_all()
                    end_here = index != self._here and self._here not in self._ended and (
                        self._failures or len(self._finished) >= self._enough)
                break
            except interrupt.RAISED_AT_STOP:
                pass
        if end_here:  # the colocation ends: so does the node on the calling thread
            self._contexts[self._here].stop.event.set()
            self._raise_stopped([self._here])

    def _over(self) -> bool:
        """Whether the colocation ends: enough inner nodes finished, one failed, or those left
        were ended at the stop and did not end (their threads are left behind)."""
        if self._failures or len(self._finished) >= self._enough:
            return True
        now = time.monotonic()
        return all(index in self._ended or now - self._stopped.get(index, now) > _ABANDON_AFTER
                   for index in range(len(self._nodes)))

    def _heard_stop(self) -> None:
        """The colocation is told that the program stops: its inner nodes are told in order."""
        threading.Thread(target=self._tell_in_order, daemon=True,
                         name=f'lp-{self._outer.node_name}-stop').start()

    def _tell_in_order(self) -> None:
        began = time.monotonic()
        told: Set[str] = set()
        names = [str(index) for index in range(len(self._nodes))]
        while True:
            with self._done:
                ended = set(self._ended)
                if self._over() or len(told | {str(i) for i in ended}) == len(names):
                    return
                now_told = self._order.told(names, lambda name: int(name) in ended,
                                            time.monotonic() - began)
                if now_told <= told:
                    self._done.wait(_POLL)
                    continue
            indices = sorted(int(name) for name in now_told - told if int(name) not in ended)
            interrupt.tell_threads({index: self._contexts[index].stop for index in indices},
                                   self._threads, self._raise_stopped)
            told |= now_told

    def _raise_stopped(self, indices: Sequence[int]) -> None:
        with self._done:
            for index in indices:
                if index not in self._ended and index not in self._stopped:
                    self._stopped[index] = time.monotonic()
                    interrupt.raise_in(self._threads[index], NodeStopped)


def _inner_calls(nodes: Sequence[Node]) -> Dict[int, Set[int]]:
    """Inner node index -> the indices of the inner nodes whose handles it holds."""
    index_of = {node.node_id: index for index, node in enumerate(nodes)}
    calls: Dict[int, Set[int]] = {}
    for index, node in enumerate(nodes):
        for handle in node.input_handles:
            callee = index_of.get(handle.node_id)
            if callee is not None and callee != index:
                calls.setdefault(index, set()).add(callee)
    return calls
