"""`local_mt` and `test_mt`: every executable runs as a thread of the launching process."""
from __future__ import annotations

import pickle
import shutil
import tempfile
import threading
from typing import Dict, Optional, Sequence

from launchpad import runtime
from launchpad.address import local_address_table
from launchpad.launch import launcher
from launchpad.launch.controller import Controller
from launchpad.process.coordinator import Coordinator, run_reporting
from launchpad.process.output import TERMINALS
from launchpad.process.spec import pickle_node
from launchpad.program import Program


class _ThreadRunner:
    """Threads cannot be killed: after the notice period they are abandoned (they are daemons)."""

    def __init__(self, workdir: str):
        self._workdir = workdir
        self.threads: Dict[str, threading.Thread] = {}
        self.exit_codes: Dict[str, int] = {}
        self.context: Optional[runtime.NodeContext] = None

    def poll(self) -> Dict[str, Optional[int]]:
        return {name: self.exit_codes.get(name) if not thread.is_alive() else None
                for name, thread in self.threads.items()}

    def kill(self, names: Sequence[str]) -> None:
        del names

    def release(self) -> None:
        runtime.clear_process_context(self.context)
        shutil.rmtree(self._workdir, ignore_errors=True)


class ThreadLauncher(launcher.Launcher):
    """Runs every executable as a thread; servers listen on Unix sockets in a private directory.

    Threads print to this process's own output whatever the terminal, and take any resources
    (those of another launch type are ignored), so one program runs unchanged here and elsewhere.
    """

    foreground = True
    terminals = TERMINALS

    def launch(self, program: Program, options: launcher.LaunchOptions) -> Controller:
        executables = launcher.executables_of(program, options)
        if options.serialize_py_nodes:  # nodes get copies, as they would in processes
            for _, executable in executables:
                executable.run = pickle.loads(pickle_node(executable.name, executable.run))
        workdir = tempfile.mkdtemp(prefix='launchpad-')
        addresses = [address for _, executable in executables for address in executable.addresses]
        coordinator = Coordinator([executable.name for _, executable in executables])
        table = local_address_table(addresses, workdir, registry=coordinator)
        stop = runtime.StopSignal(coordinator.request_stop)
        runner = _ThreadRunner(workdir)

        def watch_stop():
            coordinator.wait_for_stop()
            stop.trigger()

        threading.Thread(target=watch_stop, daemon=True, name=f'lp-{program.name}-stop').start()
        for _, executable in executables:
            label, index = executable.node_names[0].rsplit('/', 1)
            context = runtime.NodeContext(
                launch_type=options.launch_type, program_name=program.name, label=label,
                index=int(index), address_table=table, stop=stop, coordinator=coordinator,
                notice_period=options.notice_period, tls=options.tls)
            # Threads that node code starts itself see the first node's context.
            runner.context = runner.context or context

            def run_thread(context=context, executable=executable):
                runtime.set_thread_context(context)
                runner.exit_codes[executable.name] = run_reporting(
                    executable.run, executable.name, coordinator)

            runner.threads[executable.name] = threading.Thread(
                target=run_thread, name=f'lp-{executable.name}', daemon=True)
        runtime.set_process_context(runner.context)
        for thread in runner.threads.values():
            thread.start()
        return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period)
