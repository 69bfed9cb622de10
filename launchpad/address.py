"""Address placeholders and the address table a launcher fills in.

At setup time a node owns `Address` placeholders. At launch time the launcher builds an
`AddressTable` mapping each placeholder to where its server binds and how clients reach it. An entry
is either *static* (the endpoint is known before anything starts, e.g. a Unix socket path in the
program's private directory) or *published* (the server binds a host on a port of its own choosing and
publishes the endpoint; clients look it up through the program's registry). Neither kind relies on
picking a free port and hoping nobody else takes it.
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Iterable, Optional, Protocol


class Address:
    """A placeholder for a network endpoint, filled in by the launcher.

    Attributes:
      name: what the endpoint is for, shown in errors.
      tcp_only: the server can only listen on a TCP 'host:port' (e.g. a Reverb server), so the
        launcher must not give it a Unix socket; local launchers give it a published '127.0.0.1:0'.
    """

    def __init__(self, name: str = 'default', *, tcp_only: bool = False):
        self.id = uuid.uuid4().hex[:16]
        self.name = name
        self.tcp_only = tcp_only

    def resolve(self) -> str:
        """The endpoint clients use; only valid inside a launched program."""
        from launchpad import runtime  # pylint: disable=import-outside-toplevel
        return runtime.get_context().address_table.resolve(self)

    def __repr__(self) -> str:
        return f'Address({self.name!r}, id={self.id})'

    def __eq__(self, other) -> bool:
        return isinstance(other, Address) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


class Registry(Protocol):
    """Where published endpoints are stored (the program's coordinator)."""

    def publish_address(self, address_id: str, endpoint: str) -> None: ...

    def lookup_address(self, address_id: str, timeout: Optional[float]) -> Optional[str]: ...


class AddressNotFoundError(LookupError):
    """An address that is not part of the launched program was resolved."""


@dataclasses.dataclass
class AddressTable:
    """Maps address ids to endpoints for one launch.

    Attributes:
      static: address id -> endpoint, used both to bind and to connect.
      published: address id -> bind target such as '10.0.0.2:0'; the server binds it and publishes
        the real endpoint to `registry`, where clients look it up.
      registry: the program's registry for published endpoints (set inside executables).
    """
    static: dict = dataclasses.field(default_factory=dict)
    published: dict = dataclasses.field(default_factory=dict)
    registry: Optional[Registry] = None
    lookup_timeout: Optional[float] = 600.0

    def bind_target(self, address: Address) -> str:
        """Where the server for `address` binds."""
        if address.id in self.static:
            return self.static[address.id]
        if address.id in self.published:
            return self.published[address.id]
        raise AddressNotFoundError(self._missing(address))

    def is_published(self, address: Address) -> bool:
        return address.id in self.published

    def publish(self, address: Address, endpoint: str) -> None:
        """Records the endpoint a server bound for a published address."""
        if address.id in self.published:
            self._registry().publish_address(address.id, endpoint)

    def resolve(self, address: Address) -> str:
        """The endpoint clients connect to; waits for published endpoints to appear."""
        if address.id in self.static:
            return self.static[address.id]
        if address.id in self.published:
            endpoint = self._registry().lookup_address(address.id, self.lookup_timeout)
            if endpoint is None:
                raise TimeoutError(
                    f'{address} was not published within {self.lookup_timeout} s: the node serving '
                    'it did not start; look for its error in the program output.')
            return endpoint
        raise AddressNotFoundError(self._missing(address))

    def current(self, address: Address) -> Optional[str]:
        """The endpoint clients connect to now, without waiting: a published address's latest
        endpoint (a restarted node publishes a new one), or None while it has none."""
        if address.id in self.published:
            return self._registry().lookup_address(address.id, 0.0)
        if address.id in self.static:
            return self.static[address.id]
        raise AddressNotFoundError(self._missing(address))

    def _registry(self) -> Registry:
        if self.registry is None:
            raise RuntimeError('This address table has no registry for published addresses.')
        return self.registry

    @staticmethod
    def _missing(address: Address) -> str:
        return (f'{address} is not in the launched program: a handle of a node that was never '
                'added to the program was used. Add that node with program.add_node(...).')


def local_address_table(addresses: Iterable[Address], socket_dir: str,
                        registry: Optional[Registry] = None) -> AddressTable:
    """The address table of a launch on this machine.

    Servers listen on Unix sockets in `socket_dir` (a private directory), except `tcp_only`
    addresses, which bind a loopback port of the server's choosing and publish it to `registry`.
    """
    table = AddressTable(registry=registry)
    for i, address in enumerate(addresses):
        if address.tcp_only:
            table.published[address.id] = '127.0.0.1:0'
        else:
            table.static[address.id] = f'unix:{socket_dir}/{i}.sock'
    return table
