"""`local_mp` and `test_mp`: every executable runs in its own Python process on this machine."""
from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Union

import courier

from launchpad.address import local_address_table
from launchpad.launch import launcher
from launchpad.launch.coordinator import Coordinator, serve_coordinator
from launchpad.launch import forkserver
from launchpad.launch.forkserver import ForkServer
from launchpad.launch.output import Output, kill_group
from launchpad.launch.worker import WORKER_ARGV, WorkerSpec, flags_snapshot, write_spec
from launchpad.program import Program


@dataclasses.dataclass
class PythonProcess:
    """local_mp resources of a group.

    Attributes:
      args: absl flag values for the group's processes, as {name: value} or ['--name=value'].
      env: environment variables for the group's processes, e.g. {'CUDA_VISIBLE_DEVICES': '0'}.
      interpreter: the Python to run them with (default: the launcher's).
    """
    args: Union[Mapping[str, object], Sequence[str], None] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    interpreter: Optional[str] = None

    def flag_overrides(self) -> List[str]:
        if not self.args:
            return []
        if isinstance(self.args, Mapping):
            return [f'--{name}={value}' for name, value in self.args.items()]
        return list(self.args)


class _NodeProcess:
    """A node's process and the thread copying its output (`poll` and `kill` like Popen)."""

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


class _ProcessRunner:
    def __init__(self, workdir: str, server: courier.Server, output: Output):
        self._workdir = workdir
        self._server = server
        self._output = output
        self.fork_server: Optional[ForkServer] = None
        self.processes: Dict[str, object] = {}

    def poll(self) -> Dict[str, Optional[int]]:
        return {name: process.poll() for name, process in self.processes.items()}

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            self.processes[name].kill()

    def release(self) -> None:
        self._server.Stop()
        if self.fork_server is not None:
            self.fork_server.close()
        self._output.close()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def start(self, name: str, argv: List[str], env: Dict[str, str], forkable: bool):
        """Starts a node process: through the fork server when it can, else a fresh interpreter."""
        if self._output.runs_commands:
            self.processes[name] = self._output.start_command(name, argv, env, os.getcwd())
            return
        stdout_fd, reader = self._output.open_for(name)
        try:
            if forkable and self.fork_server is not None:
                process = self.fork_server.spawn(name, argv[1:], env, os.getcwd(), stdout_fd)
            else:
                process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                           stdout=stdout_fd, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        finally:
            os.close(stdout_fd)
        self.processes[name] = _NodeProcess(process, reader)


class ProcessLauncher(launcher.Launcher):
    """Runs every executable in a worker process; servers listen on Unix sockets in a private
    directory that only this user can open, and calls carry the program's auth token."""

    foreground = True

    def launch(self, program: Program, options: launcher.LaunchOptions) -> launcher.Controller:
        executables = launcher.executables_of(program, options)
        for label, resources in options.resources.items():
            if not isinstance(resources, PythonProcess):
                raise TypeError(f'{options.launch_type} takes lp.PythonProcess resources; group '
                                f'{label!r} got {resources!r}.')
        workdir = tempfile.mkdtemp(prefix='launchpad-')
        try:
            return self._launch(program, options, executables, workdir)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

    def _launch(self, program, options, executables, workdir) -> launcher.Controller:
        addresses = [address for _, executable in executables for address in executable.addresses]
        table = local_address_table(addresses, workdir)
        token = secrets.token_hex(16)
        coordinator_address = f'unix:{workdir}/coordinator.sock'
        output = Output(options.terminal, program.name, workdir)
        groups = [options.resources.get(label) or PythonProcess() for label, _ in executables]
        fork_server = None
        if not output.runs_commands and any(forkserver.usable_for(r.env, r.interpreter)
                                            for r in groups):
            fork_server = ForkServer(workdir)  # starts importing while the specs are packed
        try:
            starts = self._pack(program, options, executables, groups, table, token,
                                coordinator_address, fork_server, workdir, output.runs_commands)
        except BaseException:
            if fork_server is not None:
                fork_server.close()
            output.close()
            raise
        coordinator = Coordinator([name for name, _, _, _ in starts])
        server = serve_coordinator(coordinator, coordinator_address, auth_token=token)
        runner = _ProcessRunner(workdir, server, output)
        runner.fork_server = fork_server
        try:
            for name, argv, env, forkable in starts:
                runner.start(name, argv, env, forkable)
        except BaseException:
            runner.kill(list(runner.processes))
            runner.release()
            raise
        return launcher.Controller(program.name, coordinator, runner,
                                   launch_type=options.launch_type,
                                   notice_period=options.notice_period)

    @staticmethod
    def _pack(program, options, executables, groups, table, token, coordinator_address,
              fork_server, workdir, runs_commands) -> List[tuple]:
        """Writes every node's spec (before any process starts) and says how to start it."""
        flags = flags_snapshot()
        starts = []
        for i, ((_, executable), resources) in enumerate(zip(executables, groups)):
            forkable = fork_server is not None and forkserver.usable_for(resources.env,
                                                                         resources.interpreter)
            spec = WorkerSpec(
                program_name=program.name, launch_type=options.launch_type,
                node_name=executable.name, run=executable.run, address_table=table,
                coordinator_address=coordinator_address,
                parent_pid=_parent_pid(fork_server if forkable else None, runs_commands),
                notice_period=options.notice_period, flags=flags,
                flag_overrides=resources.flag_overrides(), cleanup_dir=workdir, tls=options.tls)
            path = os.path.join(workdir, f'{i}.spec')
            write_spec(spec, path)  # every node is packed before any process starts
            env = {'GRPC_VERBOSITY': 'ERROR', **os.environ, **resources.env,
                   courier.AUTH_TOKEN_ENV: token, 'PYTHONUNBUFFERED': '1'}
            argv = [resources.interpreter or sys.executable] + WORKER_ARGV + [path]
            starts.append((executable.name, argv, env, forkable))
        return starts


def _parent_pid(fork_server: Optional[ForkServer], runs_commands: bool) -> Optional[int]:
    """The pid a node's process should see as its parent, if it is a child of ours at all."""
    if runs_commands:
        return None  # tmux starts it; it notices a dead launcher through the coordinator
    return fork_server.pid if fork_server is not None else os.getpid()
