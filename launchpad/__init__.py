"""launchpad: write a distributed program as a graph of services and run it anywhere.

    import launchpad as lp

    program = lp.Program('hello')
    server = program.add_node(lp.CourierNode(Server), label='server')
    program.add_node(lp.PyNode(client_main, server), label='client')
    lp.launch(program, launch_type='local_mp')
"""
from courier import batched_handler

from launchpad.address import Address
from launchpad.launch.coordinator import NodeFailedError, NodeState, NodeStatus
from launchpad.launch.launcher import (LAUNCH_TYPE, Controller, LaunchOptions, LaunchType,
                                       Launcher, executables_of, is_local_launch,
                                       is_local_launch_or_test, launch, make_program_stopper,
                                       register_launcher)
from launchpad.launch.kubernetes import KubernetesResources, program_to_manifests
from launchpad.launch.processes import PythonProcess
from launchpad.launch.slurm import SlurmController, SlurmError, SlurmResources
from launchpad.launch.ssh import SshHost, SshHosts
from launchpad.launch.worker import NodePicklingError
from launchpad.nodes.base import Executable, Handle, LaunchInfo, Node
from launchpad.nodes.cacher import CacherNode
from launchpad.nodes.colocation import (ColocationNode, MultiProcessingColocation,
                                        MultiThreadingColocation)
from launchpad.nodes.courier import CourierClient, CourierHandle, CourierNode
from launchpad.nodes.python import PyClassNode, PyNode
from launchpad.nodes.reverb import ReverbHandle, ReverbNode
from launchpad.program import Program, ProgramError, make_program
from launchpad.runtime import (get_context, register_stop_handler, stop, stop_event,
                               unregister_stop_handler, wait_for_stop)

__all__ = [
    'Address', 'CacherNode', 'ColocationNode', 'Controller', 'CourierClient', 'CourierHandle',
    'CourierNode', 'Executable', 'Handle', 'KubernetesResources', 'LAUNCH_TYPE', 'LaunchInfo',
    'LaunchOptions', 'LaunchType', 'Launcher', 'MultiProcessingColocation',
    'MultiThreadingColocation', 'Node', 'NodeFailedError', 'NodePicklingError', 'NodeState',
    'NodeStatus', 'Program', 'ProgramError', 'PyClassNode', 'PyNode', 'PythonProcess',
    'ReverbHandle', 'ReverbNode', 'SlurmController', 'SlurmError', 'SlurmResources', 'SshHost',
    'SshHosts', 'batched_handler', 'executables_of', 'get_context', 'is_local_launch',
    'is_local_launch_or_test', 'launch', 'make_program', 'make_program_stopper',
    'program_to_manifests', 'register_launcher', 'register_stop_handler', 'stop', 'stop_event',
    'unregister_stop_handler', 'wait_for_stop',
]
