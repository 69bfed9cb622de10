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
import os
import socket
import uuid
from typing import Iterable, Optional, Protocol


class Address:
    """A placeholder for a network endpoint, filled in by the launcher.

    Attributes:
      name: what the endpoint is for, shown in errors.
      tcp_only: the server can only listen on a TCP 'host:port' (e.g. a Reverb server), so the
        launcher must not give it a Unix socket; local launchers give it a published '127.0.0.1:0'.
      owner: the id of the node that allocated it with `allocate_address` (its server is started
        by user code), or None.
    """

    def __init__(self, name: str = 'default', *, tcp_only: bool = False):
        self.id = uuid.uuid4().hex[:16]
        self.name = name
        self.tcp_only = tcp_only
        self.owner: Optional[str] = None

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
      lookup_timeout: seconds `resolve` waits for a published endpoint.
      reserved: address id -> endpoint this process reserved for a server of its own (`reserve`).
    """
    static: dict = dataclasses.field(default_factory=dict)
    published: dict = dataclasses.field(default_factory=dict)
    registry: Optional[Registry] = None
    lookup_timeout: Optional[float] = 600.0
    reserved: dict = dataclasses.field(default_factory=dict)

    def bind_target(self, address: Address) -> str:
        """Where the server for `address` binds."""
        if address.id in self.static:
            return self.static[address.id]
        if address.id in self.published:
            return self.published[address.id]
        raise AddressNotFoundError(self._missing(address))

    def is_published(self, address: Address) -> bool:
        """Whether clients find `address`'s endpoint in the registry: a published address, or
        one of a node added after the launch (not in this table, which was made before, but its
        launcher registers its endpoint with the registry)."""
        return address.id in self.published or (self.registry is not None
                                                 and address.id not in self.static)

    def publish(self, address: Address, endpoint: str) -> None:
        """Records the endpoint a server bound for a published address."""
        if address.id in self.published:
            self._registry().publish_address(address.id, endpoint)

    def reserve(self, address: Address) -> str:
        """Chooses now, in the node that will serve `address`, the endpoint its server binds, and
        publishes it: for servers that user code starts itself on a port it is given
        (`PyNode.allocate_address`). A static address is already chosen.

        The port is one the kernel reports free on the bind host at this moment; the server should
        bind it soon after.
        """
        if address.id in self.reserved:
            return self.reserved[address.id]
        if address.id not in self.published:
            return self.bind_target(address)
        host = self.bind_target(address).rsplit(':', 1)[0]  # e.g. '10.0.0.2:0'
        probe_host = host.strip('[]')
        family = socket.AF_INET6 if ':' in probe_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((probe_host, 0))
            endpoint = f'{host}:{probe.getsockname()[1]}'
        self.reserved[address.id] = endpoint
        self.publish(address, endpoint)
        return endpoint

    def resolve(self, address: Address) -> str:
        """The endpoint clients connect to; waits for published endpoints to appear."""
        if address.id in self.reserved:
            return self.reserved[address.id]
        if address.id in self.static:
            return self.static[address.id]
        if self.is_published(address):
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
        if address.id in self.static:
            return self.static[address.id]
        if self.is_published(address):
            return self._registry().lookup_address(address.id, 0.0)
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


def add_to_local_table(table: AddressTable, addresses: Iterable[Address], socket_dir: str,
                       registry: Optional[Registry] = None) -> AddressTable:
    """Adds the addresses of a node added to a running local launch to `table` (as
    `local_address_table` would have) and registers the static ones with `registry`, where the
    nodes started before it find them."""
    for address in addresses:
        if address.tcp_only:
            table.published[address.id] = '127.0.0.1:0'
        else:
            endpoint = f'unix:{socket_dir}/a{uuid.uuid4().hex[:8]}.sock'
            table.static[address.id] = endpoint
            if registry is not None:
                registry.publish_address(address.id, endpoint)
    return table


def get_port_from_address(address: str) -> int:
    """The port of a 'host:port' address, e.g. of `address.resolve()` for an address a node
    allocated with `PyNode.allocate_address`, to start its own server on:

        server = courier.Server(port=lp.get_port_from_address(address.resolve()))

    A named port ('host:name', dm-launchpad's convention) is read from the environment variable
    `LP_PORT_<name>`.
    """
    if not isinstance(address, str):
        raise TypeError(f'get_port_from_address takes an address string, got {address!r}.')
    if address.startswith('unix:'):
        raise ValueError(f'{address!r} is a Unix socket and has no port. Only TCP addresses have '
                         'one: allocate the address with PyNode.allocate_address, which makes it '
                         "a 'host:port' address.")
    port = address.rsplit(':', 1)[-1]
    if port.isdigit():
        return int(port)
    value = os.environ.get(f'LP_PORT_{port}')
    if ':' in address and value is not None and value.isdigit():
        return int(value)
    raise ValueError(f"{address!r} is not a 'host:port' address (and LP_PORT_{port} names no "
                     'port): pass the string that address.resolve() returns.')
