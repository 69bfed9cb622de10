"""The coordinator: the one place that knows a launched program's state.

Nodes report to it (started, finished, failed), publish their endpoints to it and watch it for the
stop signal; the controller reads it. It has two faces (`faces`): nodes call the node face, the
controller, the runners and observers the control face. In threads nodes get a proxy with the node
face only; for processes and remote hosts the launcher serves the node face with courier
(`serve_coordinator`) and nodes call it through a client.
Stop and failure therefore travel one way on every platform: a node tells the coordinator, and every
node learns it from the coordinator.

A failure goes through the node's restart policy (`launchpad.policy`) here: the node is marked
restarting (the controller starts it again once its process is gone and its backoff passed),
dropped, or failed, which fails the program with every traceback the node left.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import logging
import traceback
import uuid
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from launchpad import runtime
from launchpad.policy import NodePolicy, RestartBudget
from launchpad.process import faces
from launchpad.process.errors import NodeFailedError, all_tracebacks
from launchpad.process.stop_order import StopOrder
from launchpad.process.supervision import MemberEvent, Supervision, settle_refusal
from launchpad.process.probe_broker import Probe, ProbeBroker
from launchpad.process.states import NodeState, NodeStatus
from launchpad.scaling import Elastic, check_size

# Seconds a node keeps running without reaching its coordinator before it decides that the
# launcher is gone and stops itself.
COORDINATOR_LOSS_TIMEOUT = 5.0
# Coordinator threads for nodes added to a running program (three each), beyond its first nodes'.
_ROOM_TO_GROW = 96


class _Incarnation:
    """The coordinator's private record of a node across its restarts."""

    def __init__(self, policy: NodePolicy):
        self.policy = policy
        self.budget = RestartBudget(policy.restart)
        self.failures: List[Tuple[str, str]] = []
        self.failed = False        # this instance failed (one failure counts per instance)
        self.exited = False        # this instance's process is gone
        self.restart_at = 0.0      # when a restarting node may start again (monotonic)
        self.instance: Optional[str] = None  # the id its running process reported
        self.running_since: Optional[float] = None  # when this instance started (monotonic)


class Coordinator:
    """Node states, published addresses and the stop signal of one launched program."""

    def __init__(self, node_names: Iterable[str], *,
                 policies: Optional[Mapping[str, NodePolicy]] = None,
                 groups: Optional[Mapping[str, Elastic]] = None,
                 stop_order: Optional[StopOrder] = None):
        """`groups` (`Program.group_limits()`): what each group may be resized to, so that a
        node's `lp.resize` beyond it fails in that node; None leaves the check to the
        controller, which logs a refused request. `stop_order`: who calls whom, so that a
        stop reaches callers before what they call (`stop_order`); None: every node at once."""
        # Entered as the lock itself, not as the condition: an exception raised in a node's
        # thread at a stop (`interrupt.raise_in`) can land inside Condition.__enter__, a Python
        # function, after it took the lock, and leave it held for ever; a lock's own (C)
        # __enter__ has no such point.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._nodes: Dict[str, NodeStatus] = {name: NodeStatus(name) for name in node_names}
        self._incarnations = {name: _Incarnation((policies or {}).get(name) or NodePolicy())
                              for name in self._nodes}
        self._addresses: Dict[str, str] = {}
        self._node_addresses: Dict[str, List[str]] = {}  # node -> its address ids (group members)
        self._removing: Dict[str, float] = {}  # node -> when its removal was asked (monotonic)
        self._size_requests: Dict[str, int] = {}  # group -> the size a node asked for
        self._groups = dict(groups) if groups is not None else None
        self._stop_reason: Optional[str] = None
        self._stop_time: Optional[float] = None
        self._failure: Optional[NodeFailedError] = None
        self._metrics: Dict[str, dict] = {}
        self._stop_order = stop_order
        self._supervision = Supervision()
        self._told_cache: Tuple[Optional[tuple], frozenset] = (None, frozenset())
        self._probes = ProbeBroker()
        self._unheard: Set[str] = set()  # pending at a restore: whether they run is unknown

    def __getstate__(self) -> dict:
        """Everything the coordinator knows, for a detached program's supervisor to persist
        and a new supervisor to re-adopt the running nodes from (not kept: its lock, and the
        questions to nodes in flight, which their askers time out on)."""
        with self._lock:
            state = dict(self.__dict__)
            del state['_lock'], state['_changed'], state['_probes']
            return state

    def __setstate__(self, state: dict) -> None:
        """A new supervisor's copy may predate a node's report that it runs: a pending node stays
        unheard until it reports again (each running node does) or ends (`_members`)."""
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._probes = ProbeBroker()
        self._unheard = {name for name, s in self._nodes.items() if s.state is NodeState.PENDING}

    # Called by nodes.

    def node_started(self, name: str, pid: int, host: str, instance: Optional[str] = None) -> int:
        """Records that the node runs; returns its attempt (0 at first, then its restarts).

        `instance` (a random id of the node's process) tells a node started again, by another
        hand than this coordinator's controller (a Kubernetes pod coordinator's launcher), after
        its last run ended unnoticed.
        """
        with self._lock:
            status = self._status(name)
            incarnation = self._incarnations[name]
            if status.state is NodeState.RESTARTING or (
                    status.state is NodeState.RUNNING and instance is not None
                    and incarnation.instance not in (None, instance)):
                self._restarted(name)  # started again by someone else's hand
            incarnation.instance = instance or incarnation.instance
            if status.state is NodeState.PENDING:
                status.state = NodeState.RUNNING
            status.pid, status.host = pid, host
            status.started_at = status.started_at or time.time()
            incarnation.running_since = incarnation.running_since or time.monotonic()
            self._notify()
            return status.restarts

    def node_finished(self, name: str) -> None:
        with self._lock:
            status = self._status(name)
            if not status.state.ended and not self._incarnations[name].failed:
                status.state = (NodeState.REMOVED if name in self._removing
                                else NodeState.FINISHED)
            self._notify()

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        """Records a failure of `name`, which its restart policy turns into a restart, a drop or
        the program's failure (the first such failure stops the program and is what `wait`
        raises)."""
        with self._lock:
            self._fail(name, message, traceback_text)

    def request_stop(self, reason: str = 'stop requested') -> None:
        with self._lock:
            self._set_stopping(reason)

    def wait_for_stop(self, timeout: Optional[float] = None, name: Optional[str] = None) -> bool:
        """Blocks until the program is stopping or `timeout` passes; True if it is. With the
        `name` of an executable: until it is told to stop (its callers ended first, see
        `stop_order`) or it is being removed from the program."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not (name in self._removing or self._told(name)):
                now = time.monotonic()
                wait = None if deadline is None else deadline - now
                if self._stop_time is not None and self._stop_order is not None:
                    fallback = self._stop_time + self._stop_order.fallback - now
                    wait = fallback if wait is None else min(wait, fallback)
                if deadline is not None and now >= deadline:
                    return False
                self._changed.wait(None if wait is None else max(wait, 0.001))
            return True

    def told_to_stop(self) -> List[str]:
        """The executables told to stop so far (every one once the program stops, unless a
        `stop_order` holds some back until their callers have ended)."""
        with self._lock:
            return [name for name in self._nodes if self._told(name)]

    def publish_address(self, address_id: str, endpoint: str) -> None:
        with self._lock:
            self._addresses[address_id] = endpoint
            self._notify()

    def report_metrics(self, name: str, snapshot: dict) -> None:
        """Keeps the latest metrics executable `name` reported (`launchpad.metrics`)."""
        with self._lock:
            self._metrics[name] = snapshot

    def wait_for_probe(self, name: str, sample: Optional[dict] = None,
                       timeout: float = 1.0) -> List[Probe]:
        """Node process `name`'s probe thread: its stack sample in, questions out
        (`probe_broker`)."""
        return self._probes.wait_for_probe(name, sample, timeout)

    def answer_probe(self, name: str, probe_ids: List[int], answer: dict) -> None:
        self._probes.answer_probe(name, probe_ids, answer)

    def close_probes(self) -> None:
        """Ends the probe threads' waits in flight, once no node runs (`ProbeBroker.close`)."""
        self._probes.close()

    def lookup_address(self, address_id: str, timeout: Optional[float] = None) -> Optional[str]:
        """The endpoint published for `address_id`, waiting up to `timeout`; None if none came."""
        with self._lock:
            self._changed.wait_for(lambda: address_id in self._addresses, timeout)
            return self._addresses.get(address_id)

    # Elastic groups: nodes join and leave while the program runs.

    def add_nodes(self, names: Iterable[str], *,
                  policies: Optional[Mapping[str, NodePolicy]] = None,
                  calls: Optional[Tuple[Mapping[str, Iterable[str]],
                                        Mapping[str, Iterable[str]]]] = None) -> None:
        """Adds executables to the running program (pending until they report their start);
        `calls`: (executable -> executables it calls, executable -> groups it calls), for the
        stop order (`Program.calls`)."""
        with self._lock:
            if self._stop_reason is not None:
                raise RuntimeError(f'The program is stopping ({self._stop_reason}): no node can '
                                   'be added to it any more.')
            for name in names:
                if name in self._nodes:
                    raise KeyError(f'{name!r} is already a node of this program.')
                self._nodes[name] = NodeStatus(name)
                self._incarnations[name] = _Incarnation((policies or {}).get(name) or NodePolicy())
            if calls is not None and self._stop_order is not None:
                self._stop_order.add(*calls)
            self._notify()

    def set_node_addresses(self, addresses: Mapping[str, List[str]]) -> None:
        """Node name -> the ids of the addresses it serves, for clients of its group."""
        with self._lock:
            self._node_addresses.update({name: list(ids) for name, ids in addresses.items()})
            self._notify()

    def set_node_resources(self, name: str, devices: str, cores: str) -> None:
        """The GPUs and cores the launcher gave node `name` (`NodeResources.describe`)."""
        with self._lock:
            status = self._status(name)
            status.devices, status.cores = devices, cores

    def remove_node(self, name: str) -> None:
        """Gives node `name` the stop: its stop handlers run, and it gets the notice period."""
        with self._lock:
            status = self._status(name)
            if name not in self._removing:
                self._removing[name] = time.monotonic()
            if status.state is NodeState.RESTARTING:
                status.state = NodeState.REMOVED
            self._notify()

    def removals(self) -> Dict[str, float]:
        """Nodes being removed that have not ended yet -> when their removal was asked."""
        with self._lock:
            return {name: at for name, at in self._removing.items()
                    if not self._nodes[name].state.ended}

    def has_left(self, name: str) -> bool:
        """Whether node `name` was removed from the program."""
        with self._lock:
            return name in self._removing

    def members(self, label: str) -> List[Tuple[str, List[str]]]:
        """The live members of group `label`: (name, address ids) of each node that runs, was
        not removed and whose addresses are known, in the order they were added."""
        with self._lock:
            return self._members(label)

    def wait_for_members(self, label: str, known: Optional[List] = None,
                         timeout: Optional[float] = None) -> List[Tuple[str, List[str]]]:
        """`members(label)` once it differs from `known` (or `timeout` passes, or the program
        stops): the cheap way to hear of members that join or leave (and keep those of `known`
        that a restored coordinator has not heard from yet, `__setstate__`)."""
        known = [(name, list(ids)) for name, ids in known] if known is not None else None
        with self._lock:
            self._changed.wait_for(lambda: self._members(label, known) != known
                                   or self._stop_reason is not None, timeout)
            return self._members(label, known)

    # Supervision (`supervision`): why members left, and owners that take over failures.

    def member_events(self, label: str, since: int = 0,
                      timeout: Optional[float] = None) -> List[MemberEvent]:
        """The departures from group `label` from the `since`-th on, waiting up to `timeout`
        for one."""
        with self._lock:
            self._changed.wait_for(lambda: self._supervision.events(label, since), timeout)
            return self._supervision.events(label, since)

    def supervise(self, label: str, owner: str) -> None:
        """Node `owner` takes over the failures of group `label`'s members."""
        with self._lock:
            self._status(owner)
            self._supervision.supervise(label, owner)

    def settle_failure(self, name: str, action: str) -> None:
        """The owner of member `name` decides on its failure: 'replace' starts it again, 'fail'
        fails the program with it."""
        with self._lock:
            state = self._status(name).state.value
            refusal = settle_refusal(name, state, action, self._stop_reason)
            if refusal:
                raise ValueError(refusal)
            if action == 'fail':
                self._fail_program(name, self._nodes[name].error)
                return
            self._nodes[name].state = NodeState.RESTARTING
            self._incarnations[name].restart_at = time.monotonic()
            self._notify()

    def request_size(self, label: str, size: int) -> None:
        """Asks for group `label` to have `size` nodes (a node's `lp.resize`); the controller
        grows or shrinks it. Raises, saying why, if the group cannot have that size (an unknown
        group, outside its `lp.Elastic` bounds, or growing without a node factory)."""
        with self._lock:
            check_size(label, size, self._groups, len(self._group_nodes(label)))
            self._size_requests[label] = size
            self._notify()

    def group_nodes(self, label: str) -> List[str]:
        """The nodes of group `label` that run or are starting (not ended, not leaving), by
        index: the group's size as resizing counts it."""
        with self._lock:
            return self._group_nodes(label)

    def take_size_requests(self) -> Dict[str, int]:
        """The group sizes asked for since the last call."""
        with self._lock:
            requests, self._size_requests = self._size_requests, {}
            return requests

    def _group_nodes(self, label: str) -> List[str]:
        prefix = label + '/'
        names = [name for name, status in self._nodes.items()
                 if name.startswith(prefix) and '+' not in name and not status.state.ended
                 and name not in self._removing]
        return sorted(names, key=lambda name: runtime.label_and_index(name)[1])

    def _members(self, label: str, known: Optional[List] = None) -> List[Tuple[str, List[str]]]:
        """`members(label)`, with those of `known` unheard since a restore (`__setstate__`)."""
        unheard = {name: ids for name, ids in known or () if name in self._unheard}  # (seen)
        return [(name, self._node_addresses.get(name, unheard.get(name)))
                for name, status in self._nodes.items()
                if name.startswith(label + '/') and '+' not in name and name not in self._removing
                and (status.state is NodeState.RUNNING and name in self._node_addresses
                     or status.state is NodeState.PENDING and name in unheard)]

    # Called by the launcher and the controller.

    def executable_exited(self, name: str, exit_code: int,
                          last_output: Callable[[], str] = lambda: '') -> None:
        """Records that the executable's process is gone, reporting a failure if it never did
        (with `last_output()`, the last lines it printed, which say why; read only then, as
        the controller tells this at every poll)."""
        with self._lock:
            status = self._status(name)
            status.exit_code = exit_code
            incarnation = self._incarnations[name]
            if incarnation.exited:
                return  # told before
            incarnation.exited = True
            if status.state.ended or status.state is NodeState.RESTARTING:
                pass  # it reported how it ended
            elif name in self._removing:
                status.state = NodeState.REMOVED
            elif self._stop_reason is not None and exit_code != 0:
                status.state = NodeState.KILLED
            elif exit_code == 0:
                status.state = NodeState.FINISHED
            else:
                description = (f'killed by signal {-exit_code}' if exit_code < 0
                               else f'exit code {exit_code}')
                output = last_output()
                if output.strip():
                    self._fail(name, f'its process ended ({description}) without reporting an '
                                     'error; the last lines of its output:\n' + output.rstrip())
                else:
                    self._fail(name, f'its process ended ({description}) without reporting an '
                                     'error; see its output above or in its log.')
            self._notify()

    def due_restarts(self, now: float) -> List[str]:
        """The restarting nodes whose process is gone and whose backoff is over at `now`."""
        with self._lock:
            return [name for name, status in self._nodes.items()
                    if status.state is NodeState.RESTARTING and self._incarnations[name].exited
                    and self._incarnations[name].restart_at <= now]

    @property
    def restarts_pending(self) -> bool:
        """Whether a node waits to be started again."""
        with self._lock:
            return any(s.state is NodeState.RESTARTING for s in self._nodes.values())

    def node_restarted(self, name: str) -> None:
        """Records that the controller started the node again (it is pending until it runs)."""
        with self._lock:
            if self._status(name).state is NodeState.RESTARTING:
                self._restarted(name)
            self._notify()

    def requeued(self, names: Iterable[str], reason: str) -> None:
        """The platform ended nodes `names` and starts them again (a Slurm job's requeue): each
        one not ended is pending again, its attempt one more, with `reason` as its error; its
        restart policy is not charged."""
        with self._lock:
            if self._stop_reason is not None:
                return
            for name in names:
                status = self._status(name)
                if not status.state.ended:
                    self._restarted(name)
                    status.error, status.pid = reason, None
            self._changed.notify_all()

    def restart_failed(self, name: str, reason: str) -> None:
        """The node could not be started again: its last failure is final."""
        with self._lock:
            status = self._status(name)
            if status.state is not NodeState.RESTARTING:
                return
            incarnation = self._incarnations[name]
            incarnation.budget = RestartBudget(None)
            message, text = incarnation.failures.pop() if incarnation.failures else (reason, '')
            incarnation.failed = False
            self._fail(name, f'{message} (and it could not be restarted: {reason})', text)

    def mark_killed(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                status = self._status(name)
                if not status.state.ended:
                    status.state = NodeState.KILLED
            self._notify()

    def status(self) -> Dict[str, NodeStatus]:
        with self._lock:
            return {name: dataclasses.replace(status) for name, status in self._nodes.items()}

    def metrics(self) -> Dict[str, dict]:
        """Executable name -> the metrics it reported last."""
        with self._lock:
            return dict(self._metrics)

    def failures(self) -> Dict[str, List[Tuple[str, str]]]:
        """Executable name -> (message, traceback) of each of its failures, oldest first (the
        observer keeps them in the run directory)."""
        with self._lock:
            return {name: list(incarnation.failures)
                    for name, incarnation in self._incarnations.items() if incarnation.failures}
    def probe(self, names: Iterable[str], kinds: Iterable[str], timeout: float) -> Dict[str, dict]:
        """Asks node processes live for their stacks, calls or numbers (`probe_broker`)."""
        return self._probes.probe(names, kinds, timeout)

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> Optional[str]:
        return self._stop_reason

    @property
    def stop_time(self) -> Optional[float]:
        return self._stop_time

    @property
    def failure(self) -> Optional[NodeFailedError]:
        return self._failure

    def wait_for_change(self, timeout: float) -> None:
        with self._lock:
            self._changed.wait(timeout)

    def notify_change(self) -> None:
        with self._lock:
            self._changed.notify_all()

    def running(self, names: Optional[Iterable[str]] = None) -> List[str]:
        with self._lock:
            selected = self._nodes if names is None else {n: self._nodes[n] for n in names}
            return [name for name, status in selected.items() if not status.state.ended]

    def _told(self, name: Optional[str]) -> bool:
        """Whether the program stops and executable `name` (None: any) has been told so."""
        if self._stop_time is None:
            return False
        if name is None or self._stop_order is None or name not in self._nodes:
            return True
        ended = frozenset(n for n, status in self._nodes.items() if status.state.ended)
        key = (ended, time.monotonic() - self._stop_time >= self._stop_order.fallback)
        if self._told_cache[0] != key:
            told = self._stop_order.told(self._nodes, lambda n: n in ended,
                                         time.monotonic() - self._stop_time)
            self._told_cache = (key, frozenset(told))
        return name in self._told_cache[1]

    def _notify(self) -> None:
        """Logs the members that left (`supervision`) and wakes whoever waits for a change."""
        self._supervision.observe(self._nodes, lambda name: (
            self._incarnations[name].failures or [(self._nodes[name].error, '')])[-1])
        self._changed.notify_all()

    def _status(self, name: str) -> NodeStatus:
        status = self._nodes.get(name)
        if status is None:
            raise KeyError(f'{name!r} is not a node of this program.')
        return status

    def _fail(self, name: str, message: str, traceback_text: str = '') -> None:
        status = self._status(name)
        incarnation = self._incarnations[name]
        if incarnation.failed:
            return  # an instance fails once (reported by itself, then seen by its runner)
        incarnation.failed = True
        incarnation.failures.append((message, traceback_text))
        status.error = message
        if name in self._removing:  # it was leaving anyway: no restart, no failed program
            status.state = NodeState.REMOVED
            self._notify()
            return
        if self._stop_reason is not None:
            status.state = NodeState.FAILED
            self._notify()
            return
        now = time.monotonic()
        ran = None if incarnation.running_since is None else now - incarnation.running_since
        delay = incarnation.budget.next_delay(now, ran)
        policy = incarnation.policy.restart
        if delay is not None:
            status.state = NodeState.RESTARTING
            incarnation.restart_at = now + delay
            logging.warning('Node %s failed (%s); restarting it in %g s (restart %d; its policy '
                            'allows %s).', name, message, delay, status.restarts + 1,
                            policy.describe())
            self._notify()
            return
        if policy is not None and incarnation.failures[:-1]:
            restarts = f'{status.restarts} time{"s" * (status.restarts != 1)}'
            message = (f'{message} (failed {len(incarnation.failures)} times: restarted '
                       f'{restarts}, its policy allows {policy.describe()})')
        if policy is not None and policy.on_failure == 'drop':
            status.state = NodeState.DROPPED
            logging.warning('Node %s failed for good and is dropped; the program goes on without '
                            'it: %s', name, message)
            self._notify()
            return
        status.state = NodeState.FAILED
        owner = self._supervision.owner(name, lambda n: not self._nodes[n].state.ended)
        if owner is not None:
            logging.warning('Node %s failed; %s supervises it and decides: %s', name, owner,
                            message)
            self._notify()
            return
        self._fail_program(name, message)

    def _fail_program(self, name: str, message: str) -> None:
        failures = self._incarnations[name].failures
        if self._failure is None:
            self._failure = NodeFailedError(name, message, all_tracebacks(failures),
                                            tuple(failures))
        self._set_stopping(f'node {name} failed')

    def _restarted(self, name: str) -> None:
        status = self._nodes[name]
        incarnation = self._incarnations[name]
        status.state = NodeState.PENDING
        self._unheard.discard(name)  # (its next start is not the one a client may have seen)
        status.restarts += 1
        status.exit_code = None
        status.started_at = None  # its uptime counts from its new start
        incarnation.failed, incarnation.exited, incarnation.running_since = False, False, None

    def _set_stopping(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stop_time = time.monotonic()
            # No restart once the program stops. A node waiting for one failed within its
            # policy: the stop, not its failure, ends it (its error still says why it failed).
            for status in self._nodes.values():
                if status.state is NodeState.RESTARTING:
                    status.state = NodeState.KILLED
        self._notify()


def serve_coordinator(coordinator: Coordinator, address: str, *, auth_token: Optional[str] = None,
                      tls=None, face: type = faces.NodeFace):
    """Serves the node face of `coordinator` (`face`: `faces.NodeFace`, or a Protocol extending
    it) with courier on `address` and returns the started courier.Server; its control face is
    refused there (`faces.serve`). Every node keeps a call to `wait_for_stop` and one to
    `wait_for_probe` open, so the server gets three threads per node, some to spare, and room
    for nodes added later (threads start when needed). `auth_token` None reads
    COURIER_AUTH_TOKEN, as courier does."""
    import courier  # pylint: disable=import-outside-toplevel
    server = courier.Server(address=address, auth_token=auth_token, tls=tls,
                            thread_pool_size=3 * len(coordinator.status()) + 8 + _ROOM_TO_GROW)
    faces.serve(coordinator, server, face)
    server.Start()
    return server


def run_reporting(run: Callable[[], None], name: str, coordinator, *, starting=None,
                  context=None, instance: Optional[str] = None) -> int:
    """Runs an executable, reporting to the coordinator how it ended; returns an exit code.

    `starting` (default: `coordinator`) reports the start; a worker passes a client that waits for
    a busy coordinator there, and reports the end through one that fails at once when it is gone.
    `context` (the node's `runtime.NodeContext`) learns its attempt number from the start; an
    error raised while the program stops because a node it called has gone (a ConnectionError)
    is the node ending with the program, not a failure. `instance` (default: a new one) is the
    random id of this run of the node."""
    attempt = (starting or coordinator).node_started(name, os.getpid(), socket.gethostname(),
                                                     instance or uuid.uuid4().hex)
    if context is not None:
        context.attempt = attempt or 0
    try:
        run()
    except SystemExit as e:
        if e.code not in (None, 0):
            coordinator.node_failed(name, f'SystemExit({e.code!r})', traceback.format_exc())
            return 1
    except BaseException as e:  # pylint: disable=broad-except
        if ended_by_stop(e, context):
            logging.info('%s ended with the program: %s: %s', name, type(e).__name__, e)
            coordinator.node_finished(name)
            return 0
        traceback.print_exc()
        coordinator.node_failed(name, f'{type(e).__name__}: {e}', traceback.format_exc())
        return 1
    coordinator.node_finished(name)
    return 0


class NodeStopped(BaseException):
    """Raised inside a node's thread to end it at once on a stop (threads cannot be killed); a
    BaseException, so that the node's own `except Exception` blocks let it through."""


def ended_by_stop(error: BaseException, context) -> bool:
    """Whether `error`, raised in the node of `context`, is the node ending with the program's
    stop (a call to a node that had gone while the program stops) rather than a failure."""
    if isinstance(error, NodeStopped):
        return True
    if not isinstance(error, ConnectionError) or context is None or context.stop is None:
        return False
    if context.stop.event.is_set():
        return True
    try:  # the node may not have heard of the stop yet; a node it called already had
        return bool(context.coordinator.wait_for_stop(0.0))
    except Exception:  # pylint: disable=broad-except
        return False
