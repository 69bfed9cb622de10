"""A detached program seen from outside its supervisor: starting one, attaching to one.

`lp.launch(program, launch_type='local_mp', detach=True)` calls `start`: it writes the program
to a run directory, starts its supervisor as a daemon (`launchpad.launch.supervisor`, a session
of its own that outlives this process and its terminal) and returns an `AttachedController` once
every node runs. `lp.attach(PROGRAM)` returns one from any shell of the same user, and
`python -m launchpad.launch attach PROGRAM` (`main`) follows the program as its launcher would.
Every call goes to the supervisor's observer (`launchpad.observe.observer`), authenticated with
the token of its registry entry; while a new supervisor takes over from a dead one, calls wait
for it.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import courier

from launchpad.launch.controller import Controller
from launchpad.nodes.base import Handle, Node
from launchpad.observe import registry
from launchpad.observe import runstore
from launchpad.observe import tunnel
from launchpad.process import flags
from launchpad.process import spec as specs
from launchpad.process import tempdirs
from launchpad.process.errors import NodeFailedError
from launchpad.process.states import NodeState, NodeStatus
from launchpad.scaling import Decision

SUPERVISOR_GRACE = 180.0  # default seconds nodes run on without a supervisor
SUPERVISOR_MODULE = 'launchpad.launch.supervisor'
LAUNCH_FILE = 'launch.pkl'  # in the run directory: the program and how to launch it
STATE_FILE = 'state.pkl'  # and its supervisor's persisted state, to re-adopt the nodes from
RUN_KIND = 'detached'  # launchpad.process.tempdirs' kind of run directories
RUN_PREFIX = 'launchpad-detached-'  # run directories: <tmp>/<RUN_PREFIX><id>-<random>
RECOVER_SCRIPT = 'recover'  # in an SSH program's run directory (`tunnel.RECOVER_SCRIPTS`)
# What a supervisor serves beside the observer's methods (`launchpad.launch.supervisor`).
CONTROL = ('node_status', 'outcome', 'add_node', 'remove_node', 'resize', 'group_size',
           'scaling_log', 'scale_up_times')
_START_TIMEOUT = 300.0
_CALL_TIMEOUT = 60.0


def supervisor_grace(detach: bool, grace: Optional[float]) -> float:
    """The seconds a detached program's nodes run on without a supervisor, as `lp.launch`'s
    `supervisor_grace=` gives them (None: SUPERVISOR_GRACE).

    Raises:
      ValueError: `grace` is not a positive number, or is given without `detach`.
    """
    if grace is not None and not detach:
        raise ValueError(f'supervisor_grace={grace!r} applies to detached programs only; pass '
                         'detach=True too, or leave it out.')
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, (int, float))
                              or not grace > 0):
        raise ValueError(f'supervisor_grace={grace!r} must be a positive number of seconds.')
    return SUPERVISOR_GRACE if grace is None else float(grace)


class ProgramEndedError(RuntimeError):
    """The detached program asked for has ended (its supervisor, keeper and run directory are
    gone)."""


def run_directories(program_id: str) -> List[str]:
    """The run directories of detached programs on this machine whose id starts with
    `program_id` (one while such a program runs)."""
    runs = glob.glob(os.path.join(tempfile.gettempdir(), f'{RUN_PREFIX}{program_id}*'))
    return [run for run in runs if os.path.exists(os.path.join(run, LAUNCH_FILE))]


class AttachedController(Controller):
    """A detached program's controller, reached through its supervisor: `status`, `wait`,
    `stop`, `add_node`, `remove_node`, `resize`, `group_size`, `scaling_log`, as `lp.Controller`
    (whose other members, such as `coordinator`, live in the supervisor only).

    Attributes:
      id: the program's id in the registry.
      program_name, launch_type: the program.
      auth_token: the token calls to its nodes must carry.
      detached: True (the program does not run from this process).
    """

    def __init__(self, entry: registry.Entry):  # pylint: disable=super-init-not-called
        # (Controller's own runs the program; this one only talks to where that happens.)
        self.detached = True
        self.id = entry.id
        self.program_name = entry.name
        self.launch_type = entry.launch_type
        self.auth_token = entry.node_token
        self._entry = entry
        self._client = _client_of(entry)
        self._token = tunnel.current(entry).token  # the one `_client` carries
        self._ended = False
        self._failed_calls = 0  # in a row, to a remote supervisor

    @property
    def supervisor(self) -> Dict[str, Any]:
        """Where the program's supervisor runs: {'host': ..., 'pid': ...}."""
        return {'host': self._entry.host, 'pid': self._entry.pid}

    @property
    def done(self) -> bool:
        return self._ended

    @property
    def observer(self):
        """None: the program's observer runs in its supervisor."""
        return None

    @observer.setter
    def observer(self, observer) -> None:
        if observer is not None:  # (`lp.launch` makes none for a detached program)
            raise ValueError('a detached program is observed by its supervisor')

    @property
    def coordinator(self):
        raise AttributeError('the coordinator of a detached program lives in its supervisor; '
                             'use status() and wait() here.')

    @property
    def output(self):
        """None: node output goes to files (`python -m launchpad.launch logs PROGRAM`)."""
        return None

    def status(self) -> Dict[str, NodeStatus]:
        """Node name -> its status."""
        return {row['name']: NodeStatus(**{**row, 'state': NodeState(row['state'])})
                for row in self._call('node_status')}

    def wait(self, labels: Optional[Sequence[str]] = None, timeout: Optional[float] = None, *,
             raise_error: bool = True, **unsupported) -> bool:
        """Blocks until the program ends (or `timeout` passes: False); raises NodeFailedError
        if a node failed and `raise_error`."""
        if labels is not None or unsupported:
            raise TypeError('wait() of a detached program waits for the whole program: it takes '
                            'timeout= and raise_error= only.')
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            try:
                outcome = self._call('outcome', left)
            except ProgramEndedError:
                self._ended = True  # before this asked: how it ended is not known here
                return True
            if outcome['ended']:
                self._ended = True
                if registry.is_remote(self._entry):  # (its supervisor there ends now)
                    tunnel.forget(self._entry)
                if raise_error and outcome['failure'] is not None:
                    raise NodeFailedError(*outcome['failure'])
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the program (nodes get the notice period) and waits until it has ended."""
        self._call('stop', f'lp.attach in pid {os.getpid()}')
        self.wait(timeout=timeout, raise_error=False)

    def stop_and_wait(self) -> None:
        self.stop()

    def kill(self) -> None:
        """Stops the program (a detached program's nodes always get their notice period)."""
        self.stop()

    def add_node(self, node: Node, label: Optional[str] = None) -> Handle:
        """Adds `node` to group `label` of the program and starts it; returns its handle."""
        return self._call('add_node', specs.pickle_node(getattr(node, 'name', 'node'), node),
                          label)

    def remove_node(self, name: str) -> None:
        self._call('remove_node', name)

    def resize(self, label: str, size: int) -> None:
        self._call('resize', label, size)

    def group_size(self, label: str) -> int:
        return self._call('group_size', label)

    @property
    def scaling_log(self) -> List[Decision]:
        return [Decision(**decision) for decision in self._call('scaling_log')]

    @property
    def scale_up_times(self) -> List[float]:
        return self._call('scale_up_times')

    def attach(self, program, resources) -> None:
        """(`lp.launch` calls it) `program.add_node` adds to the running program from now on."""
        del resources
        program.controller = self

    def _call(self, method: str, *args) -> Any:
        """Calls the supervisor; while a new one takes over from a dead one (its keeper lives),
        waits for it to register again."""
        while True:
            try:
                result = getattr(self._client, method)(*args)
                self._failed_calls = 0
                return result
            except courier.PermissionDeniedError:
                token = self._token  # (the one the refused call carried)
                if registry.is_remote(self._entry):
                    # The relay of the refused call's connection may have found the new
                    # supervisor already (its token is then the tunnel's): the open tunnel's
                    # next relay reaches it. Else a new tunnel brings the host's entry.
                    self._client = self._reconnect(
                        method, fresh=tunnel.current(self._entry).token == token)
                    if self._token == token:
                        raise
                    continue
                entry = next((e for e in registry.entries() if e.id == self.id), self._entry)
                if entry.token == token:
                    raise
                self._entry, self._client = entry, _client_of(entry)  # a new supervisor's
                self._token = entry.token
            except courier.ServerUnavailableError:
                if registry.is_remote(self._entry):
                    self._client = self._reconnect(method)
                    self._entry = tunnel.current(self._entry)  # a new supervisor's, if one is
                    continue
                if not registry.keeper_alive(self._entry):
                    if not run_directories(self.id):
                        raise ProgramEndedError(f'program {self.program_name} ({self.id}) has '
                                                'ended.') from None
                    raise RuntimeError(f'the supervisor of program {self.program_name} '
                                       f'({self.id}) and its keeper are gone; its nodes stop '
                                       'after the supervisor grace unless `python -m '
                                       f'launchpad.launch attach --recover {self.id}` starts '
                                       'a new one.') from None
                time.sleep(0.1)
                self._entry = next((e for e in registry.entries() if e.id == self.id),
                                   self._entry)
                self._client = _client_of(self._entry)
                self._token = self._entry.token

    def _reconnect(self, method: str, fresh: bool = True) -> courier.Client:
        """A client of a remote supervisor whose connection failed or refused the call,
        through a new tunnel (`fresh`), or the open one, whose relays reach a supervisor that
        replaced the one before. Raises ProgramEndedError if the supervisor is gone."""
        self._failed_calls += 1
        if self._failed_calls > 20:
            raise RuntimeError(f'the supervisor of program {self.program_name} ({self.id}) on '
                               f'{self._entry.host} does not answer {method}().')
        if fresh:
            time.sleep(0.1)
        try:
            client = _client_of(self._entry, fresh)
            self._token = tunnel.current(self._entry).token
            return client
        except tunnel.ProgramGoneError:
            self._ended = True
            raise ProgramEndedError(f'program {self.program_name} ({self.id}) has ended.') from None


def attach(query: str) -> AttachedController:
    """The controller of the running detached program `query` (its id, the start of it, or its
    name, as `python -m launchpad.launch list` shows them)."""
    entry = registry.find(query)
    if entry.keeper_pid is None:
        raise registry.RegistryError(
            f'program {entry.name} ({entry.id}) is not detached: it is controlled by the '
            f'process that launched it (pid {entry.pid}); launch it with detach=True to attach.')
    return AttachedController(entry)


def _client_of(entry: registry.Entry, fresh: bool = False) -> courier.Client:
    return tunnel.client_of(entry, _CALL_TIMEOUT, fresh)


# The launching side: `lp.launch(..., detach=True)`.

def start(program, options, grace: float) -> AttachedController:
    """Starts the supervisor of `program` as a daemon and returns once every node runs."""
    program_id = options.program_id or registry.new_id(program.name)
    log_dir = default_log_dir(program_id)
    header, payload = launch_file(program, dataclasses.replace(options, settings=None), grace,
                                  program_id, log_dir, [p for p in sys.path if p])
    controller = start_from(header, payload)
    print(f'Program {program.name!r} runs detached as {program_id}, supervised by pid '
          f'{controller.supervisor["pid"]} on {controller.supervisor["host"]}; node logs are in '
          f'{log_dir}.\n{commands(program_id)}', file=sys.stderr, flush=True)
    return controller


def commands(program_id: str) -> str:
    """How to follow, inspect and stop detached program `program_id`, for its launch to
    print."""
    return (f'  follow it:   python -m launchpad.launch attach {program_id}\n'
            f'  status:      python -m launchpad.launch status {program_id}\n'
            f'  stop it:     python -m launchpad.launch stop {program_id}')


def default_log_dir(program_id: str) -> str:
    """Where a detached program's node logs go on this machine: its run directory's `logs/`, or
    `$LAUNCHPAD_LOGGING_DIR/<program id>` (`runstore.logs_directory`)."""
    return str(runstore.logs_directory(program_id))


def launch_file(program, options, grace: float, program_id: str, log_dir: Optional[str],
                sys_path: List[str]) -> Tuple[Dict[str, Any], bytes]:
    """What a supervisor launches `program` from, with `options` (the launcher's settings
    included): (the header `read_header` reads, the pickled launch)."""
    launch = {'program': program, 'grace': grace, 'flags': flags.snapshot(),
              'options': dataclasses.replace(options, test_case=None, extra={})}
    header = {'sys_path': sys_path, 'program_id': program_id, 'name': program.name,
              'log_dir': log_dir, 'started': time.time()}
    return header, specs.pickle_node(program.name, launch)


def start_from(header: Dict[str, Any], payload: bytes, state: Optional[bytes] = None,
               recoverable: bool = False) -> AttachedController:
    """Writes the launch file (`launch_file`) to a new run directory, starts its keeper and
    returns once every node runs; ends what it started if the launch fails. With `state` (a
    supervisor's persisted state, moved from another host), the supervisor re-adopts the
    running program instead; `recoverable`: with RECOVER_SCRIPT (`write_recover_script`).

    Raises:
      registry.RegistryError: the registry cannot take the program (e.g. its directory's path
        is too long for the supervisor's socket), before anything starts.
    """
    program_id = header['program_id']
    registry.socket_path(program_id)  # where its supervisor will listen: it must fit
    run_dir = tempdirs.make(f'{RUN_KIND}-{program_id}', inside_run=False)
    keeper = None
    try:
        os.makedirs(header['log_dir'], exist_ok=True)
        path = os.path.join(run_dir, LAUNCH_FILE)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'wb') as f:
            pickle.dump((header, payload), f, protocol=pickle.HIGHEST_PROTOCOL)
        if state is not None:
            with open(os.open(os.path.join(run_dir, STATE_FILE), os.O_WRONLY | os.O_CREAT,
                              0o600), 'wb') as f:
                f.write(state)
        if recoverable:
            write_recover_script(run_dir)
        keeper = spawn_keeper(run_dir)
        return _wait_until_running(program_id, keeper, header['log_dir'])
    except BaseException:  # Ctrl-C included: nothing of an unfinished launch is left
        if keeper is not None:
            _end_keeper(keeper)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def read_header(run_dir: str) -> Dict[str, Any]:
    """What the launch file of `run_dir` says without unpickling the program: `sys_path`,
    `program_id`, `name`, `log_dir` and `started` (the launch's time)."""
    with open(os.path.join(run_dir, LAUNCH_FILE), 'rb') as f:
        return pickle.load(f)[0]


def spawn_keeper(run_dir: str) -> int:
    """Starts the keeper of `run_dir` in a session of its own (not a child of this process)
    and returns its pid."""
    started = subprocess.run(
        [sys.executable, '-m', SUPERVISOR_MODULE, 'keep', run_dir],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, check=True, text=True)
    return int(started.stdout.split()[-1])


def _wait_until_running(program_id: str, keeper: int, log_dir: str) -> AttachedController:
    deadline = time.monotonic() + _START_TIMEOUT
    controller = None
    while time.monotonic() < deadline:
        if controller is None:
            entry = next((e for e in registry.entries() if e.id == program_id), None)
            controller = entry and AttachedController(entry)
        if controller is not None:
            states = {status.state for status in controller.status().values()}
            if NodeState.FAILED in states:
                controller.wait()  # raises the node's failure
            if NodeState.PENDING not in states:
                return controller
        elif not _alive(keeper):
            raise RuntimeError(f'The supervisor of the detached program could not launch it; '
                               f'its output:\n{_tail(os.path.join(log_dir, "supervisor.log"))}')
        time.sleep(0.05)
    raise TimeoutError(f'The nodes of detached program {program_id} did not all start within '
                       f'{_START_TIMEOUT:g} s; it was stopped. See {log_dir}.')


def _alive(pid: int) -> bool:
    """True if process `pid` runs and is ours: not one killed that init has not reaped yet (a
    container's init may take a second or more), nor another user's that took its pid."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return registry.process_started(pid) is not None


def _end_keeper(keeper: int) -> None:
    """Asks the keeper to stop the program (SIGTERM) and waits a while for it to end."""
    try:
        os.kill(keeper, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 60.0
    while _alive(keeper) and time.monotonic() < deadline:
        time.sleep(0.05)


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-lines:])
    except OSError:
        return '(none)'


# `python -m launchpad.launch attach [--recover] PROGRAM`.

class _Detached(KeyboardInterrupt):
    """Ctrl-C while `attach` follows a program. Not KeyboardInterrupt itself: CPython takes a
    KeyboardInterrupt that ends code `exec` runs from a string (a dataclass or namedtuple being
    made by a module imported meanwhile) for one that ended the program, and ends the process
    by SIGINT at exit, whatever it returns."""


def _detach(signum, frame) -> None:
    del signum, frame
    raise _Detached


def main(argv: Sequence[str]) -> int:
    """Follows a detached program: its nodes' output, prefixed by node, and at its end the
    failure with its traceback; returns the program's exit status (0, or 1 if a node failed).
    Ctrl-C detaches and leaves it running."""
    parser = argparse.ArgumentParser(
        prog='python -m launchpad.launch attach',
        description='Follow a detached program: its output, and how it ends.')
    parser.add_argument('program', help='id (or its start) or name of the program')
    parser.add_argument('--recover', action='store_true',
                        help='start a new supervisor for it first (its old one and its keeper '
                             'are gone), re-adopting its nodes')
    parser.add_argument('--host', help="with --recover, a detached SSH program's: start it on "
                                       'this other host of the program (its supervisor\'s host '
                                       'is gone; default: the first other host that ssh '
                                       'reaches, if the supervisor\'s host does not answer)')
    args = parser.parse_args(list(argv))
    if args.host is not None and not args.recover:
        parser.error('--host applies to --recover only; pass --recover too.')
    try:
        if args.recover:
            _recover(args.program, args.host)
        controller = attach(args.program)
    except (registry.RegistryError, RuntimeError) as e:
        print(f'python -m launchpad.launch attach: {e}', file=sys.stderr)
        return 1
    cursor = None
    signal.signal(signal.SIGINT, _detach)
    try:
        print(f'Attached to {controller.program_name} ({controller.id}); Ctrl-C detaches and '
              'leaves it running.', file=sys.stderr, flush=True)
        while True:
            result = controller._call('logs', None, cursor)  # pylint: disable=protected-access
            cursor = result['cursor']
            for node, line in result['lines']:
                print(f'[{node}] {line}')
            sys.stdout.flush()
            outcome = controller._call('outcome', 0.5)  # pylint: disable=protected-access
            if outcome['ended']:
                break
    except KeyboardInterrupt:
        print(f'\nDetached from {controller.program_name} ({controller.id}); it keeps running.',
              file=sys.stderr)
        return 0
    except RuntimeError as e:
        print(f'python -m launchpad.launch attach: {e}', file=sys.stderr)
        return 1
    if outcome['failure'] is not None:
        print(f'\n{NodeFailedError(*outcome["failure"])}', file=sys.stderr, flush=True)
        return 1
    print(f'Program {controller.program_name} ({controller.id}) ended: '
          f'{outcome["stop_reason"] or "every node ended"}.', file=sys.stderr)
    return 0


def _recover(query: str, host: Optional[str] = None) -> None:
    """Starts a keeper (and so a supervisor) for the detached program `query` whose supervisor
    and keeper are gone: here, on its supervisor's host (through ssh), or on `host`, another
    host of a detached SSH program (`launchpad.launch.ssh.move`)."""
    running = [e for e in registry.entries() if query in (e.id, e.name) or e.id.startswith(query)]
    if host is not None and not (running and running[0].ssh is not None):
        raise RuntimeError(f'--host moves the supervision of a detached SSH program; {query!r} '
                           'is none of those registered here.')
    # pylint: disable=import-outside-toplevel  (the Kubernetes client, only for its programs)
    from launchpad.launch.kubernetes.coordinator_job import recovery_of_entry
    said = recovery_of_entry(running[0]) if running and host is None else None
    if said is not None:  # Kubernetes makes its coordinator pods: nothing to start here
        print(f'Program {running[0].id}: {said}', file=sys.stderr)
    elif running and registry.is_remote(running[0]):
        _recover_remote(running[0], host)
    else:
        recover_here(query)


def recover_here(query: str) -> registry.Entry:
    """Starts a keeper for the detached program `query` of this machine unless its keeper
    lives; returns its registry entry once its supervisor registered."""
    runs = run_directories(query)
    if len(runs) != 1:
        raise RuntimeError(f'{len(runs)} detached programs whose id starts with {query!r} have '
                           'a run directory here; name one by its full id.' if runs else
                           f'no detached program with id {query!r} has a run directory here '
                           '(its nodes may have stopped after the supervisor grace).')
    program_id = read_header(runs[0])['program_id']
    try:  # (read as it is: `registry.entries` leaves it out while its keeper starts a supervisor)
        entry = registry.Entry(**json.loads(
            (registry.directory() / f'{program_id}.json').read_text()))
    except (OSError, ValueError, TypeError):
        entry = None
    if entry is None or not registry.keeper_alive(entry):
        spawn_keeper(runs[0])
    deadline = time.monotonic() + 60.0
    while True:
        entry = next((e for e in registry.entries() if e.id == program_id), None)
        if entry is not None:
            return entry
        if time.monotonic() > deadline:
            raise RuntimeError(f'no supervisor of {program_id} registered within 60 s.')
        time.sleep(0.1)


def write_recover_script(run_dir: str) -> None:
    """Writes RECOVER_SCRIPT to `run_dir` (of a detached SSH program, supervised on this
    host): `recover_here` with this process's interpreter and environment, for `attach
    --recover` on the launching machine to run through ssh."""
    program_id = read_header(run_dir)['program_id']
    env = [f'{k}={v}' for k, v in os.environ.items() if not k.startswith('SSH_')]
    command = shlex.join(['exec', 'env', '-i', *env, sys.executable, '-m', SUPERVISOR_MODULE,
                          'recover', program_id])
    path = os.path.join(run_dir, RECOVER_SCRIPT)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'w') as f:
        f.write(command + '\n')


def _recover_remote(entry: registry.Entry, host: Optional[str] = None) -> None:
    """Has the host of `entry` (a detached SSH program's supervisor's) run its program's
    RECOVER_SCRIPT, or `host`, another host of the program, the script its agent there keeps
    to start a supervisor from its copies (`launchpad.launch.ssh.move`; reached with the ssh
    options of the supervisor's host); registers the new supervisor's entry here. Without
    `host`, if the supervisor's host cannot be reached, the supervision moves to the first other
    host of the program (`registry.Entry.hosts`) that can."""
    if host is not None:
        done, ssh = _move_to(entry, host)
    else:
        ssh = entry.ssh
        done = _run_over_ssh(ssh, tunnel.RECOVER_SCRIPTS.format(id=entry.id), 'test -f "$r"',
                             f'no run directory of {entry.id} is left there', entry.host)
        others = [other for other in entry.hosts or () if other != entry.ssh[-1]]
        for other in others if done.returncode == 255 else ():
            done, ssh = _move_to(entry, other)
            if done.returncode != 255:
                host = other
                break
    errors = ' '.join(done.stderr.decode(errors='replace').strip().splitlines()[-5:])
    if done.returncode == 255 and host is None:  # ssh's own failure: the host is unreachable
        tried = f' nor any other host of the program ({", ".join(others)})' if others else ''
        raise RuntimeError(
            f'cannot reach {entry.host}, where program {entry.name} ({entry.id}) is supervised,'
            f'{tried}: {errors} If only this machine is cut off, the program runs on there; try '
            'again once the hosts are reachable. If the host is gone, its nodes on the other '
            'hosts run on for the supervisor grace: move its supervision to one of them with '
            f'`python -m launchpad.launch attach --recover {entry.id} --host HOST`.')
    if done.returncode != 0:
        raise RuntimeError(f'no new supervisor of {entry.name} ({entry.id}) could be started on '
                           f'{host or entry.host} (exit {done.returncode}): {errors}')
    there = json.loads(done.stdout.decode().strip().splitlines()[-1])
    registry.register(registry.Entry(**{**there, 'ssh': ssh, 'hosts': entry.hosts}))


def _move_to(entry: registry.Entry, host: str) -> Tuple[subprocess.CompletedProcess, List[str]]:
    """Runs on `host`, another host of `entry`'s program, the script its agent keeps to start a
    supervisor there (`launchpad.launch.ssh.move`); returns what ran and the ssh command."""
    from launchpad.launch.ssh import protocol  # pylint: disable=import-outside-toplevel
    ssh = [*entry.ssh[:-1], host]
    # (the first line of an agent's script names its host: the file system may be shared)
    applies = 'test -f "$r" && test "$(head -n 1 "$r")" = "#$(uname -n)"'
    return _run_over_ssh(ssh, protocol.MOVE_SCRIPTS.format(id=entry.id), applies,
                         f'no agent of program {entry.id} runs there', host), ssh


def _run_over_ssh(ssh: List[str], scripts: str, applies: str, missing: str,
                  where: str) -> subprocess.CompletedProcess:
    """Runs through `ssh` the first of the shell words `scripts` for which `applies` holds
    (said as `missing` if none does)."""
    command = (f'for r in {scripts}; do if {applies}; then exec sh "$r"; fi; done; '
               f'echo "{missing}" >&2; exit 3')
    try:
        return subprocess.run([*ssh, command], capture_output=True, timeout=90.0)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f'{where} did not answer within 90 s.') from None
