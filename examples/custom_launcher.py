"""A complete custom launcher in forty lines: every node runs in a process under a command prefix.

Launchers implement one method, `launch(program, options) -> lp.Controller`. This one starts each
executable as `PREFIX python <worker> <spec>`, e.g. under `nice`, `taskset` or `numactl`, using the
building blocks every process-based launcher shares: the worker spec, the coordinator's node face
served with courier, and the common controller. The controller drives the platform through a
`Runner` (`launchpad/launch/controller.py`), which must `poll` and `kill` its executables and may
`release`, `restart`, keep `output`, and `add_executable`/`remove` nodes while the program runs:
`ProcessRunner` polls, kills and restarts processes started with `start(name, starter)`.

    python examples/custom_launcher.py
"""
import functools
import os
import secrets
import shutil
import subprocess
import tempfile

import launchpad as lp
from launchpad.address import local_address_table
from launchpad.launch.runner import ProcessRunner
from launchpad.process import spec
from launchpad.process.coordinator import Coordinator, serve_coordinator


class PrefixLauncher(lp.Launcher):
    """Runs every node as a local process started through `prefix` (a list of arguments)."""

    def __init__(self, prefix=('nice', '-n', '10')):
        self.prefix = list(prefix)

    def launch(self, program, options):
        executables = [executable for _, executable in lp.executables_of(program, options)]
        workdir = tempfile.mkdtemp(prefix='launchpad-')
        token = secrets.token_hex(16)
        addresses = [address for executable in executables for address in executable.addresses]
        coordinator = Coordinator([executable.name for executable in executables])
        server = serve_coordinator(coordinator, f'unix:{workdir}/coordinator.sock',
                                   auth_token=token)
        packer = spec.Packer(program.name, options.launch_type,
                             local_address_table(addresses, workdir), server.address,
                             notice_period=options.notice_period)
        runner = _Runner(server, workdir)
        for i, executable in enumerate(executables):
            path = os.path.join(workdir, f'{i}.spec')
            spec.write(packer.admit(executable), path)
            runner.start(executable.name, functools.partial(  # `restart` calls it again
                subprocess.Popen, self.prefix + spec.worker_argv(path),
                env=spec.node_environment(token), start_new_session=True))
        return lp.Controller(program.name, coordinator, runner,
                             launch_type=options.launch_type, notice_period=options.notice_period)


class _Runner(ProcessRunner):
    """Polls, kills and restarts the processes (`ProcessRunner`), and releases the rest."""

    def __init__(self, server, workdir):
        super().__init__()
        self.server, self.workdir = server, workdir

    def kill(self, names):
        super().kill(names)
        for name in names:
            self.processes[name].wait()  # reaped: no zombie is left

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
