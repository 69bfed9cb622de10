"""Nodes that run Python code: `PyNode` runs a function, `PyClassNode` builds an object and runs it."""
from __future__ import annotations

from typing import Any, Callable, List

from launchpad import runtime
from launchpad.address import Address
from launchpad.nodes.base import Handle, Node, dereference_all, find_handles


class NoServiceHandle(Handle):
    """The handle of a node that serves nothing."""

    def dereference(self):
        raise TypeError(f'{self.node_id} serves nothing, so its handle has no client. To call a '
                        'node, make it a CourierNode.')


class _ArgumentsNode(Node):
    """A node built from a callable and arguments that may contain handles of other nodes."""

    def __init__(self, function: Callable[..., Any], *args, **kwargs):
        super().__init__()
        if not callable(function):
            raise TypeError(f'{type(self).__name__} needs a callable, got {function!r}.')
        self._function = function
        self._args = args
        self._kwargs = kwargs

    def allocate_address(self, address: Address) -> None:
        """Makes this node the server of `address`, for code that starts its own server on it.

        The launcher gives the address a TCP endpoint: inside this node, `address.resolve()`
        returns the 'host:port' to listen on (`lp.get_port_from_address` gives its port), chosen
        when the node starts; every other node's `address.resolve()` waits until it is chosen and
        returns it to connect to.
        """
        if not isinstance(address, Address):
            raise TypeError(f'allocate_address takes an lp.Address, got {address!r}.')
        if address.owner not in (None, self.node_id):
            raise ValueError(f'{address} is already allocated to {address.owner}; an address has '
                             'one server. Create one lp.Address() per node.')
        if address.owner is None:
            address.owner = self.node_id
            address.tcp_only = True  # user code listens on the port it is given
            self._addresses.append(address)

    def configure(self, *args, **kwargs) -> None:
        """Sets the arguments after construction, to build programs whose nodes refer to each other."""
        self._args = args
        self._kwargs = kwargs

    @property
    def function(self) -> Callable[..., Any]:
        return self._function

    @property
    def input_handles(self) -> List[Handle]:
        return find_handles((self._args, self._kwargs))

    def _call(self) -> Any:
        if self._addresses:
            table = runtime.get_context().address_table
            for address in self._addresses:
                if address.owner == self.node_id:
                    table.reserve(address)
        args, kwargs = dereference_all((self._args, self._kwargs))
        return self._function(*args, **kwargs)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({getattr(self._function, "__name__", self._function)})'


class PyNode(_ArgumentsNode):
    """Runs `function(*args, **kwargs)`; handles in the arguments arrive as clients."""

    def create_handle(self) -> Handle:
        return NoServiceHandle(self)

    def run_in_context(self) -> None:
        self._call()


class PyClassNode(_ArgumentsNode):
    """Builds `cls(*args, **kwargs)` where it runs, then calls its `run()` method if it has one."""

    def __init__(self, cls: Callable[..., Any], *args, **kwargs):
        super().__init__(cls, *args, **kwargs)
        self._run_enabled = True

    def disable_run(self) -> None:
        """Do not call `run()`; the node only serves (where it serves) until the program stops."""
        self._run_enabled = False

    def enable_run(self) -> None:
        """Call `run()` (the default)."""
        self._run_enabled = True

    def create_handle(self) -> Handle:
        return NoServiceHandle(self)

    def run_in_context(self) -> None:
        instance = self._call()
        if self._run_enabled and callable(getattr(instance, 'run', None)):
            instance.run()
