"""The launcher interface, the registry of launch types and `lp.launch`.

A launcher knows its platform and nothing about node internals. To add a platform, subclass
`Launcher`, declare what it accepts, implement `launch`, and register it:

    class MyLauncher(lp.Launcher):
        resource_types = (MyResources,)
        def launch(self, program, options):
            ...  # start every executable of `lp.executables_of(program, options)`
            return lp.Controller(program.name, coordinator, runner, launch_type=...)

    lp.register_launcher('my_platform', MyLauncher)
    lp.launch(program, launch_type='my_platform')

`lp.launch` validates what a launcher declares (resource types, terminals, options) before it
calls `launch`. `examples/custom_launcher.py` is a complete launcher in forty lines.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import importlib
import inspect
import logging
import signal
import sys
import threading
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union,
                    overload)

from absl import flags

import courier

from launchpad import runtime
from launchpad.context import launch_type_of
from launchpad.launch.controller import Controller, Controllers, LaunchSignals
from launchpad.nodes.base import Executable, LaunchInfo
from launchpad.observe import observer as observers
from launchpad.observe import registry
from launchpad.observe import runstore
from launchpad.observe import tensorboard
from launchpad.policy import NodePolicy
from launchpad.process import faces
from launchpad.process.stop_order import StopOrder
from launchpad.program import Program


_TEST_TYPES = ('test_mt', 'test_mp')

flags.DEFINE_string('lp_launch_type', 'local_mt',
                    'How to launch a launchpad program: local_mt, local_mp, test_mt, test_mp, ssh, '
                    'slurm, kubernetes, or any registered launch type.')


class _LaunchTypeFlag:
    """`lp.LAUNCH_TYPE.value`: the launch type from `--lp_launch_type`, even if flags were never
    parsed (a script without absl's `app.run`): then it is read from `sys.argv`."""

    @property
    def value(self) -> str:
        if _script_mode.launch_type is not None:
            return _script_mode.launch_type
        flag = flags.FLAGS['lp_launch_type']
        if flags.FLAGS.is_parsed():
            return flag.value
        return launch_type_in(sys.argv) or flag.value


def launch_type_in(argv: Sequence[str]) -> Optional[str]:
    """The value of `--lp_launch_type` on command line `argv` (program name first), read as absl
    reads it, or None if it is not there."""
    if len(argv) < 2:
        return None
    values = flags.FlagValues()
    flags.DEFINE_string('lp_launch_type', None, 'the launch type', flag_values=values)
    try:
        values(list(argv), known_only=True)
    except flags.Error as e:
        raise ValueError(f'Cannot read --lp_launch_type from the command line: {e}') from e
    return values['lp_launch_type'].value


LAUNCH_TYPE = _LaunchTypeFlag()


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
      launch_type: the launch type: an `lp.LaunchType` member, or the name of one of your own.
      resources: group label -> platform resources (e.g. `lp.PythonProcess` for local_mp).
      terminal: where node output goes (one of the launcher's `terminals`, its first by default).
      test_case: a unittest.TestCase for test launch types, or None.
      serialize_py_nodes: round-trip executables through pickling even where not needed.
      notice_period: seconds nodes get to end after a stop before they are killed.
      tls: TLS credentials for the program's traffic between hosts (TCP), or None.
      extra: launcher-specific keyword arguments given to `lp.launch`.
      settings: `extra` as the launcher's `options` dataclass, if it declares one.
      program_id: the program's id in the registry and its run directory (`lp.launch` chooses
        it before the launch, so that node logs go to the run directory: `log_dir_of`).
    """
    launch_type: str
    resources: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    terminal: Optional[str] = None
    test_case: Any = None
    serialize_py_nodes: Optional[bool] = None
    notice_period: float = 10.0
    tls: Optional[courier.TLSConfig] = None
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: Any = None
    program_id: Optional[str] = None


def log_dir_of(options: LaunchOptions) -> Optional[str]:
    """Where node output goes with terminal='output_to_files': `logs/` of the program's run
    directory (`runstore.logs_directory`); None for other terminals, or if it cannot be made
    (said in a warning: the output then goes where `Output` puts it by default)."""
    if options.terminal != 'output_to_files' or options.program_id is None:
        return None
    try:
        return str(runstore.logs_directory(options.program_id))
    except OSError as e:
        logging.warning('Node logs cannot go to the run directory of %s: %s; set %s or %s to a '
                        'directory of yours.', options.program_id, e, runstore.ENV,
                        runstore.LOGS_ENV)
        return None


class Launcher(abc.ABC):
    """A platform that can run programs.

    The class attributes declare what the platform accepts; `lp.launch` checks them once, before
    `launch` is called, so a launcher never validates them itself.

    Attributes:
      foreground: True if launched programs need this process (their coordinator runs here):
        `lp.launch` then keeps the script alive until the program ends and turns Ctrl-C into a
        stop, unless the returned controller is `detached`.
      resource_types: the types a group's resources may have (empty: anything).
      terminals: the `terminal=` values it supports, its default first (None: anything).
      options: a dataclass whose fields are its own keyword arguments of `lp.launch` (`NoOptions`
        if it has none); None accepts any and leaves them in `LaunchOptions.extra`.
      refused_options: option name -> why the launcher refuses it, though other launchers take
        it (a false value, such as `detach=False`, is accepted and dropped).
      tls_refusal: why it refuses `tls=` (None: it supports TLS).
    """

    foreground: bool = False
    resource_types: Tuple[type, ...] = ()
    terminals: Optional[Tuple[str, ...]] = None
    options: Optional[type] = None
    refused_options: Mapping[str, str] = {}
    tls_refusal: Optional[str] = None

    @abc.abstractmethod
    def launch(self, program: Program, options: LaunchOptions) -> Controller:
        """Starts every executable of `program` and returns its controller."""

    def group_resources(self, label: str, resources: Any) -> Any:
        """Group `label`'s resources as `launch` takes them: a platform turns an `lp.Resources`
        into its own type here (default: as given)."""
        del label
        return resources

    def check(self, program: Program, options: LaunchOptions) -> None:
        """Checks `options` for `program` against the declarations; fills in the terminal and
        the settings, and turns each group's resources into the launcher's (`group_resources`)."""
        launch_type = options.launch_type
        unknown_groups = set(options.resources) - set(program.groups)
        if unknown_groups:
            raise ValueError(f'Resources given for groups {sorted(unknown_groups)} that the program '
                             f'does not have; its groups are {sorted(program.groups)}.')
        if self.resource_types:
            for label, resources in options.resources.items():
                if not isinstance(resources, self.resource_types):
                    raise TypeError(f'The {launch_type} launch type takes '
                                    f'{_type_names(self.resource_types)}; group {label!r} got '
                                    f'{resources!r}.')
        options.resources = {label: self.group_resources(label, resources)
                             for label, resources in options.resources.items()}
        if self.terminals is not None:
            options.terminal = options.terminal or self.terminals[0]
            if options.terminal not in self.terminals:
                raise ValueError(f'Unknown terminal {options.terminal!r} for launch type '
                                 f'{launch_type}; it supports {", ".join(self.terminals)}.')
        if options.tls is not None and self.tls_refusal is not None:
            raise ValueError(f'tls= is not supported by the {launch_type} launcher: '
                             f'{self.tls_refusal}')
        for name, reason in self.refused_options.items():
            if options.extra.get(name):
                raise ValueError(f'{name}={options.extra[name]!r} is not supported by the '
                                 f'{launch_type} launcher: {reason}')
            options.extra.pop(name, None)
        if self.options is not None:
            known = [field.name for field in dataclasses.fields(self.options)]
            unknown = sorted(set(options.extra) - set(known))
            if unknown:
                own = f'takes {", ".join(known)}' if known else 'takes no options of its own'
                raise TypeError(f'Unknown option(s) {unknown} for launch type {launch_type}; it '
                                f'{own} (lp.launch itself takes {", ".join(_LAUNCH_KEYWORDS)}).')
            options.settings = self.options(**options.extra)


@dataclasses.dataclass
class NoOptions:
    """The `options` of a launcher that takes no keyword arguments of its own: `lp.launch`
    refuses any it is given, naming the valid ones."""


def _type_names(types: Sequence[type]) -> str:
    names = [f'lp.{t.__name__}' if t.__module__.startswith('launchpad.') else t.__name__
             for t in types]
    return names[0] if len(names) == 1 else f'{", ".join(names[:-1])} or {names[-1]}'


_registry: Dict[str, Callable[[], Launcher]] = {}


def register_launcher(launch_type: str, factory: Callable[[], Launcher]) -> None:
    """Makes `lp.launch(program, launch_type=launch_type)` use `factory()`."""
    _registry[str(launch_type)] = factory


def registered_launch_types() -> List[str]:
    """Every launch type `lp.launch` accepts, the built-in ones included."""
    load_builtin_launchers()
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


def policies_of(program: Program, executables: Sequence[Tuple[str, Executable]]
                ) -> Dict[str, NodePolicy]:
    """Executable name -> its restart policy and progress deadline (for an executable that runs
    several nodes, its first node's), for the executables that have one. Launchers give it to
    the coordinator (`Coordinator(..., policies=)`) and to the workers (`Packer(policies=)`)."""
    policies = {}
    for _, executable in executables:
        policy = program.policy_of(executable.node_names[0])
        if policy != NodePolicy():
            policies[executable.name] = policy
    return policies


def stop_order_of(program: Program, executables: Sequence[Tuple[str, Executable]],
                  notice_period: float) -> StopOrder:
    """Who calls whom among the executables, so that the program's stop reaches callers before
    what they call (`launchpad.process.stop_order`); launchers give it to the coordinator."""
    calls, group_calls = program.calls([executable.name for _, executable in executables])
    return StopOrder(calls, notice_period / 2, group_calls=group_calls)


@overload
def launch(programs: Program, launch_type: Optional[str] = None,
           local_resources: Optional[Mapping[str, Any]] = None, test_case: Any = None,
           terminal: Optional[str] = None, *, resources: Optional[Mapping[str, Any]] = None,
           serialize_py_nodes: Optional[bool] = None, notice_period: float = 10.0,
           tls: Optional[courier.TLSConfig] = None, dashboard: Union[bool, int] = False,
           tensorboard_dir: Optional[str] = None,
           **launcher_options: Any) -> Controller: ...


@overload
def launch(programs: Sequence[Program], launch_type: Optional[str] = None,
           local_resources: Optional[Mapping[str, Any]] = None, test_case: Any = None,
           terminal: Optional[str] = None, *, resources: Optional[Mapping[str, Any]] = None,
           serialize_py_nodes: Optional[bool] = None, notice_period: float = 10.0,
           tls: Optional[courier.TLSConfig] = None, dashboard: Union[bool, int] = False,
           tensorboard_dir: Optional[str] = None,
           **launcher_options: Any) -> Controllers: ...


def launch(programs: Union[Program, Sequence[Program]], launch_type=None,
           local_resources: Optional[Mapping[str, Any]] = None, test_case=None,
           terminal: Optional[str] = None, *, resources: Optional[Mapping[str, Any]] = None,
           serialize_py_nodes: Optional[bool] = None, notice_period: float = 10.0,
           tls: Optional[courier.TLSConfig] = None, dashboard: Union[bool, int] = False,
           tensorboard_dir: Optional[str] = None,
           **launcher_options) -> Union[Controller, Controllers]:
    """Launches `programs` (one program, or a sequence of them) and returns the controller.

    Args:
      programs: the program to run, or several: each is launched on its own, as if by one call
        each, and a `Controllers` list (with `wait`, `stop` and `stop_and_wait` over all of them)
        is returned. The resources of a group go to the program that has that group.
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
      dashboard: True serves the program's web dashboard on a free port of 127.0.0.1 (a port
        number: on that port; several programs each get one, on free ports only) and prints
        its URL, token included; needs
        `pip install 'launchpad-ml[dashboard]'`. It stays up after the program ends, until
        `controller.observer.close()` or the end of the process.
      tensorboard_dir: also write the program's metrics (what nodes report, their call rates,
        CPU and memory) as TensorBoard event files under `tensorboard_dir/<program id>/`
        (`launchpad.observe.tensorboard`; needs `pip install 'launchpad-ml[tensorboard]'`).
      **launcher_options: options of the launcher, e.g. `coordinator_host=` for ssh, or
        `detach=True` (local_mp, slurm, kubernetes): the program outlives this process
        (local_mp: `supervisor_grace=`, see docs/detach.md).

    Every program that runs from this process is registered for `python -m launchpad.launch
    list / status / logs / stop / dashboard` (`launchpad.observe`) until it ends.

    Local launch types (local_mt, local_mp) and foreground launchers (ssh, slurm) also keep the
    script alive until the program ends and turn Ctrl-C into a graceful stop (twice: kill). Test
    launch types return at once and register `stop` as a cleanup of `test_case`.
    """
    name = str(launch_type if launch_type is not None else LAUNCH_TYPE.value)
    several = not isinstance(programs, Program)
    with (contextlib.nullcontext() if name in _TEST_TYPES else  # Ctrl-C here ends it cleanly
          LaunchSignals(f'program {programs.name!r}' if not several else 'programs')):
        load_builtin_launchers()
        if name not in _registry:
            raise ValueError(f'Unknown launch type {name!r}; known launch types: '
                             f'{", ".join(registered_launch_types())}.')
        program_list = _programs(programs)
        dashboard_port = observers.check_dashboard_option(dashboard)
        if tensorboard_dir is not None:
            tensorboard.require()
        if dashboard_port is not None and launcher_options.get('detach'):
            raise ValueError(f'dashboard={dashboard!r} is served by the launching process, which '
                             'a detached program outlives: serve its dashboard with `python -m '
                             'launchpad.launch dashboard PROGRAM` instead.')
        if several and dashboard_port:
            raise ValueError(f'dashboard={dashboard!r} asks for one port, but several programs '
                             'are launched: pass dashboard=True, which serves each on a free '
                             'port.')
        if resources is not None and local_resources is not None:
            raise ValueError('Pass either resources= or local_resources= (they are the same), '
                             'not both.')
        resources = dict(resources if resources is not None else local_resources or {})
        _check_resources_have_a_program(resources, program_list)
    controllers = Controllers()
    for program in program_list:
        options = LaunchOptions(
            launch_type=launch_type_of(name), terminal=terminal, test_case=test_case,
            resources={label: value for label, value in resources.items()
                       if not several or label in program.groups},
            serialize_py_nodes=serialize_py_nodes, notice_period=notice_period, tls=tls,
            extra=dict(launcher_options))
        try:
            controllers.append(_launch_one(program, options, dashboard_port, tensorboard_dir))
        except KeyboardInterrupt:  # the launch was interrupted: what this call started ends
            controllers.stop()
            raise
    return controllers if several else controllers[0]


# The keyword arguments of `lp.launch` itself, named when an unknown option is refused.
_LAUNCH_KEYWORDS = [name for name, parameter in inspect.signature(launch).parameters.items()
                    if parameter.kind is not parameter.VAR_KEYWORD and name != 'programs']


def _programs(programs) -> List[Program]:
    """`programs` as a validated, non-empty list."""
    if isinstance(programs, Program):
        programs = [programs]
    elif not isinstance(programs, Sequence) or isinstance(programs, str) or not all(
            isinstance(program, Program) for program in programs):
        raise TypeError(f'lp.launch takes an lp.Program or a sequence of them, got {programs!r}.')
    if not programs:
        raise ValueError('lp.launch was given an empty sequence of programs.')
    for program in programs:
        program.validate()
    return list(programs)


def _check_resources_have_a_program(resources: Mapping[str, Any],
                                    programs: Sequence[Program]) -> None:
    if len(programs) < 2:
        return  # the launcher names the groups of the one program
    groups = {label for program in programs for label in program.groups}
    unknown = sorted(set(resources) - groups)
    if unknown:
        raise ValueError(f'Resources given for groups {unknown} that none of the programs has; '
                         f'their groups are {sorted(groups)}.')


def _launch_one(program: Program, options: LaunchOptions, dashboard_port: Optional[int],
                tensorboard_dir: Optional[str] = None) -> Controller:
    interruptible = options.launch_type not in _TEST_TYPES  # Ctrl-C aborts it cleanly
    with (LaunchSignals(f'program {program.name!r}') if interruptible
          else contextlib.nullcontext()) as signals:
        platform = _registry[str(options.launch_type)]()  # its module may load only now
        platform.check(program, options)
        options = dataclasses.replace(options, program_id=options.program_id or
                                      registry.new_id(program.name))
        foreground = interruptible and platform.foreground
        controller = platform.launch(program, options)
        if signals is not None:
            signals.started()
    program.launched = True
    controller.attach(program, options.resources)
    _launched.append(controller)
    if options.launch_type in _TEST_TYPES and options.test_case is not None:
        options.test_case.addCleanup(controller.stop)
    if foreground and not controller.detached:
        controller.handle_signals(signals)
        if not _script_mode.caller_waits:
            controller.run_until_done_at_exit()
    elif signals is not None:
        signals.restore()
        for signum in signals.pending:  # (its controller handles none): to the old handlers
            signal.raise_signal(signum)
    try:  # after the signal handlers: nodes already run, and Ctrl-C must stop them
        controller.observer = observers.observe(program, controller, dashboard_port,
                                                 tensorboard_dir, options.program_id)
    except BaseException:
        controller.stop()
        raise
    return controller


class _ScriptMode:
    """Set by `python -m launchpad.launch`: the default launch type, and who waits for programs."""
    launch_type: Optional[str] = None
    caller_waits = False


_script_mode = _ScriptMode()
_launched: List[Controller] = []


def run_as_script(launch_type: str) -> None:
    """Makes later `lp.launch` calls without a launch type use `launch_type`, and leaves waiting
    for their programs to the caller (`python -m launchpad.launch` does both)."""
    _script_mode.launch_type = launch_type
    _script_mode.caller_waits = True


def launched() -> List[Controller]:
    """The controllers of every program this process launched, in order."""
    return list(_launched)


_BUILTIN_LAUNCHERS = (
    (('local_mt', 'test_mt'), 'threads', 'ThreadLauncher'),
    (('local_mp', 'test_mp'), 'processes', 'ProcessLauncher'),
    (('ssh',), 'ssh', 'SshLauncher'),
    (('slurm',), 'slurm', 'SlurmLauncher'),
    (('kubernetes',), 'kubernetes', 'KubernetesLauncher'),
)


def load_builtin_launchers() -> None:
    """Registers the launchers shipped with launchpad (each module is imported when first used)."""
    if 'local_mt' in _registry:
        return
    for launch_types, module, name in _BUILTIN_LAUNCHERS:
        for launch_type in launch_types:
            register_launcher(launch_type, functools.partial(_builtin, module, name))


def _builtin(module: str, name: str) -> Launcher:
    return getattr(importlib.import_module(f'launchpad.launch.{module}'), name)()


def launcher_context(program_name: str, options: LaunchOptions, table, coordinator,
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
