"""Where a handle's client connects: `NodeEndpoint`, an address that follows a node's restarts and
gives up on it once the program stops.

A `CourierHandle` dereferences into a courier.Client whose address is a `NodeEndpoint` (a
`courier.AddressResolver`). courier calls it for the first call, and again after a call found the
server gone, so this is the one place where a client waits for its node:

* while the node is not serving (not up yet, or restarting after a failure), the call waits until
  it accepts connections: at the same Unix socket, or at the endpoint a restarted node published
  (SSH and Slurm nodes bind a new port when they start again);
* once the program is stopping, a node that no longer serves will not come back: the call fails at
  once with `NodeStoppedError` instead of waiting, and a call waiting here is released within a
  fifth of a second.

The transport underneath does not wait for servers itself (`wait_for_ready=False`): a call whose
node went away fails promptly (calls in flight at a crash fail with courier's
ServerUnavailableError) and the next call comes back here. What `wait_for_ready` also did, riding
out a connection that fails to establish while the node is up (gRPC's handshake on a loaded
machine), `NodeEndpoint.retry` does for a blocking call on a connection that has not carried a
call yet: courier asks it, and it has the call tried again while the node accepts connections,
within the call's timeout. A call on a connection that has carried calls is never repeated: it may
have reached the node. A client pickled into another node carries its NodeEndpoint (rather than
the endpoint it resolved), so it follows the node's restarts too.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, FrozenSet, Optional, TypeVar

import courier

from launchpad import runtime
from launchpad.address import Address
from launchpad.process.supervisor_endpoint import accepts

_MAX_PAUSE = 0.05     # seconds between checks while a node is down (Unix sockets: a local check)
_MAX_LOOKUP = 0.2     # ... and between asking the coordinator for a published endpoint


class NodeStoppedError(courier.ServerUnavailableError):
    """A call to a node that has ended while the program stops: it will not come back."""


class NodeLeftError(NodeStoppedError):
    """A call to a node that was removed from the running program (an elastic group's member
    that left): it will not come back."""


@dataclasses.dataclass(frozen=True)
class Retries:
    """Calls re-sent to the restarted instance of a node whose last instance went away while it
    had them (see docs/failures.md, "Retried calls").

    Attributes:
      attempts: how many times in all a call may be sent (2: once more), at least 1.
      methods: the methods whose calls are re-sent; None: every method.
    """
    attempts: int = 3
    methods: Optional[FrozenSet[str]] = None

    def __post_init__(self):
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f'Retries(attempts=...) is how many times in all a call may be sent, '
                             f'an int >= 1; got {self.attempts!r}.')
        if self.methods is not None:
            if isinstance(self.methods, str):
                raise TypeError(f'Retries(methods=...) is a collection of method names, got the '
                                f'string {self.methods!r}; write methods=[{self.methods!r}].')
            object.__setattr__(self, 'methods', frozenset(self.methods))

    def covers(self, method: str) -> bool:
        """Whether calls of `method` are re-sent."""
        return self.methods is None or method in self.methods


Method = TypeVar('Method', bound=Callable)


def idempotent(method: Method) -> Method:
    """Declares a served method safe to run more than once for one call: the handles of a
    `CourierNode` serving it re-send its calls to the node's restarted instance (up to 3 times
    in all; `handle.with_retries` says otherwise)."""
    method.__lp_idempotent__ = True
    return method


def idempotent_methods(cls) -> FrozenSet[str]:
    """The names of the methods of `cls` declared with `idempotent`."""
    return frozenset(name for name in dir(cls) if not name.startswith('_')
                     and getattr(getattr(cls, name, None), '__lp_idempotent__', False))


class NodeEndpoint(courier.AddressResolver):
    """The endpoint of a node's address, found when a client (re)connects (picklable).

    Args:
      address: the address placeholder.
      node_name: the node serving it, for messages.
      wait: wait for the node to serve (the client's `wait_for_ready`); False fails at once
        when its endpoint does not accept connections (it still waits for a node to publish
        its endpoint, up to the address table's lookup timeout, as clients always did).
      timeout: seconds to wait (the client's `call_timeout`); None waits until the program stops.
      retries: the calls re-sent to the node's next instance when it goes away (None: none).
    """

    def __init__(self, address: Address, node_name: str, wait: bool = True,
                 timeout: Optional[float] = None, retries: Optional[Retries] = None):
        self.address = address
        self.node_name = node_name
        self.wait = wait
        self.timeout = timeout
        self.retries = retries

    def serving(self) -> bool:
        """Whether the node accepts connections now, and the program is not stopping."""
        context = runtime.get_context()
        endpoint = context.address_table.current(self.address)
        return (not context.stop.event.is_set() and endpoint is not None
                and accepts(endpoint))

    def __call__(self) -> str:
        context = runtime.get_context()
        table = context.address_table
        published = table.is_published(self.address)
        started = time.monotonic()
        pause = 0.001
        asked = 0.0  # when the coordinator was last asked whether the node left
        while True:
            stopping = context.stop.event.is_set()
            endpoint = table.current(self.address)
            if endpoint is not None and accepts(endpoint):
                return endpoint
            where = f'at {endpoint}' if endpoint else '(it has not published its endpoint)'
            if time.monotonic() - asked >= _MAX_LOOKUP:
                asked = time.monotonic()
                if node_has_left(context, self.node_name):
                    raise self._left(f'is not serving {where}')
            if stopping:
                raise NodeStoppedError(
                    f'node {self.node_name} is not serving {where} and the program is stopping, '
                    'so it will not come back; a node that calls others while the program stops '
                    'can only reach those still running.')
            if endpoint is not None and not self.wait:
                raise courier.ServerUnavailableError(
                    f'node {self.node_name} is not serving {where} (its clients were made with '
                    'wait_for_ready=False, so calls do not wait for it to come up).')
            waited = time.monotonic() - started
            limit = table.lookup_timeout if endpoint is None else self.timeout
            if limit is not None and waited > limit:
                raise courier.ServerUnreachableTimeoutError(
                    f'node {self.node_name} was not serving {where} for {waited:.0f} s; look '
                    'for its error in the program output.')
            time.sleep(pause)
            pause = min(2 * pause, _MAX_LOOKUP if published else _MAX_PAUSE)

    def explain(self, error: courier.ServerUnavailableError) -> courier.ServerUnavailableError:
        """A call found the node gone: `NodeLeftError` if it was removed from the program (a
        client that had reached it learns so at its first failed call), else `error`."""
        try:
            context = runtime.get_context()
        except RuntimeError:  # a thread outside the program reads the call's future
            return error
        if node_has_left(context, self.node_name):
            return self._left('did not answer')
        return error

    def _left(self, what: str) -> NodeLeftError:
        return NodeLeftError(f'node {self.node_name} was removed from the program and {what}: '
                             'it will not come back.')

    def retry(self, elapsed: float) -> bool:
        """Whether a blocking call that could not connect goes again: while the node accepts
        connections, within the call's timeout (see the module docstring)."""
        if not self.wait or (self.timeout is not None and elapsed >= self.timeout):
            return False
        if not self.serving():
            return False
        time.sleep(_MAX_PAUSE)
        return True

    def resends(self, method: str) -> bool:
        """Whether calls of `method` (blocking ones and futures) are re-sent (`resend`)."""
        return self.retries is not None and self.retries.covers(method)

    def resend(self, method: str, sent: int) -> Optional[bool]:
        """Whether a call of `method` that lost the node `sent` times goes to its next instance:
        for a method its `retries` cover, while they allow and the program runs and the node
        was not removed (None for the others: see `retry`)."""
        if not self.resends(method):
            return None
        context = runtime.get_context()
        return (sent < self.retries.attempts and not context.stop.event.is_set()
                and not node_has_left(context, self.node_name))

    def __repr__(self) -> str:
        return f'NodeEndpoint({self.node_name}, {self.address})'


def node_client(address: Address, node_name: str, client_kwargs: dict) -> courier.Client:
    """A client of node `node_name` at `address` that waits for the node to serve, follows its
    restarts, and fails at once once the node has left or the program stops and it has ended."""
    context = runtime.get_context()
    kwargs = dict(client_kwargs)
    resolver = NodeEndpoint(address, node_name, wait=kwargs.pop('wait_for_ready', True),
                            timeout=kwargs.get('call_timeout'), retries=kwargs.pop('retries', None))
    static = context.address_table.static.get(address.id)  # a Unix socket needs no TLS
    tls = kwargs.pop('tls', context.tls_for(static or resolver))
    if context.auth_token is not None:  # the launching process's context carries it
        kwargs.setdefault('auth_token', context.auth_token)
    return courier.Client(resolver, wait_for_ready=False, tls=tls, **kwargs)


def node_has_left(context, node_name: str) -> bool:
    """Whether the coordinator says `node_name` was removed from the program."""
    if context.coordinator is None:
        return False
    try:
        return bool(context.coordinator.has_left(node_name))
    except Exception:  # pylint: disable=broad-except  (an older coordinator, or it is gone)
        return False


