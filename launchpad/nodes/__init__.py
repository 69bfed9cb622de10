"""Node types."""
from launchpad.nodes.base import Executable, Handle, LaunchInfo, Node
from launchpad.nodes.cacher import CacherNode
from launchpad.nodes.colocation import (ColocationNode, MultiProcessingColocation,
                                        MultiThreadingColocation)
from launchpad.nodes.courier import CourierClient, CourierHandle, CourierNode
from launchpad.nodes.python import PyClassNode, PyNode
from launchpad.nodes.reverb import ReverbHandle, ReverbNode
