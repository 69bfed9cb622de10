"""The controller of a launched program.

A launcher starts a program's executables and hands the controller a `Runner` (its view of what it
started, and what the platform can do with them: `launchpad.launch.runner`); the controller
watches the runner and the coordinator's control face (`launchpad.process.faces`), starts again
the nodes that the coordinator marked restarting (their restart policy allows it), ends
stragglers after the notice period, and serves the user's `wait`, `stop` and `status`.
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
from typing import Any, Callable, Dict, List, Optional, Sequence

from launchpad.launch.elastic import Elasticity
from launchpad.launch.runner import Runner
from launchpad.nodes.base import Handle, Node
from launchpad.process.states import NodeStatus
from launchpad.process.faces import ControlFace
from launchpad.scaling import Decision


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
      auth_token: the courier auth token the program's nodes require of every call (what
        `python -m launchpad.launch token` prints), or None when they require none or the
        launcher does not know it.
    """

    def __init__(self, program_name: str, coordinator: ControlFace, runner: Runner, *,
                 launch_type: str, notice_period: float = 10.0, poll_interval: float = 0.05,
                 detached: bool = False, auth_token: Optional[str] = None):
        LaunchSignals.program_started()  # a signal from now on stops the program, not the launch
        self.program_name = program_name
        self.launch_type = launch_type
        self.detached = detached
        self.auth_token = auth_token
        self._observer = None
        self._observer_lock = threading.Lock()
        self._ended = False  # the monitor is done with the program (under _observer_lock)
        self._coordinator = coordinator
        self._runner = runner
        self._notice_period = notice_period
        self._poll_interval = poll_interval
        self._kill_now = threading.Event()
        self._done = threading.Event()
        self._failure_reported = False
        self._restore_signals: Optional[Callable[[], None]] = None  # see handle_signals
        self._elastic = Elasticity(coordinator, runner, launch_type, notice_period)
        self._monitor = threading.Thread(target=self._monitor_loop, name=f'lp-{program_name}',
                                         daemon=True)
        self._monitor.start()

    def wait(self, labels: Optional[Sequence[str]] = None, timeout: Optional[float] = None, *,
             labels_to_wait_for: Optional[Sequence[str]] = None, raise_error: bool = True,
             return_on_first_completed: bool = False) -> bool:
        """Blocks until the program (or the nodes of groups `labels`) ends.

        Args:
          labels: group labels whose nodes to wait for (default: every node).
          timeout: seconds to wait at most.
          labels_to_wait_for: dm-launchpad's name for `labels`.
          raise_error: raise NodeFailedError naming the node if a node failed (else only wait).
          return_on_first_completed: return as soon as one of the awaited nodes has ended.

        Returns False if `timeout` seconds passed first, else True.
        """
        if labels is not None and labels_to_wait_for is not None:
            raise TypeError('Pass the groups to wait for as labels= or labels_to_wait_for= (they '
                            'are the same), not both.')
        labels = labels if labels is not None else labels_to_wait_for
        deadline = None if timeout is None else time.monotonic() + timeout
        names = None
        if labels is not None:
            wanted = [labels] if isinstance(labels, str) else list(labels)
            names = [name for name in self._coordinator.status()
                     if any(name.startswith(label + '/') for label in wanted)]
        awaited = list(self._coordinator.status()) if names is None else names
        counts_running = names is not None or return_on_first_completed
        while True:
            running = self._coordinator.running(awaited) if counts_running else None
            if names is not None and not running:
                ended = True
            elif return_on_first_completed:
                ended = len(running) < len(awaited) or self._done.is_set()
            else:
                ended = self._done.is_set()
            failure = self._coordinator.failure
            if ended or self._done.is_set():
                self._restore_signals_if_done()
            if raise_error and failure is not None and (ended or self._done.is_set()):
                self._failure_reported = True
                raise failure
            if ended:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            wait = 0.1 if deadline is None else min(0.1, max(0.0, deadline - time.monotonic()))
            if counts_running:
                self._coordinator.wait_for_change(wait)
            else:  # only the program's end counts: return the moment the monitor is done
                self._done.wait(wait)

    def stop_and_wait(self) -> None:
        """Stops the program and waits until every node has ended; a node failure is not raised."""
        self.stop()
        self.wait(raise_error=False)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the program: nodes get the stop signal and the notice period, then are killed.

        Blocks until every node has ended (or `timeout` passes). A node failure is not raised here;
        `wait()` raises it.
        """
        self._coordinator.request_stop('stopped by the launcher')
        self._done.wait(timeout)
        self._restore_signals_if_done()

    def kill(self) -> None:
        """Ends every node at once, without a notice period."""
        self._coordinator.request_stop('killed by the launcher')
        self._kill_now.set()
        self._done.wait()
        self._restore_signals_if_done()

    def status(self) -> Dict[str, NodeStatus]:
        """Node name -> its status."""
        return self._coordinator.status()

    @property
    def observer(self):
        """What lets others see the program (see the class docstring), or None."""
        return self._observer

    @observer.setter
    def observer(self, observer) -> None:
        with self._observer_lock:
            self._observer = observer
            ended = self._ended
        if ended and observer is not None:  # it ended while the observer was being made
            observer.program_ended()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def coordinator(self) -> ControlFace:
        """The program's coordinator (its control face): node states and what nodes reported."""
        return self._coordinator

    @property
    def output(self):
        """Where node output goes (a `launchpad.process.output.Output` with `read_log`), if the
        platform handles it in this process; else None."""
        return self._runner.output

    # Elastic programs: nodes join and leave while it runs (`launchpad.launch.elastic`).

    def attach(self, program, resources: Dict[str, Any]) -> None:
        """Gives the controller the program it runs (`lp.launch` does), so that nodes can be
        added to it and removed from it."""
        self._elastic.attach(program, resources)
        program.controller = self

    def add_node(self, node: Node, label: Optional[str] = None) -> Handle:
        """Adds `node` to group `label` of the running program and starts it; returns its handle
        (for nodes added later). It gets handles of the nodes already running."""
        return self._elastic.add_node(node, label)

    def remove_node(self, name: str) -> None:
        """Removes node `name` ('group/index'): its stop handlers run, it gets the notice period
        and is then killed; it ends as `removed`, and calls to it fail with `lp.NodeLeftError`."""
        self._elastic.remove_node(name)

    def resize(self, label: str, size: int) -> None:
        """Grows group `label` to `size` nodes (made by its `lp.Elastic(make_node=...)`) or
        shrinks it, removing the newest nodes first."""
        self._elastic.resize(label, size)

    def group_size(self, label: str) -> int:
        """How many nodes of group `label` run or start (not ended, not leaving)."""
        return self._elastic.size(label)

    @property
    def scaling_log(self) -> List[Decision]:
        """The decisions of the program's scaling policy so far, oldest first."""
        return self._elastic.scaling_log

    @property
    def scale_up_times(self) -> List[float]:
        """Seconds from each added node's request to its start (it reported running)."""
        return list(self._elastic.scale_up_times)

    def _monitor_loop(self) -> None:
        try:
            while True:
                self._elastic.tick()
                running = []
                for name, code in self._runner.poll().items():
                    if code is None:
                        running.append(name)
                    else:
                        self._coordinator.executable_exited(
                            name, code, lambda name=name: self._runner.last_output(name))
                running += self._restart_due()
                if not running and not self._coordinator.restarts_pending:
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
            self._elastic.close(self._coordinator.stop_reason or 'every node ended')
            with self._observer_lock:
                self._ended = True
                observer = self._observer
            # The observer's last sample (it unregisters the program before wait returns) needs
            # only the ended nodes' states: it is written while the runner lets go of the rest.
            last_sample = None
            if observer is not None:
                last_sample = threading.Thread(target=observer.program_ended, daemon=True,
                                               name=f'lp-{self.program_name}-ended')
                last_sample.start()
            try:
                self._runner.release()
            finally:
                if last_sample is not None:
                    last_sample.join()
                self._done.set()

    def _restart_due(self) -> List[str]:
        """Starts again the nodes whose restart is due, and returns them (they run now, though
        the poll before did not see them); a node that cannot be restarted fails."""
        restarted = []
        for name in self._coordinator.due_restarts(time.monotonic()):
            try:
                self._runner.restart(name)
            except NotImplementedError:
                self._coordinator.restart_failed(
                    name, f'the {self.launch_type} launcher cannot restart nodes')
            except Exception as e:  # pylint: disable=broad-except
                logging.exception('Could not restart %s.', name)
                self._coordinator.restart_failed(name, f'{type(e).__name__}: {e}')
            else:
                self._coordinator.node_restarted(name)
                restarted.append(name)
        return restarted

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

    def handle_signals(self, launching: Optional['LaunchSignals'] = None) -> None:
        """First Ctrl-C or SIGTERM stops gracefully, the second kills; only from the main thread.

        `launching` holds the handlers that were in place before the launch, and the signals
        that arrived after the program started but before this took over.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        previous = (launching.previous if launching is not None else
                    {sig: signal.getsignal(sig) for sig in LaunchSignals.SIGNALS})
        received = []

        def restore():  # signal.signal works only in the main thread, where handlers also run
            for sig, old in previous.items():
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, old)

        def handler(signum, frame):
            if self._done.is_set():  # it ended before the main thread came back to restore
                restore()
                old = previous[signum]
                if callable(old):
                    old(signum, frame)
                elif old == signal.SIG_DFL:
                    signal.raise_signal(signum)
                return
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
        self._restore_signals = restore
        for signum in (launching.pending if launching is not None else ()):
            handler(signum, None)

    def _restore_signals_if_done(self) -> None:
        """Puts back the handlers handle_signals replaced, once the program ended (main thread)."""
        if (self._done.is_set() and self._restore_signals is not None
                and threading.current_thread() is threading.main_thread()):
            self._restore_signals()
            self._restore_signals = None


class LaunchSignals:
    """Ctrl-C and SIGTERM while a program launches (a context manager).

    Until the program has started (its launcher makes its `Controller`, which calls
    `program_started`) they abort the launch as KeyboardInterrupt, so that the launcher undoes
    what it started (`_interruption`); after that they are kept for the controller
    (`Controller.handle_signals`), which takes over the handlers without a moment in which a
    signal would kill the process. Outside the main thread it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    _current: Optional['LaunchSignals'] = None  # the launch in progress in the main thread

    def __init__(self, what: str = 'the program'):
        self.previous: Dict[int, Any] = {}
        self.pending: List[int] = []
        self._launching = True
        self._what = what  # what is launched, for messages: "program 'x'"

    def __enter__(self) -> 'LaunchSignals':
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
            for sig in self.SIGNALS:
                signal.signal(sig, self._handle)
            LaunchSignals._current = self
        return self

    @classmethod
    def program_started(cls) -> None:
        """The program of the launch in progress runs: signals are now for its controller."""
        current = cls._current
        if current is not None and threading.current_thread() is threading.main_thread():
            current.started()

    def started(self) -> None:
        """The program runs: signals from now on are for its controller."""
        self._launching = False

    def restore(self) -> None:
        """Puts back the handlers that were there before (when no controller takes over)."""
        for sig, old in self.previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, old)

    def __exit__(self, *exc_info) -> None:
        if LaunchSignals._current is self:
            LaunchSignals._current = None
        if self._launching:
            self.restore()

    def _handle(self, signum, frame) -> None:
        del frame
        if self._launching:
            raise _interruption(signum, self._what)
        self.pending.append(signum)


def _interruption(signum: int, what: str) -> KeyboardInterrupt:
    """The KeyboardInterrupt that aborts the launch of `what` ("program 'x'") on signal `signum`.

    Launchers undo what they started when it passes through them. If nothing catches it, the
    script ends as on Ctrl-C, with one line saying what happened instead of a traceback of
    launchpad's internals (that line is all a user needs: the launch was undone).
    """
    name = signal.Signals(signum).name
    error = KeyboardInterrupt(f'{name} while launching {what}')
    error.launch_summary = (f'\nLaunch of {what} interrupted by {name}; what it had started '
                            f'was ended.')
    if not getattr(sys.excepthook, 'shows_launch_summaries', False):
        sys.excepthook = _summarizing_hook(sys.excepthook)
    return error


def _summarizing_hook(previous: Callable[..., Any]) -> Callable[..., Any]:
    """`sys.excepthook` that prints an aborted launch's summary instead of its traceback (and
    leaves every other exception to `previous`)."""

    def hook(kind, value, trace):
        summary = getattr(value, 'launch_summary', None)
        if summary is None:
            previous(kind, value, trace)
        else:
            print(summary, file=sys.stderr, flush=True)

    hook.shows_launch_summaries = True
    return hook


class Controllers(List[Controller]):
    """The controllers of several programs launched together (`lp.launch([a, b])`), in order,
    with `wait`, `stop` and `stop_and_wait` acting on all of them."""

    def wait(self, labels: Optional[Sequence[str]] = None, timeout: Optional[float] = None,
             **kwargs) -> bool:
        """`Controller.wait` on each program in turn, `timeout` seconds in all; False if it
        passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for controller in self:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not controller.wait(labels, left, **kwargs):
                return False
        return True

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops every program (each gets `timeout` seconds)."""
        for controller in self:
            controller.stop(timeout)

    def stop_and_wait(self) -> None:
        """Stops every program and waits until all their nodes have ended."""
        for controller in self:
            controller.stop_and_wait()
