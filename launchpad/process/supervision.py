"""Why members of a group left, and the nodes that take over their failures (supervision).

The coordinator keeps, per group, a log of its members' departures (`MemberEvent`): a member
finished, was removed, failed (with its error and traceback), was dropped by its restart
policy, or was killed by the program's stop. A group's `lp.GroupClient` reads it
(`events()`).

A node that calls `group.supervise()` owns the group's failures, as an owner does in Monarch's
supervision trees: a member failure that would fail the program (its restart policy, if any,
is spent) is handed to it instead. The member ends `failed`, the program goes on, and the owner
decides: `group.replace(name)` starts the member again, `lp.resize` changes the group, and
`group.fail(name)` fails the program with the member's failure. While no owner runs, a failure
fails the program as usual.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Tuple



@dataclasses.dataclass(frozen=True)
class MemberEvent:
    """A member of a group left it.

    Attributes:
      name: the member ('group/index').
      reason: why: 'finished' (it returned), 'removed' (taken out of the running program),
        'failed' (its failure was handed to the group's owner, or failed the program),
        'dropped' (its restart policy gave up on it) or 'killed' (the program's stop ended it).
      error: its last error, if it had one.
      traceback: the traceback of that error ('' if none was reported).
      attempt: which run of the member left (0: its first; then its restarts).
    """
    name: str
    reason: str
    error: Optional[str] = None
    traceback: str = ''
    attempt: int = 0


def settle_refusal(name: str, state: str, action: str, stop_reason: Optional[str]) -> str:
    """Why the owner cannot `action` ('replace' or 'fail') member `name` in `state` ('' if it
    can)."""
    if action not in ('replace', 'fail'):
        return f"The failure of {name} is settled by 'replace' or 'fail', not {action!r}."
    if stop_reason is not None:
        return (f'The program stops ({stop_reason}): the failure of {name} can no longer be '
                'settled.')
    if state != 'failed':
        return (f'{name} is {state}: only a member whose failure its owner took over (state '
                f'failed) can be replaced or fail the program.')
    return ''


def _label(name: str) -> Optional[str]:
    """The group of a plain node's executable name ('g/3' -> 'g'); None for several nodes."""
    label, _, index = name.rpartition('/')
    return label if label and '+' not in name and index.isdigit() else None


class Supervision:
    """The departure logs of a program's groups and their owners (see the module docstring);
    the coordinator calls it under its lock."""

    def __init__(self):
        self._events: Dict[str, List[MemberEvent]] = {}
        self._seen: Dict[str, str] = {}  # executable -> the state it was last seen in
        self._owners: Dict[str, str] = {}  # group -> the node that supervises it

    def observe(self, statuses: Mapping[str, object],
                last_failure: Callable[[str], Tuple[Optional[str], str]]) -> None:
        """Logs the members that have ended since the last look: `statuses` maps executable ->
        its `NodeStatus`; `last_failure(name)` gives (error, traceback) of its last failure."""
        for name, status in statuses.items():
            state = status.state.value
            if self._seen.get(name) == state:
                continue
            self._seen[name] = state
            label = _label(name)
            if label is None or not status.state.ended:
                continue
            error, traceback = last_failure(name) if state in ('failed', 'dropped') else (
                status.error, '')
            self._events.setdefault(label, []).append(MemberEvent(
                name, state, error, traceback, status.restarts))

    def events(self, label: str, since: int = 0) -> List[MemberEvent]:
        """The departures from group `label`, from the `since`-th on."""
        return list(self._events.get(label, ())[since:])

    def supervise(self, label: str, owner: str) -> None:
        """Node `owner` takes over the failures of group `label`'s members."""
        self._owners[label] = owner

    def owner(self, name: str, running: Callable[[str], bool]) -> Optional[str]:
        """The running node that takes over a failure of member `name`, or None."""
        owner = self._owners.get(_label(name) or '')
        return owner if owner is not None and owner != name and running(owner) else None
