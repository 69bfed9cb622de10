"""The supervisor of a detached local_mp or ssh program, and the keeper that starts it again.

`lp.launch(..., detach=True)` writes the program to a run directory and starts the keeper
(`launchpad.launch.detached.spawn_keeper`):

    python -m launchpad.launch.supervisor keep RUN_DIR

    keeper       forks away from its caller (printing its pid), leads a session of its own (a
                 closed terminal does not end it) and is the child subreaper of what it starts:
                 it runs the supervisor, and starts a new one when it dies (a signal, the OOM
                 killer, an error); it reaps the node processes a dead supervisor leaves,
                 writing each exit code to RUN_DIR/exits/PID. SIGTERM stops the program. An
                 SSH program's master connections (`ssh.masters`) are its children too, which
                 outlive a supervisor for its successor; it ends what is left of them last.
    supervisor   forked by the keeper: launches the program (`processes.launch_supervised`), or,
                 after a death, re-adopts its running nodes (`processes.readopt`) from
                 RUN_DIR/state.pkl, which it rewrites whenever the program changed; serves the
                 program's observer and registry entry with its control (`detached.CONTROL`);
                 exits 0 once the program has ended (its run directory is gone then).

A detached ssh program's supervisor runs on one of its hosts, started there by
`launchpad.launch.ssh.detach` with `python -m launchpad.launch.supervisor start` (`start_here`:
the launch file comes on stdin, its registry entry goes back on stdout); it launches the
program with the ssh launcher, whose host agents outlive it, and a new one re-adopts the nodes
through them (`ssh.launcher.readopt`). If its host is gone for good, `move` starts one on
another host from the copies of its state there (`launchpad.launch.ssh.move`).

Nodes of a detached program outlive a dead supervisor: calls between nodes go on, their
metrics wait for the next supervisor, and they stop by themselves if none comes within the
supervisor grace (`lp.launch(..., supervisor_grace=...)`).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
import logging
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from courier import serialization

from launchpad.launch import detached
from launchpad.launch import processes
from launchpad.launch.ssh import launcher as ssh
from launchpad.launch.ssh import masters, move
from launchpad.launch.controller import Controller, LaunchSignals
from launchpad.observe import registry
from launchpad.observe.observer import Observer
from launchpad.process import tempdirs
from launchpad.process import tree

STATE_FILE = detached.STATE_FILE
LOG_FILE = 'supervisor.log'  # in the program's log directory
PERSIST_INTERVAL = 0.2  # seconds between writes of a changed state
RESTARTS_PER_MINUTE = 5  # a supervisor dying more often than this is not started again


class Persister:
    """Writes the supervised program's state (`processes.Supervision.persist`) atomically when
    it changed: at once when a node's state or process changed, else (metrics) at most every
    PERSIST_INTERVAL seconds. (A node's start that a dead supervisor heard of but did not write
    is told again by the node to the next one, see `launchpad.process.worker`.) The program
    goes under 'program', pickled again only once it grew (`pickle_program`); a detached
    Kubernetes program's coordinator pod (`launchpad.launch.kubernetes.readopt`) and a
    detached Slurm program's in-job driver (`launchpad.launch.slurm.driver`) keep their state
    so too. Several threads may call it: a state pickled later never gives way to one pickled
    before it."""

    def __init__(self, path: str, program, extra: Callable[[], Dict[str, Any]]):
        self._path, self._program, self._extra = path, program, extra
        self._pickled_program = (-1, b'')  # (its number of nodes, its pickle)
        self._last: Optional[bytes] = None
        self._last_time = 0.0
        self._last_processes: Any = None
        self._lock = threading.Lock()  # (not held while pickling, which may take a while)
        self._calls = self._written = 0  # the numbers of the last call and the last written

    def __call__(self, state: Callable[[], dict], now: bool = False) -> None:
        """Writes `state()` if it changed; `now`: whatever the nodes (the caller changed what
        follows them, such as a node's step about to start)."""
        snapshot = state()
        statuses = snapshot['coordinator'].status()
        nodes_now = sorted((name, status.state.value, status.restarts,
                                snapshot['commands'].get(name, (0,) * 4)[3])
                               for name, status in statuses.items())
        with self._lock:
            if (not now and nodes_now == self._last_processes
                    and time.monotonic() - self._last_time < PERSIST_INTERVAL):
                return
            self._last_time, self._last_processes = time.monotonic(), nodes_now
            self._calls += 1
            call = self._calls
        snapshot.update(program=self._program_pickle(len(statuses)), **self._extra())
        data = serialization.cloudpickle_dumps(snapshot)
        with self._lock:
            if (call < self._written or data == self._last
                    or not os.path.isdir(os.path.dirname(self._path))):
                return
            temporary = self._path + '.tmp'
            try:
                with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                          'wb') as f:
                    f.write(data)
                os.replace(temporary, self._path)
            except FileNotFoundError:
                return  # the program has ended meanwhile: its run directory is gone
            self._last, self._written = data, call

    @property
    def last(self) -> Optional[bytes]:
        """The state it wrote last (a detached SSH program's supervisor copies it to the
        agents, `launchpad.launch.ssh.move`)."""
        with self._lock:
            return self._last

    def _program_pickle(self, nodes: int) -> bytes:
        """The program pickled, again only once it grew."""
        if self._pickled_program[0] != nodes:
            self._pickled_program = (nodes, self.pickle_program(self._program))
        return self._pickled_program[1]

    @staticmethod
    def pickle_program(program) -> bytes:
        """`program` as the state holds it: without its controller (this process's; a new
        supervisor sets its own)."""
        program = copy.copy(program)
        program.controller = None
        return serialization.cloudpickle_dumps(program)


class _Control:
    """What the supervisor serves beside the observer (`detached.CONTROL`), for
    `detached.AttachedController`: plain data in and out."""

    def __init__(self, controller: Controller):
        self._controller = controller

    def methods(self) -> Dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in detached.CONTROL}

    def node_status(self) -> List[Dict[str, Any]]:
        return [{**dataclasses.asdict(status), 'state': status.state.value}
                for status in self._controller.status().values()]

    def outcome(self, timeout: float = 0.0) -> Dict[str, Any]:
        """Whether the program has ended (waiting up to `timeout` seconds for it), why, and its
        failure as NodeFailedError's arguments."""
        coordinator = self._controller.coordinator
        deadline = time.monotonic() + min(timeout, 10.0)
        while True:
            ended = self._controller.done or not (coordinator.running()
                                                  or coordinator.restarts_pending)
            if ended or time.monotonic() >= deadline:
                break
            coordinator.wait_for_change(min(0.1, max(0.0, deadline - time.monotonic())))
        failure = coordinator.failure
        return {'ended': ended, 'stop_reason': coordinator.stop_reason,
                'failure': None if failure is None else (
                    failure.node_name, failure.message, failure.remote_traceback,
                    failure.failures)}

    def add_node(self, node: bytes, label: Optional[str] = None):
        return self._controller.add_node(pickle.loads(node), label)

    def remove_node(self, name: str) -> None:
        self._controller.remove_node(name)

    def resize(self, label: str, size: int) -> None:
        self._controller.resize(label, size)

    def group_size(self, label: str) -> int:
        return self._controller.group_size(label)

    def scaling_log(self) -> List[Dict[str, Any]]:
        return [dataclasses.asdict(decision) for decision in self._controller.scaling_log]

    def scale_up_times(self) -> List[float]:
        return self._controller.scale_up_times


def supervise(run_dir: str) -> int:
    """Launches (or re-adopts) the program of `run_dir` and supervises it until it ends."""
    header = detached.read_header(run_dir)
    for entry in reversed(header['sys_path']):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    with open(os.path.join(run_dir, detached.LAUNCH_FILE), 'rb') as f:
        launch = pickle.loads(pickle.load(f)[1])
    options, state_path = launch['options'], os.path.join(run_dir, STATE_FILE)
    state = None
    if os.path.exists(state_path):
        with open(state_path, 'rb') as f:
            state = pickle.load(f)
    if state is not None:  # (`benchmarks/recover_bench.py` times the steps from these lines)
        logging.info('Supervisor pid %d re-adopts program %s from its state.', os.getpid(),
                     header['program_id'])
    program = pickle.loads(state['program']) if state is not None else launch['program']
    holder: Dict[str, Controller] = {}
    persist = Persister(state_path, program, lambda: {
        'scaler': holder['controller']._elastic._scaler if holder else None})  # pylint: disable=protected-access
    supervision = processes.Supervision(launch['grace'], header['log_dir'], launch['flags'],
                                        persist)
    with LaunchSignals(f'program {program.name!r}') as signals:
        if options.launch_type == 'ssh' and state is None:
            controller = ssh.launch_supervised(program, options, supervision, run_dir)
        elif options.launch_type == 'ssh':
            try:
                controller = ssh.readopt(program, options, supervision, state, run_dir)
            except move.SupervisionMovedError as e:  # (its keeper, seeing 0, ends too)
                logging.warning('Supervisor pid %d leaves program %s: %s', os.getpid(),
                                header['program_id'], e)
                shutil.rmtree(run_dir, ignore_errors=True)
                return 0
        elif state is None:
            controller = processes.launch_supervised(program, options, run_dir, supervision)
        else:
            controller = processes.readopt(program, options, run_dir, supervision, state)
        if state is not None:
            logging.warning('Supervisor pid %d re-adopted program %s (%d nodes).', os.getpid(),
                            header['program_id'], len(state['coordinator'].status()))
        signals.started()
    holder['controller'] = controller
    controller.attach(program, options.resources)
    if state is not None and state.get('scaler') is not None:
        controller._elastic._scaler = state['scaler']  # pylint: disable=protected-access
    controller.handle_signals(signals)
    controller.observer = Observer(  # its age counts from the launch, across supervisors
        program, controller, program_id=header['program_id'],
        served=_Control(controller).methods(),
        entry_fields={'keeper_pid': os.getppid(), 'started': header['started']}).start()
    controller.wait(raise_error=False)
    if options.launch_type == 'ssh':  # (a local_mp program's nodes remove theirs)
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def keep(run_dir: str) -> None:
    """The keeper (see the module docstring); prints its pid and returns in the caller."""
    header = detached.read_header(run_dir)
    log = os.open(os.path.join(header['log_dir'], LOG_FILE),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        return
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    code = 1
    try:
        _keep(run_dir)
        code = 0
    finally:
        masters.end_all(run_dir)  # (a detached SSH program's master connections, if any left)
        os._exit(code)  # pylint: disable=protected-access


def _keep(run_dir: str) -> None:
    tree.become_subreaper()
    tempdirs.claim(run_dir)  # (the launching process, its other owner, may end first)
    exits = os.path.join(run_dir, processes.EXITS)
    os.makedirs(exits, exist_ok=True)
    stopping: List[int] = []
    child: List[int] = []

    def stop(signum, frame):
        del frame
        stopping.append(signum)
        if child:
            try:
                os.kill(child[-1], signal.SIGTERM)
            except ProcessLookupError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    deaths: collections.deque = collections.deque()
    while True:
        supervisor = _fork_supervisor(run_dir)
        child.append(supervisor)
        if stopping:
            stop(stopping[0], None)
        code = _reap_until(supervisor, exits)
        if code == 0 or stopping or not os.path.exists(os.path.join(run_dir, STATE_FILE)):
            return
        now = time.monotonic()
        deaths.append(now)
        while deaths and deaths[0] < now - 60.0:
            deaths.popleft()
        if len(deaths) > RESTARTS_PER_MINUTE:
            print(f'The supervisor died {len(deaths)} times within a minute; no new one is '
                  'started. The nodes stop after the supervisor grace unless `python -m '
                  'launchpad.launch attach --recover` starts one.', flush=True)
            return
        print(f'The supervisor (pid {supervisor}) ended ({_describe(code)}); starting a new '
              'one, which re-adopts the running nodes.', flush=True)


def _fork_supervisor(run_dir: str) -> int:
    """Starts a supervisor of `run_dir` and returns its pid: forked from the keeper, which
    has imported what it needs already, so that a new one takes over within a second."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        code = supervise(run_dir)
    except BaseException:  # pylint: disable=broad-except
        logging.exception('The supervisor failed.')
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # pylint: disable=protected-access


def _reap_until(pid: int, exits: str) -> int:
    """Reaps children (nodes orphaned by a dead supervisor among them, whose exit codes go to
    `exits`) until `pid` ends; returns its exit code."""
    while True:
        ended, status = os.waitpid(-1, 0)
        code = os.waitstatus_to_exitcode(status)
        if ended == pid:
            return code
        try:
            temporary = os.path.join(exits, f'.{ended}')
            with open(temporary, 'w') as f:
                f.write(str(code))
            os.replace(temporary, os.path.join(exits, str(ended)))
        except OSError:
            pass  # the run has ended and its directory is gone


def _describe(code: int) -> str:
    return (f'killed by {signal.Signals(-code).name}' if code < 0 else f'exit code {code}')


def start_here() -> int:
    """Starts the detached program whose launch file (`detached.launch_file`) comes on stdin
    on this host, supervised here; prints its registry entry as JSON on stdout once every
    node runs (`launchpad.launch.ssh.detach` reads it on the launching machine)."""
    header, payload = pickle.load(sys.stdin.buffer)
    header['log_dir'] = header['log_dir'] or detached.default_log_dir(header['program_id'])
    controller = detached.start_from(header, payload, recoverable=True)
    entry = dataclasses.asdict(controller._entry)  # pylint: disable=protected-access
    try:
        print(json.dumps({'entry': entry, 'log_dir': header['log_dir']}), flush=True)
    except BrokenPipeError:  # the launch was given up (Ctrl-C or death of the launcher)
        controller.stop()
        return 1
    return 0


def main(argv: List[str]) -> int:
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
    if argv == ['start']:
        try:
            return start_here()
        except registry.RegistryError as e:  # (the launching machine shows what it says)
            print(f'{type(e).__name__}: {e}', file=sys.stderr)
            return 1
    if len(argv) == 2 and argv[0] == 'recover':  # (`detached.write_recover_script`)
        print(json.dumps(dataclasses.asdict(detached.recover_here(argv[1]))), flush=True)
        return 0
    if len(argv) == 2 and argv[0] == 'move':  # (`protocol.MOVE_SCRIPT`)
        try:
            entry = move.start_moved(argv[1])
        except (RuntimeError, OSError) as e:  # (the launching machine shows what it says)
            print(f'{type(e).__name__}: {e}', file=sys.stderr)
            return 1
        print(json.dumps(dataclasses.asdict(entry)), flush=True)
        return 0
    if len(argv) != 2 or argv[0] != 'keep':
        sys.exit(f'usage: python -m {__name__} keep RUN_DIR | start (a launch file on stdin) '
                 '| recover PROGRAM_ID | move AGENT_DIR')
    keep(argv[1])
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
