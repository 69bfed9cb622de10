"""How big elastic groups should be: `Elastic` (a group's bounds, budget and node factory),
scaling policies, and the `Scaler` that applies a policy within the bounds and logs each decision.

A scaling policy is any callable `policy(metrics, now, sizes) -> {group: target size}`:

* `metrics`: node name -> {metric name: latest value}, what nodes reported with `lp.report` /
  `lp.count`;
* `now`: seconds since the program started;
* `sizes`: group label -> how many nodes it has now.

It returns the targets of the groups it wants changed (others are left alone). The launcher's
controller calls it every `interval` seconds and grows or shrinks the groups, after `Scaler`
clipped each target to its group's `Elastic` bounds and budget. Two policies ship here:
`QueueLengthPolicy` (size follows a backlog reported by a node) and `ProgressPerActorPolicy`
(MinionsRL's idea: grow actors while the learner's progress per actor improves, shrink when it
does not). Pure arithmetic: this module imports nothing of launchpad.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Dict, List, Mapping, Optional

Metrics = Mapping[str, Mapping[str, float]]
ScalingPolicy = Callable[[Metrics, float, Mapping[str, int]], Mapping[str, int]]

# Seconds after the launch before a policy says that no node reports its metric: nodes may be
# slow to start (a pod's image to pull, a learner's first update).
METRIC_GRACE = 60.0


@dataclasses.dataclass(frozen=True)
class Elastic:
    """What an elastic group may become (`program.group(label, elastic=lp.Elastic(...))`).

    Attributes:
      make_node: builds one more node of the group, in the launching process, when it grows
        (`controller.resize`, `lp.resize` inside a node, a scaling policy); it may capture
        handles of the program's other nodes. None: the group grows only by `add_node`.
      min_size: the fewest nodes a policy may leave it (its budget spent, it shrinks to this).
      max_size: the most nodes a policy may give it (None: no limit).
      budget: node-seconds the group may use in all (the sum over time of its size); once spent,
        policies can only keep it at `min_size`. None: no budget.
    """
    make_node: Optional[Callable[[], Any]] = None
    min_size: int = 0
    max_size: Optional[int] = None
    budget: Optional[float] = None

    def __post_init__(self):
        if self.make_node is not None and not callable(self.make_node):
            raise TypeError(f'Elastic(make_node=...) is a function returning a new node, got '
                            f'{self.make_node!r}.')
        if not isinstance(self.min_size, int) or self.min_size < 0:
            raise ValueError(f'Elastic(min_size=...) is an int >= 0, got {self.min_size!r}.')
        if self.max_size is not None and (not isinstance(self.max_size, int)
                                          or self.max_size < max(1, self.min_size)):
            raise ValueError(f'Elastic(max_size=...) is an int >= max(1, min_size) '
                             f'({max(1, self.min_size)}), or None; got {self.max_size!r}.')
        if self.budget is not None and (isinstance(self.budget, bool) or not isinstance(
                self.budget, (int, float)) or not self.budget > 0):
            raise ValueError(f'Elastic(budget=...) is a number of node-seconds > 0, or None; got '
                             f'{self.budget!r}.')

    def clip(self, size: int) -> int:
        """`size` within [min_size, max_size]."""
        size = max(self.min_size, size)
        return size if self.max_size is None else min(self.max_size, size)


def check_size(label: str, size: int, groups: Optional[Mapping[str, Elastic]],
               current: int) -> None:
    """Raises, saying why, if group `label` cannot be resized to `size` nodes from `current`:
    `groups` maps every group of the program to its `Elastic` (a default one for a group that
    is not elastic: it may shrink, but has no node factory to grow); None checks the size
    alone."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f'A group size is an int >= 0, got {size!r}.')
    if groups is None:
        return
    elastic = groups.get(label)
    if elastic is None:
        raise KeyError(f'The program has no group {label!r}; its groups are {sorted(groups)}.')
    if elastic.clip(size) != size:
        allowed = (f'{elastic.min_size} to {elastic.max_size}' if elastic.max_size is not None
                   else f'at least {elastic.min_size}')
        raise ValueError(f'Group {label!r} cannot have {size} nodes: its lp.Elastic allows '
                         f'{allowed}.')
    if size > current and elastic.make_node is None:
        raise ValueError(f'Group {label!r} cannot grow to {size} nodes by itself: it has no '
                         'node factory. Give it program.group(label, elastic=lp.Elastic('
                         'make_node=...)), or add nodes with controller.add_node(node, label).')


@dataclasses.dataclass
class Decision:
    """One scaling decision, as the controller logs it (`controller.scaling_log`).

    Attributes:
      time: seconds since the program started.
      group: the group's label.
      size: its size before.
      wanted: what the policy asked for.
      target: what it was set to (after bounds and budget).
      reason: why target differs from wanted ('' if it does not).
      spent: node-seconds the group had used.
    """
    time: float
    group: str
    size: int
    wanted: int
    target: int
    reason: str
    spent: float


class Scaler:
    """Applies a scaling policy within each group's `Elastic` bounds and budget.

    `decide` is called with the current sizes; it accounts the node-seconds used since its last
    call, asks the policy, clips its answer and returns the targets that differ from the sizes.
    """

    def __init__(self, policy: ScalingPolicy, groups: Mapping[str, Elastic]):
        if not callable(policy):
            raise TypeError(f'A scaling policy is a function (metrics, now, sizes) -> {{group: '
                            f'size}}, got {policy!r}.')
        self.policy = policy
        self.groups = dict(groups)
        self.spent: Dict[str, float] = {label: 0.0 for label in self.groups}
        self.log: List[Decision] = []
        self._last: Optional[float] = None

    def decide(self, metrics: Metrics, now: float, sizes: Mapping[str, int]) -> Dict[str, int]:
        """Group -> new target size, for the groups whose size should change."""
        if self._last is not None:
            for label in self.groups:
                self.spent[label] += sizes.get(label, 0) * max(0.0, now - self._last)
        self._last = now
        wanted = self.policy(metrics, now, dict(sizes)) or {}
        changes = {}
        for label, elastic in self.groups.items():
            size = sizes.get(label, 0)
            want = wanted.get(label)
            out_of_budget = elastic.budget is not None and self.spent[label] >= elastic.budget
            if want is None and not (out_of_budget and size > elastic.min_size):
                continue
            want = size if want is None else int(want)
            target, reason = elastic.clip(want), ''
            if target != want:
                reason = f'within [{elastic.min_size}, {elastic.max_size}]'
            if out_of_budget and target > elastic.min_size:
                target, reason = elastic.min_size, (f'budget of {elastic.budget:g} node-s spent '
                                                    f'({self.spent[label]:.0f})')
            if target == size:
                continue
            decision = Decision(now, label, size, want, target, reason, self.spent[label])
            self.log.append(decision)
            logging.info('Scaling %s: %d -> %d nodes (the policy asked for %d%s; %.0f node-s '
                         'used).', label, size, target, want, f', {reason}' if reason else '',
                         self.spent[label])
            changes[label] = target
        unknown = sorted(set(wanted) - set(self.groups))
        if unknown:
            raise ValueError(f'The scaling policy returned sizes for {unknown}, which are not '
                             f'elastic groups ({sorted(self.groups)}); give them '
                             'program.group(label, elastic=lp.Elastic(...)).')
        return changes


def group_total(metrics: Metrics, label: Optional[str], name: str) -> Optional[float]:
    """The sum of metric `name` over the nodes of group `label` (None: of every group) that
    report it (None: none do)."""
    values = [values[name] for node, values in metrics.items()
              if (label is None or node.split('/', 1)[0] == label) and name in values]
    return sum(values) if values else None


class _UnreportedMetric:
    """Warns once when metric `name` (of group `label`; None: of any node) is still unreported
    `METRIC_GRACE` seconds after the launch: a policy on it changes nothing, which a typo in a
    metric's name would otherwise leave silent."""

    def __init__(self, policy: str, name: str, label: Optional[str] = None):
        self.policy, self.name, self.label = policy, name, label
        self._done = False  # warned, or the metric was seen

    def check(self, metrics: Metrics, now: float, value: Optional[float]) -> None:
        """The policy found `value` (None: nothing) for the metric in `metrics` at `now`."""
        if value is not None:
            self._done = True  # reported once: a node that stops reporting it is another matter
        if self._done or now < METRIC_GRACE:
            return
        self._done = True
        by_group: Dict[str, set] = {}
        for node, values in metrics.items():
            by_group.setdefault(node.split('/', 1)[0], set()).update(values)
        reported = '; '.join(f'{label}: {", ".join(sorted(names))}'
                             for label, names in sorted(by_group.items()) if names)
        whose = f'no node of group {self.label!r}' if self.label is not None else 'no node'
        logging.warning('%s changes nothing: %s has reported metric %r in the %g s since the '
                        'launch. %s. Report it with lp.report(%s=...) or lp.count(%s=...), or '
                        'give the policy the name of a metric that is reported.',
                        self.policy, whose, self.name, METRIC_GRACE,
                        f'The metrics reported are {reported}' if reported else
                        'No node has reported any metric', self.name, self.name)


class QueueLengthPolicy:
    """Sizes group `group` so that each node has about `per_node` items of a backlog that a node
    reports (`lp.report(**{metric: length})`, summed over the reporting nodes).

    target = ceil(backlog / per_node); nothing reported: no change.
    """

    def __init__(self, group: str, metric: str, per_node: float = 10.0):
        if not per_node > 0:
            raise ValueError(f'QueueLengthPolicy(per_node=...) must be > 0, got {per_node!r}.')
        self.group, self.metric, self.per_node = group, metric, per_node
        self._unreported = _UnreportedMetric(f'QueueLengthPolicy({group!r}, {metric!r})', metric)

    def __call__(self, metrics: Metrics, now: float, sizes: Mapping[str, int]) -> Dict[str, int]:
        del sizes
        backlog = group_total(metrics, None, self.metric)
        self._unreported.check(metrics, now, backlog)
        if backlog is None:
            return {}
        return {self.group: int(math.ceil(backlog / self.per_node))}


class ProgressPerActorPolicy:
    """MinionsRL's actor scaling, as a rule: grow the actors while the learner's progress per
    actor improves, shrink them when it does not.

    Every `round` seconds it measures the learner's progress (the growth of counter `metric`,
    summed over group `learner`, e.g. `lp.count(updates=1)` or the episodes it learned from) per
    second and per actor of group `actors`. If progress per actor improved on the last round by
    more than `tolerance` (relatively) it adds `step` actors (MinionsRL's scheduler launches more
    actors while more data pays off); otherwise it removes `step`, keeping at least one (more
    actors did not pay: save the node-seconds). The first measured round grows; nothing changes
    while the learner reports nothing.
    """

    def __init__(self, actors: str = 'actor', learner: str = 'learner',
                 metric: str = 'progress', *, round: float = 5.0, step: int = 1,
                 tolerance: float = 0.05):  # pylint: disable=redefined-builtin
        if not round > 0 or not isinstance(step, int) or step < 1:
            raise ValueError('ProgressPerActorPolicy takes round= seconds > 0 and step= an int '
                             f'>= 1; got round={round!r}, step={step!r}.')
        self.actors, self.learner, self.metric = actors, learner, metric
        self.round, self.step, self.tolerance = round, step, tolerance
        self._start: Optional[tuple] = None   # (time, progress, actors) at the round's start
        self._previous: Optional[float] = None  # progress per actor-second in the last round
        self._unreported = _UnreportedMetric(
            f'ProgressPerActorPolicy({actors!r}, {learner!r}, {metric!r})', metric, learner)

    def __call__(self, metrics: Metrics, now: float, sizes: Mapping[str, int]) -> Dict[str, int]:
        progress = group_total(metrics, self.learner, self.metric)
        actors = sizes.get(self.actors, 0)
        self._unreported.check(metrics, now, progress)
        if progress is None:
            return {}
        if self._start is None:
            self._start = (now, progress, actors)
            return {}
        start_time, start_progress, start_actors = self._start
        if now - start_time < self.round:
            return {}
        rate = (progress - start_progress) / (now - start_time) / max(1, start_actors)
        self._start = (now, progress, actors)
        previous, self._previous = self._previous, rate
        if previous is None:
            return {self.actors: actors + self.step}  # explore upwards first
        if rate > previous * (1 + self.tolerance):
            return {self.actors: actors + self.step}
        return {self.actors: max(1, actors - self.step)}
