"""The process entry point of every process-based launcher.

Start it as `[python] + WORKER_ARGV + [spec_file]`. A launcher writes a `WorkerSpec` (the executable, the address table, how to reach the coordinator)
with `write_spec`, ships the file to where the process runs, and starts this module on it. The worker
installs the node's context, watches the coordinator for the stop signal (and for the launcher going
away), runs the executable and reports how it ended.
"""
from __future__ import annotations

import copyreg
import dataclasses
import functools
import logging
import os
import pickle
import shutil
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

from launchpad import runtime
from launchpad.address import AddressTable

# How long a worker keeps running without reaching the coordinator before it decides the launcher is
# gone and stops itself.
COORDINATOR_LOSS_TIMEOUT = 5.0
_POLL = 1.0

# Interpreter arguments that run a worker (`-c` rather than `-m` because the package imports this
# module before runpy would run it as __main__).
WORKER_ARGV = ['-c', 'from launchpad.launch.worker import main; main()']


class NodePicklingError(pickle.PicklingError):
    """An executable could not be packed for another process."""


@dataclasses.dataclass
class WorkerSpec:
    """Everything a worker process needs to run one executable.

    Attributes:
      program_name, launch_type, node_name: identify the executable ('group/index' node name).
      run: the executable's callable.
      address_table: the program's address table (its registry is filled in by the worker).
      coordinator_address: the courier address of the program's coordinator.
      parent_pid: the launcher's pid when the worker is its direct child; the worker stops if its
        parent changes (the launcher died).
      notice_period: seconds to end after a stop before the worker exits by itself.
      flags: absl flags of the launching process (see `flags_snapshot`), so node code reads them.
      flag_overrides: flag values for this process ('--name=value' strings).
      env: environment variables to set before anything is unpickled.
      cleanup_dir: a directory of the launch that the worker removes if the launcher dies, since
        the launcher cannot.
      tls: the program's TLS credentials (a courier.TLSConfig) for TCP traffic, or None.
    """
    program_name: str
    launch_type: str
    node_name: str
    run: Callable[[], None]
    address_table: AddressTable
    coordinator_address: str
    parent_pid: Optional[int] = None
    notice_period: float = 10.0
    flags: Dict[str, Any] = dataclasses.field(default_factory=dict)
    flag_overrides: List[str] = dataclasses.field(default_factory=list)
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    cleanup_dir: Optional[str] = None
    tls: Any = None


def pickle_node(node_name: str, value: Any) -> bytes:
    """cloudpickle of `value`, or a NodePicklingError naming the node and what cannot be pickled."""
    import cloudpickle  # pylint: disable=import-outside-toplevel
    _pickle_flags_by_reference()
    try:
        return cloudpickle.dumps(value)
    except Exception as e:  # pylint: disable=broad-except
        raise NodePicklingError(
            f'Cannot send node {node_name} to where it runs: its arguments cannot be pickled '
            f'({type(e).__name__}: {e}). Pass picklable arguments (build objects such as locks, '
            f'sockets or open files inside the node instead).') from e


def pack_spec(spec: WorkerSpec) -> bytes:
    """The bytes of a spec file, or a NodePicklingError naming the node and what cannot be pickled."""
    payload = pickle_node(spec.node_name, spec)
    header = {'sys_path': [p for p in sys.path if p], 'env': spec.env}
    return pickle.dumps((header, payload), protocol=pickle.HIGHEST_PROTOCOL)


def write_spec(spec: WorkerSpec, path: str) -> None:
    data = pack_spec(spec)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'wb') as f:
        f.write(data)


def _global_flags():
    from absl import flags  # pylint: disable=import-outside-toplevel
    return flags.FLAGS


def _reduce_flag_values(flag_values):
    from absl import flags  # pylint: disable=import-outside-toplevel
    if flag_values is not flags.FLAGS:
        raise pickle.PicklingError('Only absl.flags.FLAGS can be sent to a node process.')
    return _global_flags, ()


def _pickle_flags_by_reference() -> None:
    """Node code that reads `FLAGS` gets the FLAGS of its own process, which the worker fills in."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    copyreg.pickle(flags.FlagValues, _reduce_flag_values)


def flags_snapshot() -> Dict[str, Any]:
    """The launching process's parsed absl flags (name -> (class, state)), to rebuild in a worker.

    absl refuses to pickle Flag objects, so their state travels instead (validators stay behind:
    values were validated here).
    """
    from absl import flags  # pylint: disable=import-outside-toplevel
    if not flags.FLAGS.is_parsed():
        return {}
    import cloudpickle  # pylint: disable=import-outside-toplevel
    _pickle_flags_by_reference()
    shipped = {}
    for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        if flag.name != name:  # a short name
            continue
        state = (type(flag), {k: v for k, v in vars(flag).items() if k != 'validators'})
        try:
            cloudpickle.dumps(state)
        except Exception:  # pylint: disable=broad-except
            if flag.present:
                logging.warning('Flag --%s cannot be sent to node processes; they see its default.',
                                name)
            continue
        shipped[name] = state
    return shipped


def run_reporting(run: Callable[[], None], name: str, coordinator, *, starting=None) -> int:
    """Runs an executable, reporting to the coordinator how it ended; returns an exit code.

    `starting` (default: `coordinator`) reports the start; a worker passes a client that waits for
    a busy coordinator there, and reports the end through one that fails at once when it is gone.
    """
    (starting or coordinator).node_started(name, os.getpid(), socket.gethostname())
    try:
        run()
    except SystemExit as e:
        if e.code not in (None, 0):
            coordinator.node_failed(name, f'SystemExit({e.code!r})', traceback.format_exc())
            return 1
    except BaseException as e:  # pylint: disable=broad-except
        traceback.print_exc()
        coordinator.node_failed(name, f'{type(e).__name__}: {e}', traceback.format_exc())
        return 1
    coordinator.node_finished(name)
    return 0


def _load(path: str) -> WorkerSpec:
    with open(path, 'rb') as f:
        header, payload = pickle.load(f)
    os.environ.update(header['env'])
    for entry in reversed(header['sys_path']):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    import cloudpickle  # pylint: disable=import-outside-toplevel
    return cloudpickle.loads(payload)


def _install_flags(spec: WorkerSpec) -> None:
    from absl import flags  # pylint: disable=import-outside-toplevel
    for name, (flag_class, state) in spec.flags.items():
        if name in flags.FLAGS:
            if state['present']:
                flags.FLAGS[name].value = state['_value']
                flags.FLAGS[name].present = state['present']
        else:
            flag = flag_class.__new__(flag_class)
            flag.__dict__.update(state, validators=[])
            flags.FLAGS[name] = flag
    if spec.flag_overrides:
        flags.FLAGS(['worker'] + list(spec.flag_overrides), known_only=True)
    flags.FLAGS.mark_as_parsed()


def _run_with_flags(spec: WorkerSpec) -> None:
    _install_flags(spec)
    spec.run()


def _watch(coordinator, stop: runtime.StopSignal, spec: WorkerSpec,
           launcher_lost: threading.Event) -> None:
    """Triggers the stop signal when the program stops or the launcher is gone."""
    unreachable_since = None
    while True:
        if spec.parent_pid is not None and os.getppid() != spec.parent_pid:
            logging.error('%s: the launcher (pid %d) is gone; stopping.', spec.node_name,
                          spec.parent_pid)
            launcher_lost.set()
            break
        try:
            if coordinator.wait_for_stop(_POLL):
                break
            unreachable_since = None
        except Exception as e:  # pylint: disable=broad-except
            now = time.monotonic()
            unreachable_since = unreachable_since or now
            if now - unreachable_since > COORDINATOR_LOSS_TIMEOUT:
                logging.error('%s: the program\'s coordinator has been unreachable for %.0f s (%s); '
                              'stopping.', spec.node_name, COORDINATOR_LOSS_TIMEOUT, e)
                launcher_lost.set()
                break
            time.sleep(0.2)
    stop.trigger()
    time.sleep(spec.notice_period + 1.0)
    logging.error('%s did not end within the %g s notice period; exiting.', spec.node_name,
                  spec.notice_period)
    _exit_now(3, spec, launcher_lost)


def _exit_now(code: int, spec: WorkerSpec, launcher_lost: threading.Event) -> None:
    if launcher_lost.is_set() and spec.cleanup_dir:
        shutil.rmtree(spec.cleanup_dir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def main() -> None:
    """Runs the executable of the spec file named by the last command-line argument, then exits."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    if len(sys.argv) != 2:
        sys.exit('usage: python -c "from launchpad.launch.worker import main; main()" SPEC_FILE')
    sys.exit(_run(sys.argv[1]))


def _run(spec_path: str) -> int:
    import courier  # pylint: disable=import-outside-toplevel
    spec = _load(spec_path)
    label, index = spec.node_name.rsplit('/', 1)
    context = runtime.NodeContext(
        launch_type=spec.launch_type, program_name=spec.program_name, label=label,
        index=int(index) if index.isdigit() else 0, address_table=spec.address_table, stop=None,
        notice_period=spec.notice_period, tls=spec.tls)
    tls = context.tls_for(spec.coordinator_address)
    # The start waits for a busy coordinator; everything later fails at once when it is gone, so
    # that a node whose launcher died ends within seconds.
    starting = courier.Client(spec.coordinator_address, call_timeout=30.0, wait_for_ready=True,
                              tls=tls)
    coordinator = courier.Client(spec.coordinator_address, call_timeout=30.0, wait_for_ready=False,
                                 tls=tls)
    # Address lookups wait for servers to come up, longer than other calls may take.
    table = spec.address_table
    lookup_deadline = None if table.lookup_timeout is None else table.lookup_timeout + 30.0
    table.registry = courier.Client(spec.coordinator_address, call_timeout=lookup_deadline,
                                    wait_for_ready=False, tls=tls)
    stop = runtime.StopSignal(coordinator.request_stop)
    context.stop, context.coordinator = stop, coordinator
    runtime.set_process_context(context)
    launcher_lost = threading.Event()
    threading.Thread(target=_watch, args=(coordinator, stop, spec, launcher_lost), daemon=True,
                     name='lp-stop-watcher').start()
    try:
        code = run_reporting(functools.partial(_run_with_flags, spec), spec.node_name, coordinator,
                             starting=starting)
    except Exception:  # pylint: disable=broad-except
        # Reporting failed: the coordinator is gone.
        logging.exception('%s could not report to the coordinator.', spec.node_name)
        code = 1
    if launcher_lost.is_set():
        _exit_now(code, spec, launcher_lost)
    return code
