"""`local_mp` and `test_mp`: every executable runs in its own Python process on this machine."""
from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import courier
import psutil

from launchpad import runtime
from launchpad.address import add_to_local_table, local_address_table
from launchpad.launch import detached
from launchpad.launch import launcher
from launchpad.launch.controller import Controller
from launchpad.launch.runner import ProcessRunner
from launchpad.process import flags
from launchpad.process import forkserver
from launchpad.process import spec as specs
from launchpad.process import tempdirs
from launchpad.process.coordinator import Coordinator, serve_coordinator
from launchpad.process.devices import Allocator, Inventory, preflight
from launchpad.process.forkserver import ForkServer
from launchpad.process.output import TERMINALS, Output, kill_group
from launchpad.program import Program
from launchpad.resources import Resources


@dataclasses.dataclass
class PythonProcess:
    """local_mp resources of a group.

    Attributes:
      args: absl flag values for the group's processes, as {name: value} or ['--name=value'].
      env: environment variables for the group's processes, e.g. {'CUDA_VISIBLE_DEVICES': '0'}.
      interpreter: the Python to run them with (default: the launcher's).
      resources: the GPUs and cores each of its processes gets (`lp.Resources`; a group may also
        be given an `lp.Resources` alone).
    """
    args: Union[Mapping[str, object], Sequence[str], None] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    interpreter: Optional[str] = None
    resources: Optional[Resources] = None

    def flag_overrides(self) -> List[str]:
        """`args` as '--name=value' strings."""
        return flags.overrides(self.args)


@dataclasses.dataclass
class ProcessOptions:
    """local_mp's own options of `lp.launch`.

    Attributes:
      detach: run the program's supervision (its coordinator and controller: restarts, hang
        detection, elastic groups, scaling policies, metrics, its registry entry) in a daemon
        process of its own session (`launchpad.launch.supervisor`), so that the program outlives
        this process, its terminal and its SSH session; `lp.launch` returns once every node
        runs, with a controller of it (`launchpad.launch.detached`). Node output goes to files.
      supervisor_grace: seconds the nodes of a detached program run on without a supervisor (one
        is started again at once on this machine if it dies) before they stop by themselves
        (default `detached.SUPERVISOR_GRACE`, 180 s).
    """
    detach: bool = False
    supervisor_grace: Optional[float] = None


@dataclasses.dataclass
class Supervision:
    """How a detached program's supervisor launches it (`launch_supervised`) or re-adopts it
    (`readopt`): its nodes do not end with this process, write their output to `log_dir`, and
    `persist(state)` is called with `supervised_state` after each look at the nodes."""
    grace: float
    log_dir: str
    flags: Dict[str, object]  # the launching process's absl flags, for the nodes
    persist: Callable[[Callable[[], dict]], None]


EXITS = 'exits'  # a detached program's run directory: exit codes of the nodes its keeper reaped


class _NodeProcess:
    """A node's process and the thread copying its output (a `NodeProcess`)."""

    def __init__(self, process, reader: Optional[threading.Thread]):
        self.process = process
        self.reader = reader

    def poll(self) -> Optional[int]:
        code = self.process.poll()
        if code is not None and self.reader is not None:
            self.reader.join(2.0)  # its output is printed before it counts as ended
        return code

    def kill(self) -> None:
        kill_group(self.process.pid)
        if isinstance(self.process, subprocess.Popen):
            self.process.wait()  # reap it, so that nothing lingers as a zombie


class _AdoptedProcess:
    """A node process that an earlier supervisor of a detached program started (a
    `NodeProcess`): the keeper reaps it and writes its exit code to `<exits>/<pid>`."""

    def __init__(self, pid: int, started: float, exits: str):
        self.pid, self.started, self._exits = pid, started, exits
        self._gone_since: Optional[float] = None

    def poll(self) -> Optional[int]:
        try:
            with open(os.path.join(self._exits, str(self.pid))) as f:
                return int(f.read())
        except (OSError, ValueError):
            pass
        if self._alive():
            return None
        self._gone_since = self._gone_since or time.monotonic()
        # Reaped by someone else than the keeper (it died too): how it ended is unknown.
        return -signal.SIGKILL if time.monotonic() - self._gone_since > 1.0 else None

    def kill(self) -> None:
        if self._alive():
            kill_group(self.pid)

    def _alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            same = not self.started or abs(process.create_time() - self.started) < 1.0
            return same and process.status() != psutil.STATUS_ZOMBIE  # (not a reused pid)
        except psutil.Error:
            return False


class _ProcessRunner(ProcessRunner):
    """The node processes of one launch, and what they need: made piece by piece by the launch,
    which ends what it made so far (`abort`) if it does not complete."""

    def __init__(self, workdir: str):
        super().__init__()
        self.workdir = workdir
        self.server: Optional[courier.Server] = None
        self.output: Optional[Output] = None  # where the nodes' output goes
        self.fork_server: Optional[ForkServer] = None
        self.context: Optional[runtime.NodeContext] = None
        self.released = threading.Event()
        # What nodes added to the running program are started with (set by the launch).
        self.nodes: Optional[_NodePacker] = None
        self.coordinator: Optional[Coordinator] = None
        self.resources: Dict[str, PythonProcess] = {}
        # Name -> (command line, environment, [starts so far]): how each node is started.
        self.commands: Dict[str, Tuple[List[str], Dict[str, str], List[int]]] = {}
        self.supervision: Optional[Supervision] = None
        self._started: Dict[int, float] = {}  # pid -> its start time (`supervised_state`)

    def poll(self) -> Dict[str, Optional[int]]:
        codes = super().poll()
        if self.supervision is not None:
            self.supervision.persist(self.supervised_state)
        return codes

    def supervised_state(self) -> dict:
        """What a new supervisor needs to re-adopt the running program (`readopt`)."""
        commands = {}
        for name, (argv, env, starts) in self.commands.items():
            pid = getattr(self.processes[name], 'pid', None) or self.processes[name].process.pid
            if pid not in self._started:
                try:
                    self._started[pid] = psutil.Process(pid).create_time()
                except psutil.Error:
                    self._started[pid] = 0.0
            commands[name] = (argv, env, starts, pid, self._started[pid])
        return {'coordinator': self.coordinator, 'nodes': self.nodes, 'commands': commands,
                'resources': self.resources}

    def release(self, aborted: bool = False) -> None:
        self.released.set()
        if self.context is not None:
            runtime.clear_process_context(self.context)
            self.context.stop.trigger()
        if self.coordinator is not None:
            self.coordinator.close_probes()
        if self.server is not None:
            self.server.Stop()
        if self.fork_server is not None:
            self.fork_server.close(abort=aborted)
        if self.output is not None:
            self.output.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def abort(self) -> None:
        """Ends at once what an unfinished launch started (on an error, or Ctrl-C in it)."""
        self.kill(list(self.processes))
        self.release(aborted=True)

    def check_add(self, label: str) -> None:
        """Any group can grow while this machine has the GPUs and cores of one more node."""
        requested = (self.resources.get(label) or PythonProcess()).resources
        if requested is not None:
            self.nodes.devices.release_ended(self.coordinator.status())
            self.nodes.devices.check(label, requested)

    def add_executable(self, label: str, executable, policy) -> None:
        """Starts a node added to the running program, as the launch started the others: forked
        from the fork server when its group can be."""
        add_to_local_table(self.nodes.packer.address_table, executable.addresses, self.workdir,
                           registry=self.coordinator)
        self.nodes.devices.release_ended(self.coordinator.status())
        group = self.resources.get(label) or PythonProcess()
        start = self.nodes.pack(executable, group, policy)
        _show_resources(self.coordinator, self.nodes.devices, executable.name)
        self.start_node(*start)

    def last_output(self, name: str) -> str:
        """The last lines node `name` printed."""
        return self.output.tail(name)

    def start_node(self, name: str, argv: List[str], env: Dict[str, str], forkable: bool):
        """Starts a node process (and again on `restart`): through the fork server when it can,
        else a fresh interpreter."""
        self.adopt(name, None, argv, env, forkable, [0])

    def adopt(self, name: str, process, argv: List[str], env: Dict[str, str], forkable: bool,
              starts: List[int]) -> None:
        """Keeps `process` (None: starts it) as node `name`'s, started with `argv` and `env`
        (`starts` times before), which `restart` uses again."""
        self.commands[name] = (argv, env, starts)
        starter = functools.partial(self._start, name, argv, env, forkable, starts)
        if process is None:
            self.start(name, starter)
        else:
            self.processes[name], self._starters[name] = process, starter

    def _start(self, name: str, argv: List[str], env: Dict[str, str], forkable: bool,
               starts: List[int]):
        starts[0] += 1
        if self.output.runs_commands:
            window = name if starts[0] == 1 else f'{name}~{starts[0] - 1}'
            return self.output.start_command(window, argv, env, os.getcwd())
        stdout_fd, reader = self.output.open_for(name)
        try:
            if forkable and self.fork_server is not None:
                process = self.fork_server.spawn(name, argv[1:], env, os.getcwd(), stdout_fd)
            else:
                process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                           stdout=stdout_fd, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        finally:
            os.close(stdout_fd)
        return _NodeProcess(process, reader)


@dataclasses.dataclass
class _NodePacker:
    """Packs nodes into spec files of the launch's directory: every node of the launch, and each
    node added to the running program, goes through `pack` (then `_ProcessRunner.start_node`)."""
    packer: specs.Packer
    token: str
    workdir: str
    output: Output
    fork_server: Optional[ForkServer]
    devices: Allocator
    packed: int = 0
    detached: bool = False  # its nodes outlive this process (a detached program's supervisor)

    def pack(self, executable, resources: PythonProcess, policy=None
             ) -> Tuple[str, List[str], Dict[str, str], bool]:
        """Writes the spec of `executable` (`policy`: an added node's) with the devices and
        cores it is given; returns what `start_node` takes: its name, command line, environment
        and whether it can be forked."""
        given = None if resources.resources is None else self.devices.assign(
            executable.name, resources.resources)
        env = {**resources.env, **(given.environment() if given else {})}
        forkable = self.fork_server is not None and forkserver.usable_for(
            env, resources.interpreter)
        parent = None if self.output.runs_commands or self.detached else (  # tmux starts those
            self.fork_server.pid if forkable else os.getpid())
        path = os.path.join(self.workdir, f'{self.packed}.spec')
        self.packed += 1
        specs.write(self.packer.admit(executable, policy, args=resources.args, parent_pid=parent,
                                      cleanup_dir=self.workdir, resources=given), path)
        return (executable.name, specs.worker_argv(path, resources.interpreter),
                specs.node_environment(self.token, extra=env), forkable)


def _show_resources(coordinator: Coordinator, devices: Allocator, name: str) -> None:
    """Tells the coordinator what node `name` was given, for `status` and the dashboard."""
    given = devices.given(name)
    if given is not None:
        coordinator.set_node_resources(name, **given.describe())


class ProcessLauncher(launcher.Launcher):
    """Runs every executable in a worker process; servers listen on Unix sockets in a private
    directory that only this user can open, and calls carry the program's auth token."""

    foreground = True
    resource_types = (PythonProcess, Resources)
    terminals = TERMINALS
    options = ProcessOptions

    def group_resources(self, label: str, resources) -> PythonProcess:
        """An `lp.Resources` alone as a PythonProcess carrying it."""
        if isinstance(resources, Resources):
            return PythonProcess(resources=resources)
        return resources

    def launch(self, program: Program, options: launcher.LaunchOptions) -> Controller:
        settings = options.settings or ProcessOptions()
        grace = detached.supervisor_grace(settings.detach, settings.supervisor_grace)
        if settings.detach:
            if options.launch_type != 'local_mp':
                raise ValueError(f'detach=True is not supported by the {options.launch_type} '
                                 'launcher: a test program ends with its test; launch on '
                                 'local_mp to detach.')
            return detached.start(program, options, grace)
        return launch_supervised(program, options)

    def _launch(self, program, options, executables, runner: _ProcessRunner,
                supervision: Optional[Supervision]) -> Controller:
        workdir = runner.workdir
        addresses = [address for _, executable in executables for address in executable.addresses]
        token = secrets.token_hex(16)
        coordinator_address = f'unix:{workdir}/coordinator.sock'
        policies = launcher.policies_of(program, executables)
        packer = specs.Packer(program.name, options.launch_type,
                              local_address_table(addresses, workdir), coordinator_address,
                              notice_period=options.notice_period, tls=options.tls,
                              policies=policies,
                              checkpoint_root=os.path.join(workdir, 'checkpoints'))
        groups = [options.resources.get(label) or PythonProcess() for label, _ in executables]
        devices = Allocator(Inventory.discover)
        preflight([(devices, executable.name, resources.resources) for (_, executable), resources
                   in zip(executables, groups) if resources.resources is not None])
        if supervision is not None:
            packer.coordinator_grace, packer.flags = supervision.grace, supervision.flags
            runner.supervision = supervision
        output = runner.output = Output(
            'output_to_files' if supervision else options.terminal, program.name, workdir,
            log_dir=supervision.log_dir if supervision else launcher.log_dir_of(options))
        fork_server = None  # a detached program's nodes must not end with a fork server
        if not output.runs_commands and supervision is None and any(forkserver.usable_for(r.env, r.interpreter)
                                            for r in groups):
            # It starts importing while the specs are packed.
            fork_server = runner.fork_server = ForkServer(workdir, options.notice_period)
        nodes = _NodePacker(packer, token, workdir, output, fork_server, devices,
                            detached=supervision is not None)
        starts = [nodes.pack(executable, resources)
                  for (_, executable), resources in zip(executables, groups)]
        coordinator = Coordinator(
            [name for name, _, _, _ in starts], policies=policies, groups=program.group_limits(),
            stop_order=launcher.stop_order_of(program, executables, options.notice_period))
        for name, _, _, _ in starts:
            _show_resources(coordinator, devices, name)
        runner.server = serve_coordinator(coordinator, coordinator_address, auth_token=token)
        runner.nodes, runner.coordinator = nodes, coordinator
        if fork_server is not None:
            fork_server.on_exit = coordinator.notify_change
        runner.resources = dict(options.resources)
        for name, argv, env, forkable in starts:  # every node was packed before any starts
            runner.start_node(name, argv, env, forkable)
        if supervision is None:  # (a supervisor talks to no node)
            runner.context = launcher.launcher_context(program.name, options,
                                                       packer.address_table, coordinator, token,
                                                       runner.released)
        return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period, auth_token=token)


def launch_supervised(program: Program, options: launcher.LaunchOptions,
                      workdir: Optional[str] = None,
                      supervision: Optional[Supervision] = None) -> Controller:
    """Launches `program` from this process, its files in `workdir` (default: a directory of its
    own): attached to this process, or, with `supervision`, as the supervisor of a detached
    program."""
    runner = None
    try:  # (the directory is made inside: a Ctrl-C at any point of the launch removes it)
        runner = _ProcessRunner(workdir or tempdirs.make())
        executables = launcher.executables_of(program, options)
        return ProcessLauncher()._launch(  # pylint: disable=protected-access
            program, options, executables, runner, supervision)
    except BaseException:  # Ctrl-C included: nothing of an unfinished launch is left
        if runner is not None:
            runner.abort()
        raise


def readopt(program: Program, options: launcher.LaunchOptions, workdir: str,
            supervision: Supervision, state: dict) -> Controller:
    """Takes over the running nodes of a detached program whose supervisor died, from what
    it persisted (`_ProcessRunner.supervised_state`); restarts none of them."""
    runner = _ProcessRunner(workdir)
    runner.supervision = supervision
    nodes, coordinator = state['nodes'], state['coordinator']
    runner.output = nodes.output = Output('output_to_files', program.name, workdir,
                                          log_dir=supervision.log_dir)
    runner.nodes, runner.coordinator, runner.resources = nodes, coordinator, state['resources']
    exits = os.path.join(workdir, EXITS)
    for name, (argv, env, starts, pid, started) in state['commands'].items():
        runner.adopt(name, _AdoptedProcess(pid, started, exits), argv, env, False, starts)
    try:
        runner.server = serve_coordinator(coordinator, nodes.packer.coordinator_address,
                                          auth_token=nodes.token)
    except BaseException:
        runner.release(aborted=True)
        raise
    return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                      notice_period=options.notice_period, auth_token=nodes.token)
