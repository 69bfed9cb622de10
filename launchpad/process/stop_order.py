"""The order in which a program's executables hear its stop: callers before what they call.

A node that holds another's handle calls it: actors call the replay and the learner, the learner
calls the replay. If every node heard the stop at once, a replay server could shut down while
an actor's stop handler still flushes its writes to it, and the actor would sit in that call
until the notice period ran out and it was killed. So a program stops in graph order:

    stop ──► actor/0, actor/1, evaluator/0   (no one calls them: told at once)
                   │ all of them ended
                   ▼
             learner/0                        (called by the actors and the evaluator)
                   │ it ended
                   ▼
             replay/0, counter/0              (called by all of the above)

An executable is told once every executable that calls it has ended. Executables that call each
other in a cycle are told together, once every caller from outside the cycle has ended. Whatever
happens, every executable is told at the latest `fallback` seconds after the stop began (half the
notice period), so that one that waits for a slow caller still has time for its own stop handlers.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Mapping, Set


def _executables_of_group(label: str, names: Iterable[str]) -> Set[str]:
    """The executables among `names` that run a node of group `label`."""
    prefix = label + '/'
    return {name for name in names if any(part.startswith(prefix) for part in name.split('+'))}


class StopOrder:
    """Who calls whom among a program's executables (by executable name), and so when each hears
    the program's stop (see the module docstring).

    `calls`: executable -> the executables it calls; `group_calls`: executable -> the labels of
    the groups it calls as a whole (an `lp.GroupClient`), whose members may come and go.
    """

    def __init__(self, calls: Mapping[str, Iterable[str]], fallback: float, *,
                 group_calls: Mapping[str, Iterable[str]] = None):
        if not fallback >= 0:
            raise ValueError(f'StopOrder(fallback=...) is seconds >= 0, got {fallback!r}.')
        self.fallback = float(fallback)
        self._calls: Dict[str, Set[str]] = {}
        self._group_calls: Dict[str, Set[str]] = {}
        self.add(calls, group_calls or {})

    def add(self, calls: Mapping[str, Iterable[str]],
            group_calls: Mapping[str, Iterable[str]] = None) -> None:
        """Adds executables (nodes that join the running program) and the calls they make."""
        for caller, callees in calls.items():
            self._calls.setdefault(caller, set()).update(c for c in callees if c != caller)
        for caller, labels in (group_calls or {}).items():
            self._group_calls.setdefault(caller, set()).update(labels)

    def callees(self, caller: str, names: Iterable[str]) -> Set[str]:
        """What executable `caller` calls, among the executables `names` of the program."""
        found = {name for name in self._calls.get(caller, ())}
        for label in self._group_calls.get(caller, ()):
            found |= _executables_of_group(label, names)
        found.discard(caller)
        return found

    def told(self, names: Iterable[str], ended: Callable[[str], bool],
             since_stop: float) -> Set[str]:
        """The executables of `names` told to stop `since_stop` seconds after the stop began,
        where `ended(name)` says whether an executable has ended."""
        names = list(names)
        if since_stop >= self.fallback:
            return set(names)
        calls = {name: self.callees(name, names) for name in names}
        callers: Dict[str, Set[str]] = {name: set() for name in names}
        for caller, callees in calls.items():
            for callee in callees:
                callers.setdefault(callee, set()).add(caller)
        told = set()
        for name in names:
            cycle = _reachable(name, calls) & _reachable(name, callers)
            cycle.add(name)
            if all(ended(caller) for member in cycle for caller in callers.get(member, ())
                   if caller not in cycle):
                told.add(name)
        return told


def _reachable(start: str, edges: Mapping[str, Set[str]]) -> Set[str]:
    """Every name reached from `start` along `edges` (`start` only if on a cycle)."""
    seen: Set[str] = set()
    pending = list(edges.get(start, ()))
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(edges.get(name, ()))
    return seen
