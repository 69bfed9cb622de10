"""`CourierNode`: serves a Python object's public methods over courier RPC."""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Optional

import courier

from launchpad import runtime
from launchpad.address import Address
from launchpad.nodes.base import Handle
from launchpad.nodes.endpoint import Retries, idempotent_methods, node_client
from launchpad.nodes.python import PyClassNode

CourierClient = courier.Client

# Seconds a stopping node lets calls in flight finish (one of them may be the call that stopped it).
_STOP_GRACE = 2.0


class _MethodsInContext:
    """The served object as courier binds it: its methods run in the node's context on the
    server's threads (which matters where several nodes share a process), and each call counts as
    the node's progress."""

    def __init__(self, instance: Any, context: runtime.NodeContext):
        self._instance = instance
        self._context = context

    def __dir__(self):
        return dir(self._instance)

    def __getattr__(self, name: str):
        value = getattr(self._instance, name)
        if callable(value) and name != 'set_courier_server':
            return runtime.in_context(self._context, value, progress=True)
        return value


class CourierHandle(Handle):
    """A handle that dereferences into a `courier.Client` of its node."""

    def __init__(self, node, address: Address, client_kwargs: Optional[dict] = None):
        super().__init__(node)
        self._address = address
        self._client_kwargs = dict(client_kwargs or {})

    @property
    def address(self) -> Address:
        return self._address

    def dereference(self) -> courier.Client:
        """A client that waits for the node to serve, follows its restarts, and fails at once
        once the program stops and the node has ended (see `endpoint`)."""
        return node_client(self._address, self._node_name, self._client_kwargs)

    def with_retries(self, attempts: int = 3,
                     methods: Optional[Iterable[str]] = None) -> 'CourierHandle':
        """A copy of this handle whose clients send a call again, to the node's restarted
        instance, when the node goes away while it has the call: up to `attempts` times in all,
        for `methods` (None: every method). `attempts=1` never does (the default of a handle,
        except for methods declared `lp.idempotent`). See docs/failures.md, "Retried calls"."""
        handle = copy.copy(self)
        handle._client_kwargs = {**self._client_kwargs,  # pylint: disable=protected-access
                                 'retries': Retries(attempts, methods)}
        return handle


class CourierNode(PyClassNode):
    """Builds `cls(*args, **kwargs)` where it runs and serves its public methods.

    If the object has a `run()` method it is called once the server is up, and the server stops when
    it returns; otherwise (or after `disable_run()`) the node serves until the program stops.

    Args:
      cls: the class (or any callable) that builds the served object.
      courier_kwargs: keyword arguments for `courier.Server`, e.g. `thread_pool_size`.
      courier_client_kwargs: keyword arguments for the clients handles dereference into.
    """

    def __init__(self, cls: Callable[..., Any], *args, courier_kwargs: Optional[dict] = None,
                 courier_client_kwargs: Optional[dict] = None, **kwargs):
        super().__init__(cls, *args, **kwargs)
        self._address = Address('courier')
        self._addresses.append(self._address)
        self._courier_kwargs = dict(courier_kwargs or {})
        self._client_kwargs = dict(courier_client_kwargs or {})
        declared = idempotent_methods(cls) if isinstance(cls, type) else frozenset()
        if declared:  # their calls are re-sent to a restarted instance
            self._client_kwargs.setdefault('retries', Retries(methods=declared))

    def create_handle(self) -> CourierHandle:
        return CourierHandle(self, self._address, self._client_kwargs)

    def run_in_context(self) -> None:
        context = runtime.get_context()
        instance = self._call()
        table = context.address_table
        bind_target = table.bind_target(self._address)
        server = courier.Server(address=bind_target,
                                **{'tls': context.tls_for(bind_target), **self._courier_kwargs})
        owns_server = callable(getattr(instance, 'set_courier_server', None))
        server.bind_object(_MethodsInContext(instance, context))
        if not owns_server:
            server.Start()
        try:
            table.publish(self._address, server.address)
            if self._run_enabled and callable(getattr(instance, 'run', None)):
                instance.run()
            else:
                context.stop.watched().wait()  # serves until the program stops
        finally:
            if not owns_server:
                server.Stop(grace=_STOP_GRACE)
