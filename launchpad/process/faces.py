"""The coordinator's two faces: what nodes may call, and what the controller and observers call.

The coordinator (`coordinator.Coordinator`) is one object with two kinds of callers:

    node processes and threads ──(NodeFace: reports, progress, addresses, membership, resizes,
                                  supervision)─────────────────────────────────────────────────┐
                                                                                               ▼
    controller, runners, observers ──(ControlFace: states, restarts, joins and leaves, stop)──► coordinator

Nodes reach it through a courier server that binds only the node face (`serve`): a node that calls
a controller-only method gets a `PermissionError` naming the faces. Threads of the launching
process get a `NodeFaceProxy` of it, which has the node face and nothing else. The coordinator's
proxies (a worker's client that remembers its own failure, a thread runner's reports, a process
colocation's relay) subclass `NodeFaceProxy` and change what they need.
"""
from __future__ import annotations

from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, Mapping,
                    Optional, Protocol, Tuple)

if TYPE_CHECKING:
    from launchpad.policy import NodePolicy
    from launchpad.process.errors import NodeFailedError
    from launchpad.process.states import NodeStatus
    from launchpad.process.supervision import MemberEvent

Members = List[Tuple[str, List[str]]]  # (node name, the ids of the addresses it serves)


class NodeFace(Protocol):
    """What a node calls: its own reports and progress, addresses, its group's members, and
    requests that the program stops or that a group changes size."""

    def node_started(self, name: str, pid: int, host: str,
                     instance: Optional[str] = None) -> Optional[int]:
        """Node `name` runs (in process `pid` on `host`; `instance` is a random id of that
        process); returns its attempt: 0 at first, then how many times it was restarted."""

    def node_finished(self, name: str) -> None:
        """Node `name` ended well."""

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        """Node `name` failed with `message` (its restart policy decides what follows)."""

    def request_stop(self, reason: str = 'stop requested') -> None:
        """Stops the program (`lp.stop()`)."""

    def wait_for_stop(self, timeout: Optional[float] = None, name: Optional[str] = None) -> bool:
        """True once the program stops, or node `name` is removed; False after `timeout`."""

    def publish_address(self, address_id: str, endpoint: str) -> None:
        """A node serves address `address_id` at `endpoint`."""

    def lookup_address(self, address_id: str, timeout: Optional[float] = None) -> Optional[str]:
        """The endpoint published for `address_id`, waiting up to `timeout`; None if none."""

    def report_metrics(self, name: str, snapshot: dict) -> None:
        """The latest metrics of node process `name` (`lp.report`, `lp.count`, call counts)."""

    def members(self, label: str) -> Members:
        """The live members of group `label`, oldest first."""

    def wait_for_members(self, label: str, known: Optional[Members] = None,
                         timeout: Optional[float] = None) -> Members:
        """`members(label)` once it differs from `known`, or after `timeout`."""

    def has_left(self, name: str) -> bool:
        """Whether node `name` was removed from the program."""

    def request_size(self, label: str, size: int) -> None:
        """Asks that group `label` has `size` nodes (`lp.resize`)."""

    def member_events(self, label: str, since: int = 0,
                      timeout: Optional[float] = None) -> List['MemberEvent']:
        """Why members left group `label`, from the `since`-th departure on (waits up to
        `timeout` for one)."""

    def supervise(self, label: str, owner: str) -> None:
        """Node `owner` takes over the failures of group `label`'s members."""

    def settle_failure(self, name: str, action: str) -> None:
        """The owner of failed member `name` replaces it ('replace') or fails the program."""
    def wait_for_probe(self, name: str, sample: Optional[dict] = None,
                       timeout: float = 1.0) -> List[Tuple[int, List[str]]]:
        """Node process `name` hands over its latest stack sample and waits up to `timeout` for
        questions about itself: [(probe id, kinds asked)] (`launchpad.process.probe_broker`)."""

    def answer_probe(self, name: str, probe_ids: List[int], answer: dict) -> None:
        """Node process `name` answers the probes it fetched."""


class ControlFace(Protocol):
    """What the controller, the platform runners and the observers call: the program's state,
    restarts, nodes joining and leaving, and the stop. Never served to nodes."""

    def status(self) -> Dict[str, 'NodeStatus']:
        """Node name -> a copy of its status."""

    def metrics(self) -> Dict[str, dict]:
        """Node process name -> the metrics it reported last."""

    def failures(self) -> Dict[str, List[Tuple[str, str]]]:
        """Node name -> (message, traceback) of each of its failures, oldest first."""

    def running(self, names: Optional[Iterable[str]] = None) -> List[str]:
        """The nodes (of `names`, default all) that have not ended."""

    @property
    def stopping(self) -> bool:
        """Whether the program is stopping."""

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the program stops, or None."""

    @property
    def stop_time(self) -> Optional[float]:
        """When the program started stopping (monotonic), or None."""

    @property
    def failure(self) -> Optional['NodeFailedError']:
        """The failure that stopped the program, or None."""

    @property
    def restarts_pending(self) -> bool:
        """Whether a node waits to be started again."""

    def request_stop(self, reason: str = 'stop requested') -> None:
        """Stops the program."""

    def wait_for_stop(self, timeout: Optional[float] = None, name: Optional[str] = None) -> bool:
        """True once the program stops; False after `timeout`."""

    def wait_for_change(self, timeout: float) -> None:
        """Returns when something changed, or after `timeout`."""

    def notify_change(self) -> None:
        """Wakes whoever waits in `wait_for_change`: a runner that hears of a node's exit as it
        happens calls it, so that the controller sees the exit without waiting for its poll."""

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        """A runner saw node `name` fail (its platform ended it)."""

    def executable_exited(self, name: str, exit_code: int,
                          last_output: Callable[[], str] = lambda: '') -> None:
        """The process of node `name` is gone, with `exit_code`."""

    def due_restarts(self, now: float) -> List[str]:
        """The nodes to start again at `now`."""

    def node_restarted(self, name: str) -> None:
        """The controller started node `name` again."""

    def restart_failed(self, name: str, reason: str) -> None:
        """Node `name` could not be started again: its last failure is final."""

    def mark_killed(self, names: Iterable[str]) -> None:
        """The controller killed `names`."""

    def add_nodes(self, names: Iterable[str], *,
                  policies: Optional[Mapping[str, 'NodePolicy']] = None,
                  calls: Optional[Tuple[Mapping[str, Iterable[str]],
                                        Mapping[str, Iterable[str]]]] = None) -> None:
        """Nodes join the running program, pending until they report their start (`calls`:
        whom they call, for the stop order)."""

    def told_to_stop(self) -> List[str]:
        """The executables told of the stop so far (callers before what they call)."""

    def set_node_addresses(self, addresses: Mapping[str, List[str]]) -> None:
        """Node name -> the ids of the addresses it serves."""

    def set_node_resources(self, name: str, devices: str, cores: str) -> None:
        """The GPUs and cores the launcher gave node `name`, as `status` shows them."""

    def remove_node(self, name: str) -> None:
        """Gives node `name` the stop: it leaves the program."""

    def removals(self) -> Dict[str, float]:
        """Nodes leaving that have not ended -> when their removal was asked (monotonic)."""

    def take_size_requests(self) -> Dict[str, int]:
        """The group sizes nodes asked for since the last call."""

    def group_nodes(self, label: str) -> List[str]:
        """The nodes of group `label` that run or start (not ended, not leaving), by index."""

    def probe(self, names: Iterable[str], kinds: Iterable[str], timeout: float
              ) -> Dict[str, dict]:
        """Asks node processes `names` live for `kinds` (stacks, calls, process); node -> its
        answer, or its last sample when none came within `timeout`
        (`launchpad.process.probe_broker`)."""


def members_of(face: type) -> FrozenSet[str]:
    """The names a Protocol declares (its methods and properties, its bases' included)."""
    names = set()
    for cls in face.__mro__:
        if cls is object or cls.__name__ in ('Protocol', 'Generic'):
            continue
        names.update(name for name in vars(cls) if not name.startswith('_'))
    return frozenset(names)


NODE_METHODS = members_of(NodeFace)
CONTROL_ONLY = members_of(ControlFace) - NODE_METHODS


def serve(target: Any, server, face: type = NodeFace) -> None:
    """Binds on courier `server` the methods of `face` (a NodeFace, or a Protocol extending it)
    of `target`, and for each controller-only method, one that refuses the call and says so."""
    served = members_of(face)
    for name in sorted(served):
        server.Bind(name, getattr(target, name))
    for name in sorted(CONTROL_ONLY - served):
        server.Bind(name, _refusal(name, served))


def _refusal(method: str, served: FrozenSet[str]) -> Callable[..., Any]:
    def refuse(*args, **kwargs):
        del args, kwargs
        raise PermissionError(
            f'{method} belongs to the coordinator\'s control face, which only the program\'s '
            f'controller calls; nodes may call {", ".join(sorted(served))} '
            '(see launchpad.process.faces).')
    return refuse


class NodeFaceProxy:
    """The node face of `target` (a coordinator, a client of one, or another node face), and
    nothing else: every call goes to `target`. Subclasses change the calls they handle."""

    def __init__(self, target: NodeFace):
        self._target = target

    def node_started(self, name: str, pid: int, host: str,
                     instance: Optional[str] = None) -> Optional[int]:
        return self._target.node_started(name, pid, host, instance)

    def node_finished(self, name: str) -> None:
        self._target.node_finished(name)

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        self._target.node_failed(name, message, traceback_text)

    def request_stop(self, reason: str = 'stop requested') -> None:
        self._target.request_stop(reason)

    def wait_for_stop(self, timeout: Optional[float] = None, name: Optional[str] = None) -> bool:
        return self._target.wait_for_stop(timeout, name)

    def publish_address(self, address_id: str, endpoint: str) -> None:
        self._target.publish_address(address_id, endpoint)

    def lookup_address(self, address_id: str, timeout: Optional[float] = None) -> Optional[str]:
        return self._target.lookup_address(address_id, timeout)

    def report_metrics(self, name: str, snapshot: dict) -> None:
        self._target.report_metrics(name, snapshot)

    def members(self, label: str) -> Members:
        return self._target.members(label)

    def wait_for_members(self, label: str, known: Optional[Members] = None,
                         timeout: Optional[float] = None) -> Members:
        return self._target.wait_for_members(label, known, timeout)

    def has_left(self, name: str) -> bool:
        return self._target.has_left(name)

    def request_size(self, label: str, size: int) -> None:
        self._target.request_size(label, size)

    def member_events(self, label: str, since: int = 0,
                      timeout: Optional[float] = None) -> List['MemberEvent']:
        return self._target.member_events(label, since, timeout)

    def supervise(self, label: str, owner: str) -> None:
        self._target.supervise(label, owner)

    def settle_failure(self, name: str, action: str) -> None:
        self._target.settle_failure(name, action)
    def wait_for_probe(self, name: str, sample: Optional[dict] = None,
                       timeout: float = 1.0) -> List[Tuple[int, List[str]]]:
        return self._target.wait_for_probe(name, sample, timeout)

    def answer_probe(self, name: str, probe_ids: List[int], answer: dict) -> None:
        self._target.answer_probe(name, probe_ids, answer)

