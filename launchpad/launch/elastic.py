"""Nodes that join and leave a running program: the controller's side of elastic groups.

`Elasticity` belongs to a `Controller`. Everything that changes the set of executables runs on
the controller's monitor thread (the one thread that polls the runner): `add_node`, `remove_node`
and `resize` called from elsewhere (the launching script, a scaling policy's decision, a node's
`lp.resize` through the coordinator) are queued and the caller waits for the outcome.

* Adding a node: the program names it (`group/next index`), its node type turns it into an
  executable, the coordinator learns it, and the runner starts it with
  `runner.add_executable(label, executable, policy)`, the platform's one way of starting a node
  (local_mp and SSH fork it from their pre-started interpreters, Slurm runs a new job step in
  the allocation, or beyond it in an additional job). Its addresses are registered with the
  coordinator, where the nodes started before it find them (`AddressTable` looks up addresses
  it does not know there).
* Removing a node: the coordinator tells it (its worker watches `wait_for_stop(name)`; a thread
  runner's `remove(name)`), its stop handlers run, and it gets the notice period before it is
  killed. It ends as `removed`; a call to it fails with `NodeLeftError` instead of waiting.
* A scaling policy (`program.set_scaling_policy`) is asked every `interval` seconds.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from launchpad.nodes.base import Handle, LaunchInfo, Node
from launchpad import metrics, runtime
from launchpad.launch.runner import Runner
from launchpad.process.states import NodeState
from launchpad.process.faces import ControlFace
from launchpad.scaling import Decision, Scaler, check_size


class Elasticity:
    """Adds and removes nodes of a running program (see the module docstring)."""

    def __init__(self, coordinator: ControlFace, runner: Runner, launch_type: str,
                 notice_period: float):
        self._coordinator = coordinator
        self._runner = runner
        self._launch_type = launch_type
        self._notice_period = notice_period
        self._program = None
        self._resources: Dict[str, Any] = {}
        self._requests: 'queue.Queue' = queue.Queue()
        self._monitor: Optional[threading.Thread] = None
        self._closed: Optional[str] = None
        self._told_removed: set = set()
        self._killed: set = set()
        self._scaler: Optional[Scaler] = None
        self._interval = 1.0
        self._next_scaling = 0.0
        self._started = time.monotonic()
        self._added_at: Dict[str, float] = {}
        self.scale_up_times: List[float] = []  # seconds from a request to the new node running

    def attach(self, program, resources: Dict[str, Any]) -> None:
        """The launched program: its groups, their resources, its scaling policy; registers the
        addresses of its nodes for the clients of their groups."""
        self._program = program
        self._resources = dict(resources)
        self._coordinator.set_node_addresses({
            node.name: [address.id for address in node.addresses]
            for node in program.get_all_nodes()})
        if program.scaling is not None:
            policy, interval = program.scaling
            self._scaler = Scaler(policy, program.elastic_groups)
            self._interval = interval
            self._next_scaling = time.monotonic() + interval

    @property
    def scaling_log(self) -> List[Decision]:
        return list(self._scaler.log) if self._scaler is not None else []

    # Called from any thread.

    def add_node(self, node: Node, label: Optional[str] = None) -> Handle:
        return self._call(lambda: self._add(node, label))

    def remove_node(self, name: str) -> None:
        self._call(lambda: self._remove(name))

    def resize(self, label: str, size: int) -> None:
        self._call(lambda: self._resize(label, size))

    def size(self, label: str) -> int:
        """How many nodes of group `label` run or are starting (not ended, not leaving)."""
        return len(self._members(label))

    def _call(self, request: Callable[[], Any]) -> Any:
        if self._program is None:
            raise RuntimeError('This controller\'s program was not launched by lp.launch, so it '
                               'cannot add or remove nodes.')
        if threading.current_thread() is self._monitor:
            return request()
        done = threading.Event()
        outcome: list = []
        self._requests.put((request, done, outcome))
        if self._closed is not None:
            self._fail_requests()
        done.wait()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    # Called by the controller's monitor thread.

    def tick(self) -> None:
        """Serves queued requests, node's size requests and the scaling policy, and gives the
        stop to nodes being removed (killing those past the notice period)."""
        self._monitor = threading.current_thread()
        while True:
            try:
                request, done, outcome = self._requests.get_nowait()
            except queue.Empty:
                break
            try:
                outcome.append(request())
            except BaseException as e:  # pylint: disable=broad-except
                outcome.append(e)
            done.set()
        if self._program is None or self._coordinator.stopping:
            return
        for label, size in self._coordinator.take_size_requests().items():
            try:
                self._resize(label, size)
            except Exception:  # pylint: disable=broad-except
                logging.exception('A node asked for group %s to have %d nodes, which failed.',
                                  label, size)
        self._scale()
        self._watch_removals()
        self._watch_added()

    def close(self, reason: str) -> None:
        """The program ended: requests from now on fail with `reason`."""
        self._closed = reason
        self._fail_requests()

    def _fail_requests(self) -> None:
        while True:
            try:
                _, done, outcome = self._requests.get_nowait()
            except queue.Empty:
                return
            outcome.append(RuntimeError(f'The program has ended ({self._closed}): nodes can no '
                                        'longer be added or removed.'))
            done.set()

    def _add(self, node: Node, label: Optional[str]) -> Handle:
        if self._coordinator.stopping:
            raise RuntimeError(f'The program is stopping ({self._coordinator.stop_reason}): no '
                               'node can be added to it any more.')
        try:
            if label is not None:  # else add_running_node says that a label is needed
                self._runner.check_add(label)
        except NotImplementedError as e:
            raise NotImplementedError(f'The {self._launch_type} launcher cannot add nodes to a '
                                      f'running program ({e}).') from None
        handle = self._program.add_running_node(node, label)
        label = runtime.group_of(node.name)
        info = LaunchInfo(self._launch_type, self._resources.get(label))
        executables = node.to_executables([node], label, info)
        names = [executable.name for executable in executables]
        policies = {name: self._program.policy_of(name.split('+', 1)[0]) for name in names}
        calls, group_calls = self._program.calls([*self._coordinator.status(), *names])
        self._coordinator.add_nodes(names, policies=policies, calls=(
            {name: calls.get(name, ()) for name in names},
            {name: group_calls.get(name, ()) for name in names}))
        self._coordinator.set_node_addresses({node.name: [a.id for a in node.addresses]})
        for executable in executables:
            self._added_at[executable.name] = time.monotonic()
            try:
                self._runner.add_executable(label, executable, policies[executable.name])
            except BaseException as e:
                self._coordinator.node_failed(executable.name, f'it could not be started: '
                                              f'{type(e).__name__}: {e}')
                self._coordinator.executable_exited(executable.name, 1)
                raise
        logging.info('Added %s to the running program.', ', '.join(names))
        return handle

    def _remove(self, name: str) -> None:
        status = self._coordinator.status().get(name)
        if status is None:
            raise KeyError(f'{name!r} is not a node of this program; its nodes are '
                           f'{sorted(self._coordinator.status())}.')
        if '+' in name:
            raise ValueError(f'{name} runs several nodes in one executable; remove none of them '
                             'or all (elastic groups hold plain nodes).')
        self._coordinator.remove_node(name)
        self._watch_removals()

    def _resize(self, label: str, size: int) -> None:
        groups = self._program.group_limits()
        members = self._members(label)
        check_size(label, size, groups, len(members))
        if size < len(members):
            for name in members[size:][::-1]:  # the newest leave first
                self._remove(name)
            return
        for _ in range(size - len(members)):
            self._add(groups[label].make_node(), label)

    def _members(self, label: str) -> List[str]:
        return self._coordinator.group_nodes(label)

    def _scale(self) -> None:
        if self._scaler is None or time.monotonic() < self._next_scaling:
            return
        self._next_scaling = time.monotonic() + self._interval
        sizes = {label: len(self._members(label)) for label in self._scaler.groups}
        try:
            targets = self._scaler.decide(gather_metrics(self._coordinator, self._program.name),
                                          time.monotonic() - self._started, sizes)
        except Exception:  # pylint: disable=broad-except
            logging.exception('The scaling policy failed; the groups keep their sizes.')
            return
        for label, target in targets.items():
            try:
                self._resize(label, target)
            except Exception:  # pylint: disable=broad-except
                logging.exception('Could not resize group %s to %d nodes.', label, target)

    def _watch_removals(self) -> None:
        now = time.monotonic()
        for name, asked in self._coordinator.removals().items():
            if name not in self._told_removed:
                self._told_removed.add(name)
                self._runner.remove(name)
            if now - asked > self._notice_period and name not in self._killed:
                self._killed.add(name)
                logging.warning('Killing %s: still running %g s after its removal.', name,
                                self._notice_period)
                self._runner.kill([name])

    def _watch_added(self) -> None:
        if not self._added_at:
            return
        for name, status in self._coordinator.status().items():
            asked = self._added_at.get(name)
            if asked is not None and status.state is not NodeState.PENDING:
                del self._added_at[name]
                if status.state is NodeState.RUNNING:
                    self.scale_up_times.append(time.monotonic() - asked)


def gather_metrics(coordinator: ControlFace, program_name: str) -> Dict[str, Dict[str, float]]:
    """Node name -> {metric: latest value}, from what nodes reported (`lp.report`, `lp.count`):
    node processes send theirs to the coordinator; nodes that are threads of this process
    record them here."""
    found: Dict[str, Dict[str, float]] = {}
    snapshots = [*coordinator.metrics().values(), metrics.snapshot(program_name)]
    for snapshot in snapshots:
        for owner, values in (snapshot or {}).get('values', {}).items():
            node = owner[1] if isinstance(owner, (tuple, list)) else str(owner)
            found.setdefault(node, {}).update(
                {name: entry[1] for name, entry in values.items()})
    return found
