"""What a node process is started with: its spec file, its environment and its command line.

Every process-based launcher (local processes, SSH, Slurm, Kubernetes, process colocation) ships
an executable the same way: a `Packer` builds each node's `WorkerSpec` from what the launch shares,
`pack` turns it into the bytes of a spec file, `node_environment` gives the process's
environment and `worker_argv` its command line, which runs `launchpad.process.worker` on the file.
"""
from __future__ import annotations

import copyreg
import dataclasses
import functools
import os
import pickle
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import courier
from courier import serialization

from launchpad.address import AddressTable
from launchpad.policy import NodePolicy
from launchpad.process import flags
from launchpad.resources import NodeResources

WORKER_MODULE = 'launchpad.process.worker'
# Set to '1' in the environment of node processes that nothing contains (Slurm without cgroups):
# the worker then runs the node in a child and ends whatever the node leaves behind when it dies.
SUPERVISE_ENV = 'LAUNCHPAD_SUPERVISE_WORKER'
# Where a host's nodes keep their checkpoint directories, where the spec cannot say (SSH hosts).
CHECKPOINT_ROOT_ENV = 'LAUNCHPAD_CHECKPOINT_ROOT'

_UNBUFFERED = {'PYTHONUNBUFFERED': '1'}
_QUIET_GRPC = {'GRPC_VERBOSITY': 'ERROR'}


class NodePicklingError(pickle.PicklingError, RuntimeError):
    """An executable could not be packed for another process.

    Also a RuntimeError, which is what code written for dm-launchpad catches there.
    """


class NodeUnpicklingError(RuntimeError):
    """A worker could not unpickle its executable (something it refers to is missing there).

    Attributes:
      node_name: the node's name.
      coordinator_address: where the worker reports the failure (None if only a callable knows).
      tls: the TLS credentials to reach the coordinator with, or None.
    """

    def __init__(self, message: str, node_name: str, coordinator_address: Optional[str],
                 tls: Any):
        super().__init__(message)
        self.node_name = node_name
        self.coordinator_address = coordinator_address
        self.tls = tls


@dataclasses.dataclass
class WorkerSpec:
    """Everything a worker process needs to run one executable.

    Attributes:
      program_name, launch_type, node_name: identify the executable ('group/index' node name).
      run: the executable's callable.
      address_table: the program's address table (its registry is filled in by the worker).
      coordinator_address: the courier address of the program's coordinator, or a picklable
        callable returning it.
      parent_pid: the launcher's pid when the worker is its direct child; the worker stops if its
        parent changes (the launcher died).
      notice_period: seconds to end after a stop before the worker exits by itself.
      flags: absl flags of the launching process (see `flags.snapshot`), so node code reads them.
      flag_overrides: flag values for this process ('--name=value' strings).
      env: environment variables to set before anything is unpickled.
      cleanup_dir: a directory of the launch that the worker removes if the launcher dies, since
        the launcher cannot, or if it is the last of its owners out (`tempdirs.leave`); the
        node's own temporary directories go inside it ($LAUNCHPAD_RUN_DIR).
      tls: the program's TLS credentials (a courier.TLSConfig) for TCP traffic, or None.
      progress_deadline: seconds the node may go without progress before it counts as hung.
      stop_signal: the name of a signal (e.g. 'SIGUSR1') by which the platform warns that it
        will end the program soon (Slurm before its time limit): the program then stops.
      resources: what the node was given (a `NodeResources`): the worker pins itself to its
        cores, and the node reads it as `lp.get_context().resources`.
      checkpoint_root: where the nodes' checkpoint directories are (`NodeContext.checkpoint_root`;
        $LAUNCHPAD_CHECKPOINT_ROOT, set by a host's agent, takes precedence).
      requeue_check: called when the platform sends SIGTERM: True if it ends the whole program
        to start it again (a Slurm job's requeue), so that the node ends without reporting
        anything and runs again as its next attempt (a picklable callable, or None).
      coordinator_grace: seconds the node runs on without reaching its coordinator before it
        stops (None: `COORDINATOR_LOSS_TIMEOUT`); a detached program's nodes wait this long for
        a new supervisor.
    """
    program_name: str
    launch_type: str
    node_name: str
    run: Callable[[], None]
    address_table: AddressTable
    coordinator_address: Union[str, Callable[[], str]]
    parent_pid: Optional[int] = None
    notice_period: float = 10.0
    flags: Dict[str, Any] = dataclasses.field(default_factory=dict)
    flag_overrides: List[str] = dataclasses.field(default_factory=list)
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    cleanup_dir: Optional[str] = None
    tls: Any = None
    progress_deadline: Optional[float] = None
    stop_signal: Optional[str] = None
    resources: Optional[NodeResources] = None
    checkpoint_root: Optional[str] = None
    requeue_check: Optional[Callable[[], bool]] = None
    coordinator_grace: Optional[float] = None


@dataclasses.dataclass
class Packer:
    """What every node of one launch shares; `spec` builds one node's `WorkerSpec` from it.

    Attributes:
      program_name, launch_type: the launch.
      address_table: the program's address table, as nodes see it.
      coordinator_address: where nodes reach the coordinator (a str or a picklable callable).
      notice_period: seconds nodes get to end after a stop.
      tls: the program's TLS credentials for TCP traffic, or None.
      flags: the launching process's absl flags (taken when the packer is made).
      policies: executable name -> its `NodePolicy` (its progress deadline reaches the worker).
      stop_signal, checkpoint_root, requeue_check, coordinator_grace: see `WorkerSpec`.
    """
    program_name: str
    launch_type: str
    address_table: AddressTable
    coordinator_address: Union[str, Callable[[], str]]
    notice_period: float = 10.0
    tls: Any = None
    flags: Dict[str, Any] = dataclasses.field(default_factory=flags.snapshot)
    policies: Mapping[str, NodePolicy] = dataclasses.field(default_factory=dict)
    stop_signal: Optional[str] = None
    checkpoint_root: Optional[str] = None
    requeue_check: Optional[Callable[[], bool]] = None
    coordinator_grace: Optional[float] = None

    def spec(self, node_name: str, run: Callable[[], None], *, args: flags.FlagArgs = None,
             env: Optional[Mapping[str, str]] = None, parent_pid: Optional[int] = None,
             cleanup_dir: Optional[str] = None,
             resources: Optional[NodeResources] = None) -> WorkerSpec:
        """The spec of node `node_name` running `run`.

        Args:
          args: absl flag values for this node, as {name: value} or ['--name=value'].
          env: variables the worker sets before it unpickles the node (e.g. secrets that must
            not appear on a command line).
          parent_pid: the pid the node process is a child of, if it is one of ours.
          cleanup_dir: a directory the worker removes if the launcher dies.
          resources: what the node was given; its variables (`NodeResources.environment`) join
            `env`.
        """
        return WorkerSpec(
            program_name=self.program_name, launch_type=self.launch_type, node_name=node_name,
            run=run, address_table=self.address_table,
            coordinator_address=self.coordinator_address, parent_pid=parent_pid,
            notice_period=self.notice_period, flags=self.flags,
            flag_overrides=flags.overrides(args),
            env={**(env or {}), **(resources.environment() if resources else {})},
            cleanup_dir=cleanup_dir,
            tls=self.tls, stop_signal=self.stop_signal, resources=resources,
            checkpoint_root=self.checkpoint_root, requeue_check=self.requeue_check,
            coordinator_grace=self.coordinator_grace,
            progress_deadline=(self.policies.get(node_name) or NodePolicy()).progress_deadline)

    def admit(self, executable, policy: Optional[NodePolicy] = None, **options) -> WorkerSpec:
        """The spec of `executable` (a `launchpad.nodes.base.Executable`), with `options` as for
        `spec`: every platform's one step that packs a node, of the launch or added to the
        running program; `policy` is an added node's own (the launch gives the packer all of
        its nodes' policies at once)."""
        if policy is not None:
            self.policies = {**self.policies, executable.name: policy}
        return self.spec(executable.name, executable.run, **options)


def pickle_node(node_name: str, value: Any) -> bytes:
    """cloudpickle of `value` (its code keeps its file names, for tracebacks where it runs), or a
    NodePicklingError naming the node and what cannot be pickled."""
    flags.pickle_by_reference()
    copyreg.pickle(_LRU_CACHE_TYPE, _reduce_lru_cache)
    try:
        return serialization.cloudpickle_dumps(value)
    except Exception as e:  # pylint: disable=broad-except
        raise NodePicklingError(
            f'Cannot send node {node_name} to where it runs: its arguments cannot be pickled '
            f'({type(e).__name__}: {e}). Pass picklable arguments (build objects such as locks, '
            f'sockets or open files inside the node instead).') from e


def pack(spec: WorkerSpec) -> bytes:
    """The bytes of a spec file, or a NodePicklingError naming the node and what cannot be pickled."""
    payload = pickle_node(spec.node_name, spec)
    coordinator = spec.coordinator_address
    header = {'sys_path': [p for p in sys.path if p], 'env': spec.env,
              # Enough to report a payload that cannot be unpickled where it runs.
              'report': (spec.node_name, coordinator if isinstance(coordinator, str) else None,
                         spec.tls)}
    return pickle.dumps((header, payload), protocol=pickle.HIGHEST_PROTOCOL)


def write(spec: WorkerSpec, path: str) -> None:
    """Packs `spec` into a file only this user can read."""
    data = pack(spec)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'wb') as f:
        f.write(data)


def load(path: str) -> WorkerSpec:
    """Reads a spec file in the worker: sets its environment and sys.path, then unpickles it."""
    with open(path, 'rb') as f:
        header, payload = pickle.load(f)
    os.environ.update(header['env'])
    for entry in reversed(header['sys_path']):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    import cloudpickle  # pylint: disable=import-outside-toplevel
    try:
        return cloudpickle.loads(payload)
    except Exception as e:  # pylint: disable=broad-except
        node_name, coordinator, tls = header['report']
        raise NodeUnpicklingError(
            f'Node {node_name} cannot be unpickled where it runs ({type(e).__name__}: {e}). '
            'Everything its arguments refer to must be importable there: install the modules '
            'it uses where it runs, and define its functions and classes at the top level of a '
            'module or of the script.', node_name, coordinator, tls) from e


def worker_argv(spec_path: str, python: Optional[str] = None) -> List[str]:
    """The command line that runs the node of the spec file `spec_path` with `python`."""
    return [python or sys.executable, '-m', WORKER_MODULE, spec_path]


def node_environment(token: Optional[str] = None, *, base: Optional[Mapping[str, str]] = None,
                     extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a node process: `base` (default: ours) with `extra` on top, quiet gRPC
    logs unless asked otherwise, unbuffered output, and the program's auth token if given."""
    env = {**_QUIET_GRPC, **(os.environ if base is None else base), **(extra or {}),
           **_UNBUFFERED}
    if token is not None:
        env[courier.AUTH_TOKEN_ENV] = token
    return env


# functools.lru_cache wraps a function in an object that pickles by name, which fails in a node
# process when the function was defined in the launching script (its __main__): such wrappers
# travel as the function they wrap (by value, as cloudpickle sends the script's functions) and
# their cache settings, and get a new, empty cache where they run.
_LRU_CACHE_TYPE = type(functools.lru_cache()(len))


def _reduce_lru_cache(wrapper):
    module = sys.modules.get(getattr(wrapper, '__module__', None) or '')
    if module is not None and module.__name__ != '__main__' and getattr(
            module, wrapper.__qualname__, None) is wrapper:
        return wrapper.__qualname__  # importable where it runs: by name, as pickle does
    return _rebuild_lru_cache, (wrapper.__wrapped__, wrapper.cache_parameters())


def _rebuild_lru_cache(function, parameters):
    return functools.lru_cache(**parameters)(function)
