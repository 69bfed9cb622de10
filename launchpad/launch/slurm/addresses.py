"""Which address a server binds inside a Slurm job: `NodeAddressTable`, and this host's address
towards a peer.

The table is pickled into every node's spec, so this module is imported in every job step. The
launcher and the in-job driver use the same helpers to choose the coordinator's address.
"""
from __future__ import annotations

import dataclasses
import socket
from typing import Callable, Union

from courier.transport import tcp_address

from launchpad.address import Address, AddressTable


@dataclasses.dataclass
class NodeAddressTable(AddressTable):
    """An address table whose published addresses bind, on whichever node the step runs, the
    address that node uses to reach the coordinator.

    Attributes:
      coordinator: the coordinator's endpoint, or a picklable callable that returns it (in a
        detached job the coordinator starts inside the job, after the specs are written).
    """
    coordinator: Union[str, Callable[[], str], None] = None

    def bind_target(self, address: Address) -> str:
        if address.id in self.published:
            coordinator = self.coordinator() if callable(self.coordinator) else self.coordinator
            return tcp_address(local_address(coordinator.rsplit(':', 1)[0].strip('[]')), 0)
        return super().bind_target(address)


def local_address(peer: str) -> str:
    """The address of this host on its route to `peer` (no packet is sent)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return probe.getsockname()[0]

