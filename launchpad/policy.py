"""What happens when a node fails or hangs: `RestartPolicy`, and a node's `NodePolicy`.

A program gives policies per group (`program.group('actor', restart=..., progress_deadline=...)`)
and per node (`program.add_node(node, restart=...)`); the launcher hands every executable's policy
to the program's coordinator, which applies it to each failure (`RestartBudget`), and to the
worker, which watches the node's progress. Pure data and arithmetic: this module imports nothing
of launchpad, since it runs wherever a coordinator does (a Slurm job, a Kubernetes pod).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Deque, Dict, Optional

ON_FAILURE = ('fail', 'drop')


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """How often a failed node is started again, and what a node that fails for good does.

    A node that fails (raises, dies, hangs past its progress deadline, or is preempted) is started
    again after a backoff, as long as it has been restarted fewer than `max_restarts` times within
    the last `window` seconds. Past that, it fails for good: with `on_failure='fail'` the program
    fails (as without a policy), with `on_failure='drop'` the node is dropped and the program
    goes on without it. The backoff grows only while a node fails again soon after each start
    (a crash loop): one that ran for `max_backoff` seconds or more before it failed starts again
    after `backoff`, however often it was restarted before.

    Attributes:
      max_restarts: restarts allowed within `window` (0: none; the policy then only says what a
        failure does).
      window: seconds over which restarts are counted (None: the whole run).
      backoff: seconds before the first restart; each further restart of failures in a row (each
        less than `max_backoff` seconds after the node's start) waits twice as long as the one
        before...
      max_backoff: ...up to this many seconds.
      on_failure: 'fail' (the program fails) or 'drop' (the program goes on without the node).
    """
    max_restarts: int = 3
    window: Optional[float] = 600.0
    backoff: float = 1.0
    max_backoff: float = 60.0
    on_failure: str = 'fail'

    def __post_init__(self):
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f'RestartPolicy(max_restarts=...) must be an int >= 0, got '
                             f'{self.max_restarts!r}.')
        if self.window is not None and not _positive(self.window):
            raise ValueError(f'RestartPolicy(window=...) must be a number of seconds > 0, or None '
                             f'for the whole run; got {self.window!r}.')
        for field in ('backoff', 'max_backoff'):
            value = getattr(self, field)
            if not _number(value) or value < 0:
                raise ValueError(f'RestartPolicy({field}=...) must be a number of seconds >= 0, '
                                 f'got {value!r}.')
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"RestartPolicy(on_failure=...) must be 'fail' (the program fails) "
                             f"or 'drop' (the program goes on without the node), got "
                             f'{self.on_failure!r}.')

    def delay(self, in_a_row: int) -> float:
        """Seconds to wait before a restart that follows `in_a_row` failures in a row."""
        return min(self.backoff * 2 ** min(in_a_row, 64), self.max_backoff)

    def describe(self) -> str:
        """The budget in words, for messages."""
        window = 'in the whole run' if self.window is None else f'within {self.window:g} s'
        return f'{self.max_restarts} restart{"s" * (self.max_restarts != 1)} {window}'


@dataclasses.dataclass(frozen=True)
class NodePolicy:
    """One executable's failure handling: its restart policy and its progress deadline.

    Attributes:
      restart: the RestartPolicy, or None (a failure fails the program).
      progress_deadline: seconds the node may go without reporting progress (`lp.heartbeat()`,
        or serving a call) before it counts as hung and fails; None: never. Time its thread
        waits for a CPU or for a courier call's answer does not count (docs/failures.md).
    """
    restart: Optional[RestartPolicy] = None
    progress_deadline: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        """A JSON-able form, for coordinators started from JSON settings (Kubernetes)."""
        return {'restart': None if self.restart is None else dataclasses.asdict(self.restart),
                'progress_deadline': self.progress_deadline}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> NodePolicy:
        restart = data.get('restart')
        return cls(None if restart is None else RestartPolicy(**restart),
                   data.get('progress_deadline'))

    def without_restarts(self) -> NodePolicy:
        """The same policy where nothing can restart nodes: failures are final at once."""
        if self.restart is None or self.restart.max_restarts == 0:
            return self
        return dataclasses.replace(self, restart=dataclasses.replace(self.restart, max_restarts=0))


def check_progress_deadline(value: Any) -> Optional[float]:
    """`value` if it is None or a number of seconds > 0, else a ValueError saying so."""
    if value is not None and not _positive(value):
        raise ValueError(f'progress_deadline must be a number of seconds > 0 (or None), got '
                         f'{value!r}.')
    return value


def check_restart(value: Any) -> Optional[RestartPolicy]:
    """`value` if it is None or a RestartPolicy, else a TypeError saying what to pass."""
    if value is not None and not isinstance(value, RestartPolicy):
        raise TypeError(f'restart= takes an lp.RestartPolicy(...) (or None), got {value!r}.')
    return value


class RestartBudget:
    """The restarts one node has had, measured against its RestartPolicy."""

    def __init__(self, policy: Optional[RestartPolicy]):
        self.policy = policy
        self._times: Deque[float] = collections.deque()
        self._in_a_row = 0  # restarts since the node last ran for max_backoff s before failing

    def next_delay(self, now: float, ran: Optional[float] = None) -> Optional[float]:
        """Seconds until the node may start again after a failure at `now` of an instance that
        ran `ran` seconds (None: it never started), or None if the policy allows no more
        restarts (the failure is final). Counts the restart if allowed."""
        policy = self.policy
        if policy is None:
            return None
        if policy.window is not None:
            while self._times and self._times[0] <= now - policy.window:
                self._times.popleft()
        if len(self._times) >= policy.max_restarts:
            return None
        if ran is not None and ran >= policy.max_backoff:
            self._in_a_row = 0  # it ran well: not a crash loop
        delay = policy.delay(min(self._in_a_row, len(self._times)))
        self._in_a_row += 1
        self._times.append(now)
        return delay


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _positive(value: Any) -> bool:
    return _number(value) and value > 0
