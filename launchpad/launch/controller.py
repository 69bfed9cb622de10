"""The controller of a launched program, and the two small protocols a platform implements for it.

A launcher starts a program's executables and hands the controller a `Runner` (its view of what it
started); the controller watches the runner and the coordinator, ends stragglers after the notice
period, and serves the user's `wait`, `stop` and `status`. Runners of processes usually keep one
`NodeProcess` per executable (`ProcessRunner`).
"""
from __future__ import annotations

import atexit
import concurrent.futures.thread  # pylint: disable=unused-import (see run_until_done_at_exit)
import logging
import os
import signal
import sys
import threading
import time
from typing import Dict, Optional, Protocol, Sequence

from launchpad.process.coordinator import Coordinator, NodeStatus


class NodeProcess(Protocol):
    """Something that runs one executable and can be polled and killed like `subprocess.Popen`."""

    def poll(self) -> Optional[int]:
        """The exit code once it ended (negative: killed by that signal), else None."""

    def kill(self) -> None:
        """Ends it at once, with whatever it started."""


class Runner(Protocol):
    """The platform side of a controller: the executables it started."""

    def poll(self) -> Dict[str, Optional[int]]:
        """Executable name -> exit code, or None while it runs."""

    def kill(self, names: Sequence[str]) -> None:
        """Ends the named executables at once."""

    def release(self) -> None:
        """Frees what the launch holds (temporary directories, servers); called once at the end."""


class ProcessRunner:
    """A `Runner` over one `NodeProcess` per executable; subclasses add what `release` frees."""

    def __init__(self):
        self.processes: Dict[str, NodeProcess] = {}

    def poll(self) -> Dict[str, Optional[int]]:
        return {name: process.poll() for name, process in self.processes.items()}

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            self.processes[name].kill()

    def release(self) -> None:
        pass


class Controller:
    """A launched program: wait for it to end, stop it, and see how each node is doing.

    Attributes:
      program_name: the program's name.
      launch_type: how it was launched.
      detached: True if the program runs on its own, without this process (e.g. a Slurm job or
        Kubernetes objects launched with detach=True): `lp.launch` then returns at once and does
        not keep the script alive.
      observer: what `lp.launch` made to let others see the program (its registry entry and
        dashboard: a `launchpad.observe.observer.Observer`), or None.
    """

    def __init__(self, program_name: str, coordinator: Coordinator, runner: Runner, *,
                 launch_type: str, notice_period: float = 10.0, poll_interval: float = 0.05,
                 detached: bool = False):
        self.program_name = program_name
        self.launch_type = launch_type
        self.detached = detached
        self.observer = None
        self._coordinator = coordinator
        self._runner = runner
        self._notice_period = notice_period
        self._poll_interval = poll_interval
        self._kill_now = threading.Event()
        self._done = threading.Event()
        self._failure_reported = False
        self._monitor = threading.Thread(target=self._monitor_loop, name=f'lp-{program_name}',
                                         daemon=True)
        self._monitor.start()

    def wait(self, labels: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> bool:
        """Blocks until the program (or the nodes of groups `labels`) ends.

        Returns False if `timeout` seconds passed first. Raises NodeFailedError naming the node if a
        node failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        names = None
        if labels is not None:
            wanted = [labels] if isinstance(labels, str) else list(labels)
            names = [name for name in self._coordinator.status()
                     if any(name.startswith(label + '/') for label in wanted)]
        while True:
            if names is None:
                ended = self._done.is_set()
            else:
                ended = (not self._coordinator.running(names)) or self._done.is_set()
            failure = self._coordinator.failure
            if failure is not None and (ended or self._done.is_set()):
                self._failure_reported = True
                raise failure
            if ended:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._coordinator.wait_for_change(0.1 if deadline is None
                                              else min(0.1, max(0.0, deadline - time.monotonic())))

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the program: nodes get the stop signal and the notice period, then are killed.

        Blocks until every node has ended (or `timeout` passes). A node failure is not raised here;
        `wait()` raises it.
        """
        self._coordinator.request_stop('stopped by the launcher')
        self._done.wait(timeout)

    def kill(self) -> None:
        """Ends every node at once, without a notice period."""
        self._coordinator.request_stop('killed by the launcher')
        self._kill_now.set()
        self._done.wait()

    def status(self) -> Dict[str, NodeStatus]:
        """Node name -> its status."""
        return self._coordinator.status()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def coordinator(self) -> Coordinator:
        """The program's coordinator: node states and what nodes reported."""
        return self._coordinator

    @property
    def output(self):
        """Where node output goes (a `launchpad.process.output.Output` with `read_log`), if the
        platform handles it in this process; else None."""
        return getattr(self._runner, 'output', None)

    def _monitor_loop(self) -> None:
        try:
            while True:
                running = []
                for name, code in self._runner.poll().items():
                    if code is None:
                        running.append(name)
                    else:
                        self._coordinator.executable_exited(name, code)
                if not running:
                    break
                stop_time = self._coordinator.stop_time
                if self._kill_now.is_set() or (
                        stop_time is not None
                        and time.monotonic() - stop_time > self._notice_period):
                    if stop_time is not None and not self._kill_now.is_set():
                        logging.warning('Killing %s: still running %g s after the stop.',
                                        ', '.join(running), self._notice_period)
                    self._runner.kill(running)
                    self._coordinator.mark_killed(running)
                    break
                self._coordinator.wait_for_change(self._poll_interval)
        except Exception:  # pylint: disable=broad-except
            logging.exception('The controller of %s failed; killing the program.', self.program_name)
            self._runner.kill([name for name, code in self._runner.poll().items() if code is None])
        finally:
            try:
                self._runner.release()
            finally:
                if self.observer is not None:  # it unregisters the program before wait returns
                    self.observer.program_ended()
                self._done.set()

    # A program launched in the foreground runs to the end when the script ends, and handles
    # Ctrl-C / SIGTERM; `lp.launch` calls these.

    def run_until_done_at_exit(self) -> None:
        """Makes the interpreter wait at exit until the program ends, like a foreground program.

        The wait runs in the main thread at the start of interpreter shutdown, before
        concurrent.futures stops its executors (which servers in this process still need): hooks
        registered with threading's exit hook run newest first, and ours is newer.
        """
        def wait_at_exit():
            while not self._done.wait(0.1):  # short waits let signal handlers run
                pass
            failure = self._coordinator.failure
            if failure is not None and not self._failure_reported:
                self._failure_reported = True
                print(f'\n{failure}', file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(1)  # pylint: disable=protected-access

        register = getattr(threading, '_register_atexit', None) or atexit.register
        register(wait_at_exit)

    def handle_signals(self) -> None:
        """First Ctrl-C or SIGTERM stops gracefully, the second kills; only from the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        received = []

        def handler(signum, frame):
            del frame
            received.append(signum)
            if len(received) == 1:
                print(f'\nStopping program {self.program_name!r} (notice period '
                      f'{self._notice_period:g} s); press Ctrl-C again to kill it now.',
                      file=sys.stderr, flush=True)
                self._coordinator.request_stop(f'{signal.Signals(signum).name} in the launcher')
            else:
                self._kill_now.set()
                self._coordinator.request_stop('killed from the launcher')

        for sig in previous:
            signal.signal(sig, handler)

        def restore():
            self._done.wait()
            try:
                for sig, old in previous.items():
                    if signal.getsignal(sig) is handler:
                        signal.signal(sig, old)
            except ValueError:  # signal.signal only works in the main thread
                pass

        threading.Thread(target=restore, daemon=True).start()
