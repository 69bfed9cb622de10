"""The node abstraction: nodes, their handles and the executables they turn into."""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Generic, List, Optional, Sequence, TypeVar

from launchpad.address import Address

ClientT = TypeVar('ClientT')


class Handle(abc.ABC, Generic[ClientT]):
    """Refers to a node of the program; passing it to another node draws an edge.

    Handles hold only address placeholders. Inside a running node they are dereferenced into
    clients (`dereference()`); launchpad does that for every handle in a node's arguments.
    """

    def __init__(self, node: 'Node'):
        self._node_id = node.node_id
        # (A group's handle refers to a stand-in that has only a node_id.)
        self._node_name = getattr(node, 'name', None) or node.node_id
        self._program_name = getattr(node, 'program_name', None)

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def node_name(self) -> str:
        """The node's name ('group/index') in its program (before it is added: its id)."""
        return self._node_name

    @property
    def program_name(self) -> Optional[str]:
        """The name of the program the node was added to (None: not added to any)."""
        return self._program_name

    @abc.abstractmethod
    def dereference(self) -> ClientT:
        """The client for this handle's node (only inside a launched program)."""

    def __getattr__(self, name: str):
        if name.startswith('_'):
            raise AttributeError(name)
        raise AttributeError(
            f'{type(self).__name__} has no attribute {name!r}: a handle is a placeholder; call '
            f'handle.dereference() inside a running node to get a client, or pass the handle to the '
            f'node\'s constructor and launchpad dereferences it for you.')


@dataclasses.dataclass
class Executable:
    """One unit a launcher runs: a picklable zero-argument callable and the nodes it runs.

    Attributes:
      node_names: names ('group/index') of the nodes this executable runs.
      run: runs the nodes until they finish or the program stops.
      addresses: the addresses its servers bind.
    """
    node_names: List[str]
    run: Callable[[], None]
    addresses: List[Address] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.node_names[0] if len(self.node_names) == 1 else '+'.join(self.node_names)


@dataclasses.dataclass
class LaunchInfo:
    """What a node type learns about the launch when it builds executables.

    Attributes:
      launch_type: the launch type: an `lp.LaunchType` member, or the name of one of your own.
      resources: the group's platform resources (launcher-specific), or None.
    """
    launch_type: str
    resources: Any = None


class Node(abc.ABC):
    """A service or task in a program. Subclasses say how they become executables."""

    _next_id = 0

    def __init__(self):
        Node._next_id += 1
        self.node_id = f'{type(self).__name__}-{Node._next_id}'
        self.name: Optional[str] = None  # 'group/index', set when added to a program
        self.program_name: Optional[str] = None  # the name of that program
        self._addresses: List[Address] = []
        self.colocated_in: Optional['Node'] = None  # the colocation node running it, if any

    @property
    def addresses(self) -> List[Address]:
        """The addresses this node serves."""
        return list(self._addresses)

    @property
    def input_handles(self) -> List[Handle]:
        """Handles of other nodes found in this node's arguments."""
        return []

    @abc.abstractmethod
    def create_handle(self) -> Handle:
        """A new handle to this node."""

    @abc.abstractmethod
    def run_in_context(self) -> None:
        """Runs the node in the current executable until it ends or the program stops."""

    def to_executables(self, nodes: Sequence['Node'], label: str,
                       launch_info: LaunchInfo) -> List[Executable]:
        """Executables for `nodes` (all of this node's type, in group `label`): one per node."""
        del label, launch_info
        return [Executable([node.name], node.run_in_context, node.addresses) for node in nodes]

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.name or self.node_id})'


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """Applies `fn` to every handle inside lists, tuples, dicts, sets and dataclasses of `value`.

    Containers without handles are returned as they are (not copied).
    """
    if isinstance(value, Handle):
        return fn(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        mapped = [map_structure(fn, item) for item in value]
        if all(new is old for new, old in zip(mapped, value)):
            return value
        if isinstance(value, tuple) and hasattr(value, '_fields'):  # namedtuple
            return type(value)(*mapped)
        return type(value)(mapped)
    if isinstance(value, dict):
        mapped = {key: map_structure(fn, item) for key, item in value.items()}
        if all(mapped[key] is item for key, item in value.items()):
            return value
        return type(value)(mapped)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {field.name: map_structure(fn, getattr(value, field.name))
                   for field in dataclasses.fields(value) if field.init}
        if all(new is getattr(value, name) for name, new in changes.items()):
            return value
        return dataclasses.replace(value, **changes)
    return value


def find_handles(value: Any) -> List[Handle]:
    """Every handle inside `value`, in order."""
    found: List[Handle] = []

    def collect(handle):
        found.append(handle)
        return handle

    map_structure(collect, value)
    return found


def dereference_all(value: Any) -> Any:
    """`value` with every handle inside replaced by its client."""
    return map_structure(lambda handle: handle.dereference(), value)
