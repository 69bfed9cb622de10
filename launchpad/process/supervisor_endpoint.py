"""`SupervisorEndpoint`: the coordinator's address as a detached program's node calls it, so that
its calls outlive the supervisor that serves the coordinator.

A detached program's supervisor (Slurm's in-job driver, a local or SSH supervisor daemon, a
Kubernetes coordinator pod) may be killed and replaced by a new one, which re-adopts the program
and serves the same coordinator state at the endpoint the nodes know. A node's call to the
coordinator that is in flight when the supervisor dies (a report, an address lookup, a group
call) fails with courier's `ServerUnavailableError` ("the server went away"). With this resolver
as its address, the client sends such a call again once a server accepts connections at the
coordinator's endpoint: it waits up to the program's supervisor grace for the next supervisor,
then fails with `SupervisorGoneError`, which says so.

Every call of the node face may go again: a report, a lookup or a group call means the same
the second time (a failure is counted once per run of a node), and the new supervisor may not
have persisted what the dead one heard.
"""
from __future__ import annotations

import socket
import time
from typing import Callable, Optional, Union

import courier

_PAUSE = 0.1          # seconds between looks for the next supervisor
_PROBE_TIMEOUT = 2.0  # seconds a connection attempt may take
# How many times in all a call may be sent: each send after the first found a new supervisor
# first (the batch script replaces a killed driver at most `slurm.shared.DRIVER_RESTARTS` times).
_MAX_SENDS = 8


class SupervisorGoneError(courier.ServerUnavailableError):
    """No supervisor served a detached program's coordinator within the supervisor grace."""


def accepts(endpoint: str) -> bool:
    """Whether a server accepts connections at `endpoint` (a connection made and closed)."""
    try:
        if endpoint.startswith('unix:'):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(_PROBE_TIMEOUT)
                probe.connect(endpoint[len('unix:'):])
        else:
            host, port = endpoint.rsplit(':', 1)
            socket.create_connection((host.strip('[]'), int(port)), _PROBE_TIMEOUT).close()
        return True
    except (OSError, ValueError):
        return False


class SupervisorEndpoint(courier.AddressResolver):
    """The coordinator's endpoint (`address`: a str, or a picklable callable returning it, which
    may raise OSError while no supervisor has written it), found when a client (re)connects:
    waits up to `grace` seconds for a server to accept connections there; every call that lost
    its server goes again (see the module docstring)."""

    def __init__(self, address: Union[str, Callable[[], str]], grace: float):
        self.address = address
        self.grace = grace

    def __call__(self) -> str:
        deadline = time.monotonic() + self.grace
        endpoint: Optional[str] = None
        while True:
            try:
                endpoint = self.address() if callable(self.address) else self.address
            except OSError:
                endpoint = None  # (not written yet, or no more)
            if endpoint is not None and accepts(endpoint):
                return endpoint
            if time.monotonic() >= deadline:
                where = f'at {endpoint}' if endpoint else f'({self.address!r} names none)'
                raise SupervisorGoneError(
                    f'No supervisor took over the program\'s coordinator {where} within the '
                    f'supervisor grace of {self.grace:g} s after the last one was lost: the '
                    'program\'s nodes stop. (A killed supervisor is replaced where it ran, or by '
                    '`python -m launchpad.launch attach --recover PROGRAM`.)')
            time.sleep(_PAUSE)

    def resends(self, method: str) -> bool:
        del method
        return True

    def resend(self, method: str, sent: int) -> bool:
        del method
        return sent < _MAX_SENDS

    def __repr__(self) -> str:
        return f'SupervisorEndpoint({self.address!r}, grace={self.grace:g})'
