"""`local_mp` and `test_mp`: every executable runs in its own Python process on this machine."""
from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence, Union

import courier

from launchpad.address import local_address_table
from launchpad.launch import launcher
from launchpad.launch.coordinator import Coordinator
from launchpad.launch.output import Output
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


class _ProcessRunner:
    def __init__(self, workdir: str, server: courier.Server, output: Output):
        self._workdir = workdir
        self._server = server
        self._output = output
        self.processes: Dict[str, object] = {}

    def poll(self) -> Dict[str, Optional[int]]:
        return {name: process.poll() for name, process in self.processes.items()}

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            self.processes[name].kill()
        for name in names:  # reap, so that nothing lingers as a zombie
            process = getattr(self.processes[name], 'process', None)
            if process is not None:
                process.wait()

    def release(self) -> None:
        self._server.Stop()
        self._output.close()
        shutil.rmtree(self._workdir, ignore_errors=True)


class ProcessLauncher(launcher.Launcher):
    """Runs every executable in a worker process; servers listen on Unix sockets in a private
    directory that only this user can open, and calls carry the program's auth token."""

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
        flags = flags_snapshot()
        specs = []
        for i, (label, executable) in enumerate(executables):
            resources = options.resources.get(label) or PythonProcess()
            spec = WorkerSpec(
                program_name=program.name, launch_type=options.launch_type,
                node_name=executable.name, run=executable.run, address_table=table,
                coordinator_address=coordinator_address, parent_pid=os.getpid(),
                notice_period=options.notice_period, flags=flags,
                flag_overrides=resources.flag_overrides(), cleanup_dir=workdir)
            path = os.path.join(workdir, f'{i}.spec')
            write_spec(spec, path)  # every node is packed before any process starts
            env = {'GRPC_VERBOSITY': 'ERROR', **os.environ, **resources.env,
                   'COURIER_AUTH_TOKEN': token, 'PYTHONUNBUFFERED': '1'}
            argv = [resources.interpreter or sys.executable] + WORKER_ARGV + [path]
            specs.append((executable.name, argv, env))

        coordinator = Coordinator([name for name, _, _ in specs])
        server = courier.Server(address=coordinator_address, auth_token=token,
                                thread_pool_size=2 * len(specs) + 8)
        server.bind_object(coordinator)
        server.Start()
        output = Output(options.terminal, program.name, workdir)
        runner = _ProcessRunner(workdir, server, output)
        try:
            for name, argv, env in specs:
                runner.processes[name] = output.start(name, argv, env, os.getcwd())
        except BaseException:
            runner.kill(list(runner.processes))
            runner.release()
            raise
        return launcher.Controller(program.name, coordinator, runner,
                                   launch_type=options.launch_type,
                                   notice_period=options.notice_period)
