"""Colocation nodes: several nodes run by one executable, as threads or as sub-processes.

Build the inner nodes (and any handles to them, with `node.create_handle()`), then add only the
colocation node to the program:

    learner = lp.CourierNode(Learner, replay)
    learner_handle = learner.create_handle()
    program.add_node(lp.MultiThreadingColocation([learner, replay_node]), label='learner')

Naming: the colocation node is named like any node ('learner/0'); the program's status and failures
use that name. Inner node `i` is named '<colocation name>/<i>' ('learner/0/1'), and inside it
`lp.get_context()` has the colocation's name as `label` and `i` as `index`, so its stop requests and
errors name the inner node.

Stopping: the program's stop reaches the colocation as one executable. Inner threads then hear it
in graph order, callers first (`launchpad.nodes.inner_threads`); inner sub-processes hear it
together.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from launchpad import runtime
from launchpad.address import Address
from launchpad.nodes.base import Handle, Node
from launchpad.nodes.inner_threads import InnerThreads
from launchpad.nodes.python import NoServiceHandle
from launchpad.process import faces
from launchpad.process import spec as specs
from launchpad.process import tempdirs

MODES = ('threads', 'processes')
_POLL = 0.05


class InnerNodeFailedError(RuntimeError):
    """A node inside a colocation failed (after its retries, for sub-processes)."""


class _ColocationHandle(NoServiceHandle):
    def dereference(self):
        raise TypeError(f'{self.node_id} is a colocation node and serves nothing itself: call its '
                        'inner nodes through their own handles (inner_node.create_handle()).')


class ColocationNode(Node):
    """Runs `nodes` in one executable: as threads (`mode='threads'`) or as sub-processes
    (`mode='processes'`) that the executable starts, watches and restarts.

    Args:
      nodes: the inner nodes; they must not be added to the program themselves.
      mode: 'threads' or 'processes'.
      num_retries_on_failure: with mode='processes', how many times each inner node is restarted
        after it fails before the colocation (and so the program) fails.
      return_on_first_completed: end the colocation when its first inner node ends (the others
        are then ended as the executable exits) instead of when all of them have.
    """

    def __init__(self, nodes: Sequence[Node], mode: str = 'threads',
                 num_retries_on_failure: int = 0, return_on_first_completed: bool = False):
        nodes = list(nodes) if isinstance(nodes, (list, tuple)) else nodes
        if not isinstance(nodes, list) or not nodes:
            raise ValueError(f'A colocation needs a non-empty list of nodes, got {nodes!r}.')
        if mode not in MODES:
            raise ValueError(f'Unknown colocation mode {mode!r}; use one of {", ".join(MODES)}.')
        if not isinstance(num_retries_on_failure, int) or num_retries_on_failure < 0:
            raise ValueError('num_retries_on_failure must be an integer >= 0, got '
                             f'{num_retries_on_failure!r}.')
        if num_retries_on_failure and mode != 'processes':
            raise ValueError('Only sub-processes can be restarted: use mode=\'processes\' '
                             '(lp.MultiProcessingColocation) with num_retries_on_failure.')
        for node in nodes:
            if not isinstance(node, Node):
                raise TypeError(f'A colocation takes launchpad nodes, got {node!r}.')
            if node.name is not None:
                raise ValueError(f'{node!r} was already added to a program; colocate nodes instead '
                                 'of adding them, and add only the colocation node.')
            owner = node.colocated_in
            if owner is not None:
                raise ValueError(f'{node!r} is already part of {owner!r}; a node can be in one '
                                 'colocation only.')
        if len({id(node) for node in nodes}) != len(nodes):
            raise ValueError('The same node appears twice in a colocation.')
        self._nodes = nodes
        super().__init__()
        self.mode = mode
        self.num_retries_on_failure = num_retries_on_failure
        self.return_on_first_completed = return_on_first_completed
        for node in nodes:
            node.colocated_in = self

    @property
    def name(self) -> Optional[str]:
        return self._name

    @name.setter
    def name(self, value: Optional[str]) -> None:
        self._name = value
        for i, node in enumerate(self._nodes):
            node.name = None if value is None else f'{value}/{i}'

    @property
    def inner_nodes(self) -> List[Node]:
        """The colocated nodes, in order."""
        return list(self._nodes)

    @property
    def addresses(self) -> List[Address]:
        return [address for node in self._nodes for address in node.addresses]

    def create_handle(self) -> Handle:
        return _ColocationHandle(self)

    def run_in_context(self) -> None:
        if self.mode == 'threads':
            self._run_threads()
        else:
            self._run_processes()

    def _run_threads(self) -> None:
        failure = InnerThreads(self._nodes, self.name, runtime.get_context(),
                               self.return_on_first_completed).run()
        if failure is not None:
            index, error = failure
            raise InnerNodeFailedError(
                f'{self._nodes[index].name} ({self._nodes[index]!r}) failed: '
                f'{type(error).__name__}: {error}') from error

    def _run_processes(self) -> None:
        _Supervisor(self, runtime.get_context()).run()


class MultiThreadingColocation(ColocationNode):
    """Runs `nodes` as threads of one executable (`lp.ColocationNode(nodes, mode='threads')`)."""

    def __init__(self, nodes: Sequence[Node], return_on_first_completed: bool = False):
        super().__init__(nodes, mode='threads',
                         return_on_first_completed=return_on_first_completed)


class MultiProcessingColocation(ColocationNode):
    """Runs `nodes` as sub-processes of one executable, restarting a failed one up to
    `num_retries_on_failure` times (`lp.ColocationNode(nodes, mode='processes')`)."""

    def __init__(self, nodes: Sequence[Node], num_retries_on_failure: int = 0):
        super().__init__(nodes, mode='processes', num_retries_on_failure=num_retries_on_failure)


class _CoordinatorRelay(faces.NodeFaceProxy):
    """What the sub-processes of a colocation see as the program's coordinator (its node face).

    Stop requests, addresses, metrics and group membership go to the real coordinator. The
    sub-processes stop when the program stops or when the colocation ends (`end()`). Node
    reports stay here, since the colocation decides whether a failed inner node is restarted or
    fails the program.
    """

    def __init__(self, context: runtime.NodeContext):
        super().__init__(context.coordinator)
        self._context = context
        self._ending = threading.Event()
        self._lock = threading.Lock()
        self._failures: Dict[str, tuple] = {}

    def end(self) -> None:
        self._ending.set()

    def node_started(self, name: str, pid: int, host: str,
                     instance: Optional[str] = None) -> Optional[int]:
        del name, pid, host, instance
        return None

    def node_finished(self, name: str) -> None:
        del name

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        with self._lock:
            self._failures[name] = (message, traceback_text)

    def take_failure(self, name: str) -> Optional[tuple]:
        with self._lock:
            return self._failures.pop(name, None)

    def request_stop(self, reason: str = 'stop requested') -> None:
        self._context.stop.request(reason)

    def wait_for_stop(self, timeout: Optional[float] = None, name: Optional[str] = None) -> bool:
        del name  # the inner nodes leave with their colocation, never one by one
        return self._ending.wait(timeout)

    def wait_for_probe(self, name: str, sample: Optional[dict] = None,
                       timeout: float = 1.0) -> List[Tuple[int, List[str]]]:
        """Inner processes are not asked one by one (the colocation's own process answers for
        the executable), so their probe threads hold no thread of the coordinator."""
        del name, sample
        self._ending.wait(timeout)
        return []

    def answer_probe(self, name: str, probe_ids: List[int], answer: dict) -> None:
        del name, probe_ids, answer


class _Supervisor:
    """Starts each inner node of a colocation as a worker process, restarts failed ones, and ends
    them all when the colocation ends."""

    def __init__(self, colocation: ColocationNode, context: runtime.NodeContext):
        self._colocation = colocation
        self._context = context
        self._relay = _CoordinatorRelay(context)
        self._processes: Dict[int, subprocess.Popen] = {}

    def run(self) -> None:
        import courier  # pylint: disable=import-outside-toplevel
        workdir = tempdirs.make('colocation')
        nodes = self._colocation.inner_nodes
        # The sub-processes inherit this process's environment, and with it the program's courier
        # auth token (if it has one), which this server also reads.
        server = courier.Server(address=f'unix:{workdir}/coordinator.sock',
                                thread_pool_size=4 * len(nodes) + 8)
        faces.serve(self._relay, server)
        server.Start()
        self._context.stop.add_handler(self._relay.end)
        try:
            argvs = self._write_specs(nodes, f'unix:{workdir}/coordinator.sock', workdir)
            for index, argv in enumerate(argvs):
                self._processes[index] = self._start(argv)
            self._watch(nodes, argvs)
        finally:
            self._relay.end()
            self._context.stop.remove_handler(self._relay.end)
            self._end_all()
            server.Stop()
            shutil.rmtree(workdir, ignore_errors=True)

    def _write_specs(self, nodes: List[Node], coordinator_address: str,
                     workdir: str) -> List[List[str]]:
        context = self._context
        packer = specs.Packer(context.program_name, context.launch_type,
                              dataclasses.replace(context.address_table, registry=None),
                              coordinator_address, notice_period=context.notice_period,
                              tls=context.tls)
        argvs = []
        for index, node in enumerate(nodes):
            path = os.path.join(workdir, f'{index}.spec')
            specs.write(packer.spec(node.name, node.run_in_context, parent_pid=os.getpid(),
                                    cleanup_dir=workdir), path)
            argvs.append(specs.worker_argv(path))
        return argvs

    @staticmethod
    def _start(argv: List[str]) -> subprocess.Popen:
        # Same process group as this executable, so that a launcher killing it kills them too.
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def _watch(self, nodes: List[Node], argvs: List[List[str]]) -> None:
        retries_left = {index: self._colocation.num_retries_on_failure for index in self._processes}
        stop = self._context.stop.event
        while self._processes and not stop.is_set():
            for index, process in list(self._processes.items()):
                code = process.poll()
                if code is None:
                    continue
                del self._processes[index]
                failure = self._relay.take_failure(nodes[index].name)
                if code == 0 and failure is None:
                    if self._colocation.return_on_first_completed:
                        return
                    continue
                if stop.is_set():
                    return
                message, traceback_text = failure or (_describe_exit(code), '')
                if retries_left[index] > 0:
                    retries_left[index] -= 1
                    logging.warning('%s failed (%s); restarting it (%d retries left).',
                                    nodes[index].name, message, retries_left[index])
                    self._processes[index] = self._start(argvs[index])
                    continue
                retried = self._colocation.num_retries_on_failure
                raise InnerNodeFailedError(
                    f'{nodes[index].name} ({nodes[index]!r}) failed'
                    + (f' after {retried} restarts' if retried else '') + f': {message}'
                    + (f'\n\nTraceback in {nodes[index].name}:\n{traceback_text.rstrip()}'
                       if traceback_text else ''))
            stop.wait(_POLL)

    def _end_all(self) -> None:
        """Gives the inner nodes still running the notice period to end, then kills them."""
        deadline = time.monotonic() + self._context.notice_period
        for process in self._processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()


def _describe_exit(code: int) -> str:
    if code < 0:
        return f'its process was killed by signal {-code}'
    return f'its process ended with exit code {code} without reporting an error'
