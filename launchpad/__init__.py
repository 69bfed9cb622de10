"""launchpad: write a distributed program as a graph of services and run it anywhere.

    import launchpad as lp

    program = lp.Program('hello')
    server = program.add_node(lp.CourierNode(Server), label='server')
    program.add_node(lp.PyNode(client_main, server), label='client')
    lp.launch(program, launch_type='local_mp')

Platform modules (processes, ssh, slurm, kubernetes) load when one of their names is first used.
"""
import importlib
from typing import TYPE_CHECKING, Any, List

from courier import batched_handler

from launchpad import context, dataflow
from launchpad.address import Address, get_port_from_address
from launchpad.checkpoint import load_checkpoint, save_checkpoint
from launchpad.context import LaunchType, is_local_launch, is_local_launch_or_test
from launchpad.launch.controller import Controller, Controllers
from launchpad.launch.launcher import (LAUNCH_TYPE, LaunchOptions, Launcher, executables_of, launch,
                                       make_program_stopper, register_launcher)
from launchpad.nodes.base import Executable, Handle, LaunchInfo, Node
from launchpad.nodes.cacher import CacherNode
from launchpad.nodes.colocation import (ColocationNode, MultiProcessingColocation,
                                        MultiThreadingColocation)
from launchpad.nodes.courier import CourierClient, CourierHandle, CourierNode
from launchpad.nodes.endpoint import NodeLeftError, NodeStoppedError, Retries, idempotent
from launchpad.nodes.group import GroupClient, GroupHandle
from launchpad.process.supervision import MemberEvent
from launchpad.nodes.python import PyClassNode, PyNode
from launchpad.nodes.reverb import ReverbHandle, ReverbNode
from launchpad.metrics import count, report
from launchpad.pool import Pool, PoolTerminatedError, PoolWorker, PoolWorkerNode
from launchpad.policy import RestartPolicy
from launchpad.process.errors import NodeFailedError
from launchpad.process.states import NodeState, NodeStatus
from launchpad.process.spec import NodePicklingError
from launchpad.program import Program, ProgramError, make_program
from launchpad.resources import Resources
from launchpad.runtime import (get_context, heartbeat, register_stop_handler, resize, stop,
                               stop_event, unregister_stop_handler, wait_for_stop)
from launchpad.scaling import Elastic, ProgressPerActorPolicy, QueueLengthPolicy

if TYPE_CHECKING:  # what __getattr__ below returns, for type checkers
    from launchpad.launch.detached import AttachedController, attach
    from launchpad.launch.kubernetes import KubernetesResources, program_to_manifests
    from launchpad.launch.processes import PythonProcess
    from launchpad.launch.slurm import SlurmController, SlurmError, SlurmResources
    from launchpad.launch.ssh import SshHost, SshHosts

# Public names of the platform modules, imported on first use (see __getattr__).
_PLATFORM_NAMES = {
    'attach': 'launchpad.launch.detached',
    'AttachedController': 'launchpad.launch.detached',
    'PythonProcess': 'launchpad.launch.processes',
    'SshHost': 'launchpad.launch.ssh',
    'SshHosts': 'launchpad.launch.ssh',
    'SlurmController': 'launchpad.launch.slurm',
    'SlurmError': 'launchpad.launch.slurm',
    'SlurmResources': 'launchpad.launch.slurm',
    'KubernetesResources': 'launchpad.launch.kubernetes',
    'program_to_manifests': 'launchpad.launch.kubernetes',
}

__all__ = [
    'Address', 'AttachedController', 'CacherNode', 'ColocationNode', 'Controller', 'Controllers', 'CourierClient',
    'CourierHandle', 'CourierNode', 'Elastic', 'Executable', 'GroupClient', 'GroupHandle',
    'Handle', 'KubernetesResources',
    'LAUNCH_TYPE', 'LaunchInfo', 'LaunchOptions', 'LaunchType', 'Launcher',
    'MemberEvent', 'MultiProcessingColocation', 'MultiThreadingColocation', 'Node',
    'NodeFailedError',
    'NodeLeftError', 'NodePicklingError', 'NodeState', 'NodeStatus', 'NodeStoppedError', 'Pool',
    'PoolTerminatedError', 'PoolWorker', 'PoolWorkerNode', 'ProgressPerActorPolicy', 'Program',
    'ProgramError',
    'QueueLengthPolicy', 'PyClassNode', 'PyNode', 'PythonProcess', 'Resources',
    'ReverbHandle', 'ReverbNode', 'RestartPolicy', 'Retries', 'SlurmController', 'SlurmError',
    'SlurmResources', 'SshHost', 'SshHosts', 'attach', 'batched_handler', 'context', 'count',
    'dataflow', 'executables_of', 'get_context', 'get_port_from_address', 'heartbeat',
    'idempotent', 'is_local_launch', 'is_local_launch_or_test', 'launch', 'load_checkpoint',
    'make_program', 'make_program_stopper',
    'program_to_manifests', 'register_launcher', 'register_stop_handler', 'report', 'resize',
    'save_checkpoint', 'stop', 'stop_event', 'unregister_stop_handler', 'wait_for_stop',
]


def __getattr__(name: str) -> Any:
    module = _PLATFORM_NAMES.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
