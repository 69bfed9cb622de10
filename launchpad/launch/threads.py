"""`local_mt` and `test_mt`: every executable runs as a thread of the launching process.

Threads cannot be killed. Ending one at once (a node that does not cooperate with a stop, a hung
node) raises `NodeStopped` inside it, which ends Python code at its next line but not a call
blocked in C; a thread still alive after that is abandoned (it is a daemon) and counts as killed.
A node's thread waiting in a queue or a sleep when it is told to stop is woken once its stop
handlers ran, so that an exception they raised in it lands (`launchpad.process.interrupt`).
A restarted node runs in a new thread.

    lp-NODE threads      the nodes (a new one per restart, and one per node added while it runs)
    lp-PROGRAM-stop      waits for the program's stop, then tells the nodes in graph order
                         (callers first): runs each one's stop handlers, then ends it if it
                         does not cooperate (a node that stops the program in its own thread
                         and is told at once runs its stop handlers there)
    lp-watchdog          with progress deadlines: reports hung nodes with every thread's stack
    lp-PROGRAM           the controller's monitor thread (restarts, the notice period)
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import shutil
import threading
import time
from typing import Callable, Dict, Optional, Sequence

from launchpad import runtime
from launchpad.address import add_to_local_table, local_address_table
from launchpad.launch import launcher
from launchpad.launch.controller import Controller
from launchpad.launch.runner import Runner
from launchpad.process import faces
from launchpad.process import interrupt
from launchpad.process import tempdirs
from launchpad.process.coordinator import Coordinator, NodeStopped, run_reporting
from launchpad.process.output import TERMINALS
from launchpad.process.spec import pickle_node
from launchpad.process.watchdog import ProgressWatchdog
from launchpad.program import Program

_ABANDON_AFTER = 1.0  # seconds a thread gets to end after NodeStopped before it is abandoned


class _ThreadRunner(Runner):
    """The node threads of one launch."""

    def __init__(self, workdir: str, coordinator: Coordinator):
        self.workdir = workdir
        self.coordinator = coordinator
        self._lock = threading.Lock()
        self.threads: Dict[str, threading.Thread] = {}
        self.contexts: Dict[str, runtime.NodeContext] = {}
        self._runs: Dict[str, Callable[[], None]] = {}
        self.exit_codes: Dict[str, int] = {}
        self._abandoned: Dict[str, float] = {}  # name -> when NodeStopped was raised in it
        self._raised_twice: set = set()
        self.context: Optional[runtime.NodeContext] = None
        self.released = threading.Event()
        self.watchdog: Optional[ProgressWatchdog] = None
        self.hung: Optional[Callable[[str, str, str], None]] = None  # a watchdog's report
        # (name, policy) -> the context of a node added to the running program
        self.new_context: Optional[Callable[..., runtime.NodeContext]] = None
        self._ordinary_sleeps = interrupt.wakeable_sleeps()  # node threads' sleeps can be woken

    def add(self, name: str, context: runtime.NodeContext, run: Callable[[], None]) -> None:
        self.contexts[name] = context
        self._runs[name] = run
        self.threads[name] = threading.Thread(target=self._run_thread, args=(name, context),
                                              name=f'lp-{name}', daemon=True)

    def _run_thread(self, name: str, context: runtime.NodeContext) -> None:
        runtime.set_thread_context(context)
        if self.watchdog is not None and context.progress_deadline is not None:
            self.watchdog.watch(name, context, context.progress_deadline, threading.get_ident())
        reports = _ThreadReports(self, name)
        try:
            code = run_reporting(self._runs[name], name, reports, context=context)
        except interrupt.RAISED_AT_STOP:  # raised at the stop as the node's code ended, it landed after
            reports.node_finished(name)
            code = 0
        self._record_exit(name, code)

    def _record_exit(self, name: str, code: int) -> None:
        """Records how the calling thread's node ended. An exception raised in it at the stop
        as its code ended (NodeStopped, under the lock; a stop handler's SystemExit) may land
        here still: the node had ended all the same, so its exit code is recorded again, and none
        is raised in it once it is."""
        while True:
            try:
                with self._lock:
                    interrupt.cancel_raise(threading.current_thread())
                    if self._current(name):
                        self.exit_codes[name] = code
                        if self.watchdog is not None:
                            self.watchdog.forget(name)
                return
            except interrupt.RAISED_AT_STOP:
                pass

    def _current(self, name: str) -> bool:
        """Whether the calling thread runs node `name`'s latest instance (not an abandoned one)."""
        return self.threads.get(name) is threading.current_thread()

    def poll(self) -> Dict[str, Optional[int]]:
        now = time.monotonic()
        with self._lock:
            codes = {}
            for name, thread in self.threads.items():
                since = self._abandoned.get(name)
                if name in self.exit_codes or not thread.is_alive():
                    codes[name] = self.exit_codes.get(name, 1)
                elif since is not None and now - since > _ABANDON_AFTER:
                    codes[name] = -9  # abandoned: it ran on past NodeStopped
                else:
                    if since is not None and now - since > _ABANDON_AFTER / 2 and (
                            name not in self._raised_twice):
                        self._raised_twice.add(name)  # the first may have landed where it
                        interrupt.raise_in(thread, NodeStopped)  # is ignored (a __del__, say)
                    codes[name] = None
            return codes

    def end(self, names: Sequence[str]) -> None:
        """Raises NodeStopped in the named nodes' threads (see the module docstring)."""
        with self._lock:
            for name in names:
                thread = self.threads[name]
                if (thread.is_alive() and name not in self._abandoned
                        and name not in self.exit_codes):
                    self._abandoned[name] = time.monotonic()
                    interrupt.raise_in(thread, NodeStopped)

    def kill(self, names: Sequence[str]) -> None:
        self.end(names)

    def check_add(self, label: str) -> None:
        """Any group can grow."""

    def add_executable(self, label: str, executable, policy) -> None:
        """Starts a node added to the running program in a thread of its own."""
        del label
        add_to_local_table(self.context.address_table, executable.addresses, self.workdir)
        context = self.new_context(executable.name, policy)
        with self._lock:
            self.add(executable.name, context, executable.run)
            thread = self.threads[executable.name]
        if self.watchdog is None and context.progress_deadline is not None:
            self.watchdog = ProgressWatchdog(self.hung)
        thread.start()

    def restart(self, name: str) -> None:
        old = self.contexts[name]
        context = dataclasses.replace(old, stop=runtime.StopSignal(old.stop.request),
                                      progress=runtime.Progress(), attempt=0)
        with self._lock:
            self._abandoned.pop(name, None)
            self._raised_twice.discard(name)
            self.exit_codes.pop(name, None)
            self.add(name, context, self._runs[name])
            self.threads[name].start()

    def remove(self, name: str) -> None:
        """Node `name` leaves the running program: its stop handlers run; it ends at once if it
        does not cooperate (see `Controller.remove_node`)."""
        self.stop_nodes([name])

    def stop_all(self) -> None:
        """The program stops: every node is told at once (a launch that did not complete)."""
        self.stop_nodes(list(self.contexts))

    def stop_nodes(self, names: Sequence[str]) -> None:
        """Nodes `names` are told that the program stops: their stop handlers run, then those
        that do not cooperate are ended, and those that do are woken from a wait, so that an
        exception their handlers raised in them lands (`interrupt.tell_threads`)."""
        with self._lock:
            threads = dict(self.threads)
        interrupt.tell_threads({name: self.contexts[name].stop for name in names
                                if name in self.contexts}, threads, self.end)

    def request_stop(self, name: str, reason: str) -> None:
        """Node `name` asks the program to stop (`lp.stop()`). Asked in the node's own thread, as
        Acme's StepsLimiter does, by a node told at once (no other calls it), it hears the stop
        there before this returns, as a node's main thread does on local_mp: an exception that its
        stop handlers raise in it (Acme's SystemExit) ends it now, not after whatever it does next
        (Acme's StepsLimiter sleeps a second next)."""
        self.coordinator.request_stop(reason)
        if self._current(name) and name in self.coordinator.told_to_stop():
            self.stop_nodes([name])

    def stop_in_order(self) -> None:
        """Once the program stops, tells its nodes in the coordinator's order (callers first,
        `launchpad.process.stop_order`) until every node was told or the launch is released."""
        while not self.coordinator.wait_for_stop(0.5):
            if self.released.is_set():
                return
        told: set = set()
        while not self.released.is_set():
            names = [name for name in self.coordinator.told_to_stop() if name not in told]
            told.update(names)
            self.stop_nodes(names)
            if told >= set(self.contexts):
                return
            self.coordinator.wait_for_change(0.05)

    def release(self) -> None:
        self.released.set()
        self._ordinary_sleeps()
        if self.watchdog is not None:
            self.watchdog.close()
        runtime.clear_process_context(self.context)
        # A node's thread that is still ending (a server closing) may write into the directory
        # while it is removed, which then fails as not empty: try again for a little while.
        deadline = time.monotonic() + 2.0
        shutil.rmtree(self.workdir, ignore_errors=True)
        while os.path.exists(self.workdir) and time.monotonic() < deadline:
            time.sleep(0.05)
            shutil.rmtree(self.workdir, ignore_errors=True)


def _node_context(options: launcher.LaunchOptions, program_name: str, table,
                  coordinator: faces.NodeFace, checkpoint_root: str,
                  request_stop: Callable[[str, str], None], name: str,
                  policy) -> runtime.NodeContext:
    label, index = runtime.label_and_index(name)
    return runtime.NodeContext(
        launch_type=options.launch_type, program_name=program_name, label=label,
        index=index, address_table=table,
        stop=runtime.StopSignal(functools.partial(request_stop, name)), coordinator=coordinator,
        notice_period=options.notice_period, tls=options.tls,
        progress_deadline=policy.progress_deadline if policy else None,
        checkpoint_root=checkpoint_root)


class _ThreadReports(faces.NodeFaceProxy):
    """What a node thread reports to the coordinator; an abandoned thread (its node was
    restarted, or it ran on past NodeStopped) no longer speaks for the node."""

    def __init__(self, runner: _ThreadRunner, name: str):
        super().__init__(runner.coordinator)
        self._runner = runner
        self._name = name

    def _speaks(self) -> bool:
        return self._runner._current(self._name)  # pylint: disable=protected-access

    def node_finished(self, name: str) -> None:
        if self._speaks():
            super().node_finished(name)

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        if self._speaks():
            super().node_failed(name, message, traceback_text)


class ThreadLauncher(launcher.Launcher):
    """Runs every executable as a thread; servers listen on Unix sockets in a private directory.

    Threads print to this process's own output whatever the terminal, and take any resources
    (those of another launch type are ignored), so one program runs unchanged here and elsewhere.
    """

    foreground = True
    terminals = TERMINALS
    options = launcher.NoOptions
    refused_options = {'detach': 'local_mt nodes are threads of this process, so the program '
                                 'ends with it. To outlive this process, launch on local_mp (or '
                                 'slurm, kubernetes), which take detach=True.'}

    def launch(self, program: Program, options: launcher.LaunchOptions) -> Controller:
        executables = launcher.executables_of(program, options)
        if options.serialize_py_nodes:  # nodes get copies, as they would in processes
            for _, executable in executables:
                executable.run = pickle.loads(pickle_node(executable.name, executable.run))
        policies = launcher.policies_of(program, executables)
        coordinator = Coordinator(
            [executable.name for _, executable in executables], policies=policies,
            groups=program.group_limits(),
            stop_order=launcher.stop_order_of(program, executables, options.notice_period))
        runner = _ThreadRunner(tempdirs.make(), coordinator)
        try:
            return self._launch(program, options, executables, policies, runner)
        except BaseException:  # Ctrl-C included: nothing of an unfinished launch is left
            coordinator.request_stop('the launch did not complete')
            runner.stop_all()
            runner.release()
            raise

    @staticmethod
    def _launch(program: Program, options: launcher.LaunchOptions, executables, policies,
                runner: _ThreadRunner) -> Controller:
        coordinator, workdir = runner.coordinator, runner.workdir
        addresses = [address for _, executable in executables for address in executable.addresses]
        node_face = faces.NodeFaceProxy(coordinator)  # all that node threads see of it
        table = local_address_table(addresses, workdir, registry=node_face)
        checkpoints = os.path.join(workdir, 'checkpoints')

        def hung(name: str, summary: str, stacks: str) -> None:
            coordinator.node_failed(name, f'hung: {summary}',
                                    f'The stack of each thread, the node\'s own last:\n{stacks}')
            runner.end([name])

        runner.hung = hung
        if any(policy.progress_deadline for policy in policies.values()):
            runner.watchdog = ProgressWatchdog(hung)
        threading.Thread(target=runner.stop_in_order, daemon=True,
                         name=f'lp-{program.name}-stop').start()
        for _, executable in executables:
            context = _node_context(options, program.name, table, node_face, checkpoints,
                                    runner.request_stop, executable.name,
                                    policies.get(executable.name))
            # Threads that node code starts itself see the first node's context.
            runner.context = runner.context or context
            runner.add(executable.name, context, executable.run)
        runtime.set_process_context(runner.context)
        runner.new_context = functools.partial(
            _node_context, options, program.name, table, node_face, checkpoints,
            runner.request_stop)
        for thread in list(runner.threads.values()):
            thread.start()
        return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period)
