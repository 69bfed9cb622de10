"""A complete custom launcher in forty lines: every node runs in a process under a command prefix.

Launchers implement one method, `launch(program, options) -> lp.Controller`. This one starts each
executable as `PREFIX python <worker> <spec>`, e.g. under `nice`, `taskset` or `numactl`, using the
building blocks every process-based launcher shares: the worker spec, the coordinator served with
courier, and the common controller.

    python examples/custom_launcher.py
"""
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

import launchpad as lp
from launchpad.address import AddressTable
from launchpad.launch.coordinator import Coordinator, serve_coordinator
from launchpad.launch.worker import WORKER_ARGV, WorkerSpec, write_spec


class PrefixLauncher(lp.Launcher):
    """Runs every node as a local process started through `prefix` (a list of arguments)."""

    def __init__(self, prefix=('nice', '-n', '10')):
        self.prefix = list(prefix)

    def launch(self, program, options):
        executables = [executable for _, executable in lp.executables_of(program, options)]
        workdir = tempfile.mkdtemp(prefix='launchpad-')
        token = secrets.token_hex(16)
        addresses = [address for executable in executables for address in executable.addresses]
        table = AddressTable(static={a.id: f'unix:{workdir}/{i}.sock'
                                     for i, a in enumerate(addresses)})
        coordinator = Coordinator([executable.name for executable in executables])
        server = serve_coordinator(coordinator, f'unix:{workdir}/coordinator.sock',
                                    auth_token=token)
        processes = {}
        for i, executable in enumerate(executables):
            spec_path = os.path.join(workdir, f'{i}.spec')
            write_spec(WorkerSpec(program.name, options.launch_type, executable.name,
                                  executable.run, table, server.address,
                                  notice_period=options.notice_period), spec_path)
            processes[executable.name] = subprocess.Popen(
                self.prefix + [sys.executable] + WORKER_ARGV + [spec_path],
                env={**os.environ, 'COURIER_AUTH_TOKEN': token}, start_new_session=True)
        return lp.Controller(program.name, coordinator, _Runner(processes, server, workdir),
                             launch_type=options.launch_type, notice_period=options.notice_period)


class _Runner:
    """What the common controller needs: poll, kill, release."""

    def __init__(self, processes, server, workdir):
        self.processes, self.server, self.workdir = processes, server, workdir

    def poll(self):
        return {name: process.poll() for name, process in self.processes.items()}

    def kill(self, names):
        for name in names:
            self.processes[name].kill()
            self.processes[name].wait()

    def release(self):
        self.server.Stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def report_niceness(label):
    print(f'{label} runs with niceness {os.nice(0)}', flush=True)


if __name__ == '__main__':
    lp.register_launcher('nice', PrefixLauncher)
    demo = lp.Program('nice_demo')
    with demo.group('worker'):
        for index in range(2):
            demo.add_node(lp.PyNode(report_niceness, f'worker {index}'))
    lp.launch(demo, launch_type='nice').wait()
