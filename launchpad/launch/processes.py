"""`local_mp` and `test_mp`: every executable runs in its own Python process on this machine."""
from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import courier

from launchpad import runtime
from launchpad.address import add_to_local_table, local_address_table
from launchpad.launch import launcher
from launchpad.launch.controller import Controller, ProcessRunner
from launchpad.process import faces
from launchpad.process import flags
from launchpad.process import forkserver
from launchpad.process import spec as specs
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

    def release(self, aborted: bool = False) -> None:
        self.released.set()
        if self.context is not None:
            runtime.clear_process_context(self.context)
            self.context.stop.trigger()
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
        self.start(name, functools.partial(self._start, name, argv, env, forkable, [0]))

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
        parent = None if self.output.runs_commands else (  # tmux starts those
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
    options = launcher.NoOptions
    refused_options = {'detach': 'the program\'s coordinator runs in this process, so the program '
                                 'ends with it (detached local_mp programs are not supported '
                                 'yet). Run the script in the background (nohup, tmux), or '
                                 'launch on slurm or kubernetes, which take detach=True.'}

    def group_resources(self, label: str, resources) -> PythonProcess:
        """An `lp.Resources` alone as a PythonProcess carrying it."""
        if isinstance(resources, Resources):
            return PythonProcess(resources=resources)
        return resources

    def launch(self, program: Program, options: launcher.LaunchOptions) -> Controller:
        executables = launcher.executables_of(program, options)
        runner = _ProcessRunner(tempfile.mkdtemp(prefix='launchpad-'))
        try:
            return self._launch(program, options, executables, runner)
        except BaseException:  # Ctrl-C included: nothing of an unfinished launch is left
            runner.abort()
            raise

    def _launch(self, program, options, executables, runner: _ProcessRunner) -> Controller:
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
        output = runner.output = Output(options.terminal, program.name, workdir)
        fork_server = None
        if not output.runs_commands and any(forkserver.usable_for(r.env, r.interpreter)
                                            for r in groups):
            # It starts importing while the specs are packed.
            fork_server = runner.fork_server = ForkServer(workdir, options.notice_period)
        nodes = _NodePacker(packer, token, workdir, output, fork_server, devices)
        starts = [nodes.pack(executable, resources)
                  for (_, executable), resources in zip(executables, groups)]
        coordinator = Coordinator(
            [name for name, _, _, _ in starts], policies=policies, groups=program.group_limits(),
            stop_order=launcher.stop_order_of(program, executables, options.notice_period))
        for name, _, _, _ in starts:
            _show_resources(coordinator, devices, name)
        runner.server = serve_coordinator(coordinator, coordinator_address, auth_token=token)
        runner.nodes, runner.coordinator = nodes, coordinator
        runner.resources = dict(options.resources)
        for name, argv, env, forkable in starts:  # every node was packed before any starts
            runner.start_node(name, argv, env, forkable)
        runner.context = _launcher_context(program.name, options, packer.address_table,
                                           coordinator, token, runner.released)
        return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period, auth_token=token)


def _launcher_context(program_name: str, options: launcher.LaunchOptions, table, coordinator,
                      token: str, released: threading.Event) -> runtime.NodeContext:
    """Installs, in the launching process, a context through which handles dereference into
    clients of the program's nodes (e.g. a test talking to a node it launched). It carries the
    program's auth token, which this process's environment does not, and is removed when the
    program ends."""
    node_face = faces.NodeFaceProxy(coordinator)
    stop = runtime.StopSignal(node_face.request_stop)
    context = runtime.NodeContext(
        launch_type=options.launch_type, program_name=program_name, label='launcher', index=0,
        address_table=dataclasses.replace(table, registry=node_face), stop=stop,
        coordinator=node_face, notice_period=options.notice_period, tls=options.tls,
        auth_token=token)

    def watch_stop():
        while not coordinator.wait_for_stop(0.5) and not released.is_set():
            pass
        stop.trigger()

    threading.Thread(target=watch_stop, daemon=True, name=f'lp-{program_name}-stop').start()
    runtime.set_process_context(context)
    return context
