"""The launcher interface, the registry of launch types, `lp.launch`, and the program controller.

A launcher knows its platform and nothing about node internals. To add a platform, subclass
`Launcher`, implement `launch`, and register it:

    class MyLauncher(lp.Launcher):
        def launch(self, program, options):
            ...  # start every executable of `lp.executables_of(program, options)`
            return lp.Controller(program_name, coordinator, runner)

    lp.register_launcher('my_platform', MyLauncher)
    lp.launch(program, launch_type='my_platform')

`examples/custom_launcher.py` is a complete one in forty lines.
"""
from __future__ import annotations

import abc
import atexit
import concurrent.futures.thread  # pylint: disable=unused-import (see _run_until_done_at_exit)
import dataclasses
import enum
import functools
import importlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from absl import flags

import courier

from launchpad.launch.coordinator import Coordinator, NodeStatus
from launchpad.nodes.base import Executable, LaunchInfo
from launchpad.program import Program


class LaunchType(str, enum.Enum):
    """The built-in launch types; `lp.launch` also accepts any registered name."""
    LOCAL_MULTI_THREADING = 'local_mt'
    LOCAL_MULTI_PROCESSING = 'local_mp'
    TEST_MULTI_THREADING = 'test_mt'
    TEST_MULTI_PROCESSING = 'test_mp'
    SSH = 'ssh'
    SLURM = 'slurm'
    KUBERNETES = 'kubernetes'

    def __str__(self) -> str:
        return self.value


_LOCAL_TYPES = ('local_mt', 'local_mp')
_TEST_TYPES = ('test_mt', 'test_mp')

flags.DEFINE_string('lp_launch_type', 'local_mt',
                    'How to launch a launchpad program: local_mt, local_mp, test_mt, test_mp, ssh, '
                    'slurm, kubernetes, or any registered launch type.')
_override_launch_type: Optional[str] = None  # set by `python -m launchpad.launch --type=...`


class _LaunchTypeFlag:
    """`lp.LAUNCH_TYPE.value`: the launch type from `--lp_launch_type`, even if flags were never parsed."""

    @property
    def value(self) -> str:
        if _override_launch_type is not None:
            return _override_launch_type
        return flags.FLAGS['lp_launch_type'].value


LAUNCH_TYPE = _LaunchTypeFlag()


def is_local_launch(launch_type) -> bool:
    """True for launch types that run on this machine for real (local_mt, local_mp)."""
    return str(launch_type) in _LOCAL_TYPES


def is_local_launch_or_test(launch_type) -> bool:
    """True for local and test launch types."""
    return str(launch_type) in _LOCAL_TYPES + _TEST_TYPES


def make_program_stopper(launch_type) -> Callable[[], None]:
    """A function that stops the running program (dm-launchpad compatibility)."""
    del launch_type  # every launch type stops the same way

    def stop_program():
        from launchpad import runtime  # pylint: disable=import-outside-toplevel
        runtime.stop()

    return stop_program


@dataclasses.dataclass
class LaunchOptions:
    """What `lp.launch` passes to a launcher.

    Attributes:
      launch_type: the launch type name.
      resources: group label -> platform resources (e.g. `lp.PythonProcess` for local_mp).
      terminal: where node output goes (launcher-specific names, e.g. 'current_terminal').
      test_case: a unittest.TestCase for test launch types, or None.
      serialize_py_nodes: round-trip executables through pickling even where not needed.
      notice_period: seconds nodes get to end after a stop before they are killed.
      tls: TLS credentials for the program's traffic between hosts (TCP), or None.
      extra: launcher-specific keyword arguments given to `lp.launch`.
    """
    launch_type: str
    resources: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    terminal: Optional[str] = None
    test_case: Any = None
    serialize_py_nodes: Optional[bool] = None
    notice_period: float = 10.0
    tls: Optional[courier.TLSConfig] = None
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)


class Launcher(abc.ABC):
    """A platform that can run programs.

    Attributes:
      foreground: True if launched programs need this process (their coordinator runs here):
        `lp.launch` then keeps the script alive until the program ends and turns Ctrl-C into a
        stop, as for the local launch types.
    """

    foreground: bool = False

    @abc.abstractmethod
    def launch(self, program: Program, options: LaunchOptions) -> 'Controller':
        """Starts every executable of `program` and returns its controller."""


_registry: Dict[str, Callable[[], Launcher]] = {}


def register_launcher(launch_type: str, factory: Callable[[], Launcher]) -> None:
    """Makes `lp.launch(program, launch_type=launch_type)` use `factory()`."""
    _registry[str(launch_type)] = factory


def registered_launch_types() -> List[str]:
    return sorted(_registry)


def executables_of(program: Program, options: LaunchOptions) -> List[Tuple[str, Executable]]:
    """(group label, executable) for every node of `program`, asking each node type in each group."""
    result = []
    for label, nodes in program.groups.items():
        info = LaunchInfo(options.launch_type, options.resources.get(label))
        by_type: Dict[type, list] = {}
        for node in nodes:
            by_type.setdefault(type(node), []).append(node)
        for same_type in by_type.values():
            for executable in same_type[0].to_executables(same_type, label, info):
                result.append((label, executable))
    return result


class Runner(Protocol):
    """The platform side of a controller: the executables it started."""

    def poll(self) -> Dict[str, Optional[int]]:
        """Executable name -> exit code, or None while it runs."""

    def kill(self, names: Sequence[str]) -> None:
        """Ends the named executables at once."""

    def release(self) -> None:
        """Frees what the launch holds (temporary directories, servers); called once at the end."""


class Controller:
    """A launched program: wait for it to end, stop it, and see how each node is doing."""

    def __init__(self, program_name: str, coordinator: Coordinator, runner: Runner, *,
                 launch_type: str, notice_period: float = 10.0, poll_interval: float = 0.05):
        self.program_name = program_name
        self.launch_type = launch_type
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
                self._done.set()

    # Local launches run to the end when the script ends, and handle Ctrl-C / SIGTERM.

    def _run_until_done_at_exit(self) -> None:
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

    def _handle_signals(self) -> None:
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


def launch(program: Program, launch_type=None, local_resources: Optional[Mapping[str, Any]] = None,
           test_case=None, terminal: Optional[str] = None, *,
           resources: Optional[Mapping[str, Any]] = None,
           serialize_py_nodes: Optional[bool] = None, notice_period: float = 10.0,
           tls: Optional[courier.TLSConfig] = None, **launcher_options) -> Controller:
    """Launches `program` and returns its controller.

    Args:
      program: the program to run.
      launch_type: a `lp.LaunchType` or registered name; default `--lp_launch_type` ('local_mt').
      local_resources: group label -> platform resources (`lp.PythonProcess` for local_mp, ...).
      resources: the same as `local_resources`, the name used for remote platforms.
      test_case: for test_mt / test_mp, the unittest.TestCase whose cleanup stops the program.
      terminal: where node output goes: 'current_terminal' (default), 'output_to_files',
        'tmux_session' (process launchers).
      serialize_py_nodes: pickle and unpickle node arguments even for threads, so that nodes cannot
        share mutable objects and unpicklable arguments fail at launch.
      notice_period: seconds nodes get to end after a stop before they are killed.
      tls: a `courier.TLSConfig` for traffic between hosts: node servers and the coordinator
        present its certificate, clients verify peers with its root certificates (and present its
        certificate too when it has one, which makes TLS mutual). Same-host Unix sockets, which
        only this user can open, need none.
      **launcher_options: options of the launcher, e.g. `coordinator_host=` for ssh.

    Local launch types (local_mt, local_mp) and foreground launchers (ssh, slurm) also keep the
    script alive until the program ends and turn Ctrl-C into a graceful stop (twice: kill). Test
    launch types return at once and register `stop` as a cleanup of `test_case`.
    """
    launch_type = str(launch_type if launch_type is not None else LAUNCH_TYPE.value)
    _load_builtin_launchers()
    if launch_type not in _registry:
        raise ValueError(f'Unknown launch type {launch_type!r}; known launch types: '
                         f'{", ".join(registered_launch_types())}.')
    program.validate()
    if resources is not None and local_resources is not None:
        raise ValueError('Pass either resources= or local_resources= (they are the same), not both.')
    resources = resources if resources is not None else local_resources
    options = LaunchOptions(launch_type=launch_type, resources=dict(resources or {}),
                            terminal=terminal, test_case=test_case,
                            serialize_py_nodes=serialize_py_nodes, notice_period=notice_period,
                            tls=tls, extra=launcher_options)
    unknown_groups = set(options.resources) - set(program.groups)
    if unknown_groups:
        raise ValueError(f'Resources given for groups {sorted(unknown_groups)} that the program does '
                         f'not have; its groups are {sorted(program.groups)}.')
    platform = _registry[launch_type]()
    controller = platform.launch(program, options)
    _launched.append(controller)
    if launch_type in _TEST_TYPES and test_case is not None:
        test_case.addCleanup(controller.stop)
    if launch_type not in _TEST_TYPES and getattr(platform, 'foreground', False):
        controller._handle_signals()  # pylint: disable=protected-access
        if not _cli_waits:
            controller._run_until_done_at_exit()  # pylint: disable=protected-access
    return controller


_launched: List[Controller] = []
_cli_waits = False  # `python -m launchpad.launch` waits for controllers itself


def _load_builtin_launchers() -> None:
    """Registers the launchers shipped with launchpad (each module is imported when first used)."""
    if 'local_mt' in _registry:
        return
    for launch_types, module, name in [
            (('local_mt', 'test_mt'), 'threads', 'ThreadLauncher'),
            (('local_mp', 'test_mp'), 'processes', 'ProcessLauncher'),
            (('ssh',), 'ssh', 'SshLauncher'),
            (('slurm',), 'slurm', 'SlurmLauncher'),
            (('kubernetes',), 'kubernetes', 'KubernetesLauncher')]:
        for launch_type in launch_types:
            register_launcher(launch_type, functools.partial(_builtin, module, name))


def _builtin(module: str, name: str) -> Launcher:
    return getattr(importlib.import_module(f'launchpad.launch.{module}'), name)()
