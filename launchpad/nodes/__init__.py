"""Node types."""
from launchpad.nodes.base import Executable, Handle, LaunchInfo, Node
from launchpad.nodes.courier import CourierClient, CourierHandle, CourierNode
from launchpad.nodes.python import PyClassNode, PyNode
