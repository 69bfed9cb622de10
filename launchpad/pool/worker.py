"""Pool workers: the object that runs a pool's tasks, and the node that serves it and survives
its death.

A `PoolWorkerNode` is a process colocation (`lp.MultiProcessingColocation`) around one inner
node serving a `PoolWorker`. The inner node runs in a sub-process of the colocation, so when it
dies (SIGKILL, a crash in native code, `os._exit`) the colocation restarts it instead of the
program failing; the pool re-queues what it held and reconnects when it is back.

    colocation process (the node 'pool/3')      inner process (the node 'pool/3/0')
    --------------------------------------      -----------------------------------
    _Supervisor: starts, watches, restarts  -->  courier server: PoolWorker.execute/ping/...
                                                 registers with the standalone pool, if any

Inside a program, a worker's handle dereferences into a `WorkerRef` for `lp.Pool(workers=...)`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import multiprocessing
import os
import pickle
import socket
import threading
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

import courier
from courier import serialization

from launchpad import runtime
from launchpad.address import Address
from launchpad.nodes.base import Handle, Node
from launchpad.nodes.colocation import MultiProcessingColocation

MODES = ('call', 'star', 'apply')
_FUNCTIONS_KEPT = 32
_CLAIMS_KEPT = 4096  # task ids run or withdrawn; far more than the tasks in flight to a worker
_STOP_GRACE = 2.0


def pack_chunk(items: Sequence[Any]) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    """The items of a task as cloudpickle bytes plus out-of-band buffers (large arrays are not
    copied into the bytes; courier sends them as buffers). cloudpickle, since arguments may be
    instances of classes of the caller's `__main__`, which workers cannot import."""
    buffers: List[pickle.PickleBuffer] = []
    data = serialization.cloudpickle_dumps(list(items), buffer_callback=buffers.append)
    return data, buffers


def pack_function(function: Any) -> Tuple[str, bytes]:
    """A function as (key, cloudpickle bytes): functions of `__main__` travel by value (with
    their file names, for the tracebacks of failed tasks)."""
    data = serialization.cloudpickle_dumps(function)
    return f'{len(data)}-{hash(data)}', data


class PoolWorker:
    """Runs a pool's tasks, one chunk at a time, in the process that serves it.

    A task that raises does not hurt the worker: the exception (or, if it cannot be pickled, a
    `courier.RemoteError` describing it) travels back with its traceback as that item's outcome.
    A pool sends a worker its next task while the current one runs (prefetch); `withdraw` takes
    back such a task that has not started, so that an idle worker can run it instead.
    """

    def __init__(self):
        self._lock = threading.Lock()  # tasks run one at a time, as in a multiprocessing worker
        self._claims_lock = threading.Lock()
        self._claims: collections.OrderedDict = collections.OrderedDict()  # task id -> ran?
        self._functions: Dict[str, Any] = {}
        self._initialized: set = set()

    def ping(self) -> Dict[str, Any]:
        """Who answers: the process id and host name (a restarted worker has a new pid)."""
        return {'pid': os.getpid(), 'host': socket.gethostname()}

    def initialize(self, key: str, function: bytes, args: bytes,
                   authkey: Optional[bytes] = None) -> None:
        """Runs the pool's initializer once in this process (like multiprocessing's); `authkey`
        is the pool's process's, for the `multiprocessing.Manager()` proxies in its arguments."""
        with self._lock:
            if key in self._initialized:
                return
            _adopt_authkey(authkey)
            pickle.loads(function)(*pickle.loads(args))
            self._initialized.add(key)

    def execute(self, key: str, function: bytes, data: bytes, buffers: Sequence[Any],
                mode: str, authkey: Optional[bytes] = None, task: Optional[str] = None
                ) -> Optional[List[Tuple[bool, Any]]]:
        """Calls the function on every item of a chunk: `fn(x)` ('call'), `fn(*x)` ('star') or
        `fn(*args, **kwargs)` for x = (args, kwargs) ('apply'). Returns an outcome per item, or
        None if the chunk's `task` id was withdrawn before it started. `authkey`: as for
        `initialize`."""
        if mode not in MODES:
            raise ValueError(f'Unknown task mode {mode!r}; expected one of {MODES}.')
        with self._lock:
            if task is not None and not self._claim(task, run=True):
                return None
            _adopt_authkey(authkey)
            fn = self._function(key, function)
            items = pickle.loads(data, buffers=buffers)
            outcomes = []
            for item in items:
                try:
                    if mode == 'call':
                        value = fn(item)
                    elif mode == 'star':
                        value = fn(*item)
                    else:
                        value = fn(*item[0], **item[1])
                except Exception as error:  # pylint: disable=broad-except
                    outcomes.append((False, _portable(error)))
                else:
                    outcomes.append((True, value))
            return outcomes

    def withdraw(self, task: str) -> bool:
        """Takes back task `task` (an `execute` call sent or about to be): True if it had not
        started and now never will (that call returns None when its turn comes), False if it
        started."""
        return self._claim(task, run=False)

    def _claim(self, task: str, run: bool) -> bool:
        """The first of running and withdrawing `task` wins; True if `run` is that one."""
        with self._claims_lock:
            if task not in self._claims:
                self._claims[task] = run
                if len(self._claims) > _CLAIMS_KEPT:
                    self._claims.popitem(last=False)
            return self._claims[task] == run

    def _function(self, key: str, data: bytes) -> Any:
        fn = self._functions.get(key)
        if fn is None:
            if len(self._functions) >= _FUNCTIONS_KEPT:
                self._functions.clear()
            fn = self._functions[key] = pickle.loads(data)
        return fn


def _adopt_authkey(authkey: Optional[bytes]) -> None:
    """Makes `authkey` this process's multiprocessing authkey, as multiprocessing's workers
    inherit their parent's: a `multiprocessing.Manager()` proxy unpickled here then calls its
    manager with it."""
    process = multiprocessing.current_process()
    if authkey is not None and process.authkey != authkey:
        process.authkey = authkey


def _portable(error: BaseException) -> BaseException:
    """`error` ready to travel: its traceback attached (`remote_traceback`), or, if it cannot be
    pickled, a `courier.RemoteError` naming its type and message."""
    text = ''.join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        error.remote_traceback = text
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # pylint: disable=broad-except
        return courier.RemoteError(f'{type(error).__name__}: {error}',
                                   remote_type=type(error).__qualname__, remote_traceback=text)


@dataclasses.dataclass
class Registry:
    """Where a standalone pool listens for its workers: they call `register` when they start.

    Attributes:
      candidates: addresses that may reach the pool's registry server (a Unix socket for local
        launches; each of the launching machine's addresses otherwise); the first that answers
        is used.
      auth_token: the pool's own secret (its workers' servers require it too).
      tls: TLS credentials for TCP traffic, or None.
    """
    candidates: List[str]
    auth_token: str
    tls: Any = None

    def register(self, key: str, endpoint: str, info: Dict[str, Any]) -> None:
        """Tells the pool that worker `key` serves at `endpoint` (tries every candidate)."""
        clients = [self.client(address, call_timeout=10.0) for address in self.candidates]
        executor = concurrent.futures.ThreadPoolExecutor(len(clients))
        try:
            futures = {executor.submit(client.ping): client for client in clients}
            for future in concurrent.futures.as_completed(futures):
                if future.exception() is None:
                    futures[future].register(key, endpoint, info)
                    return
        finally:
            executor.shutdown(wait=False)
        raise ConnectionError(f'Pool worker {key} cannot reach its pool at any of '
                              f'{self.candidates}: {future.exception()}. Pass '
                              'lp.Pool(..., pool_host=ADDRESS) with the address of the launching '
                              'machine that the workers\' hosts can reach.')

    def client(self, address: str, **kwargs: Any) -> courier.Client:
        """A client of `address` (the pool's, or a worker's) with the pool's token and TLS."""
        return courier.Client(address, wait_for_ready=False, auth_token=self.auth_token,
                              tls=None if address.startswith('unix:') else self.tls, **kwargs)


class _WorkerServerNode(Node):
    """Serves a `PoolWorker` on its address; with a registry, with the pool's token, and
    registers there once it serves."""

    def __init__(self, registry: Optional[Registry]):
        super().__init__()
        self._registry = registry
        self._address = Address('pool-worker')
        self._addresses.append(self._address)

    def create_handle(self) -> Handle:
        return WorkerHandle(self, self._address)

    def run_in_context(self) -> None:
        context = runtime.get_context()
        table = context.address_table
        target = table.bind_target(self._address)
        token = self._registry.auth_token if self._registry else None
        server = courier.Server(address=target, auth_token=token, tls=context.tls_for(target))
        worker = PoolWorker()
        server.bind_object(worker)
        server.Start()
        try:
            table.publish(self._address, server.address)
            if self._registry is not None:
                self._registry.register(self.name, server.address, worker.ping())
            context.stop.event.wait()
        finally:
            server.Stop(grace=_STOP_GRACE)


@dataclasses.dataclass
class WorkerRef:
    """What a pool worker's handle gives inside a program: `connect()` makes a client of the
    worker's current incarnation (a restarted worker may serve at a new endpoint)."""
    key: str
    address: Address
    context: Any = dataclasses.field(default=None, repr=False)

    def connect(self) -> courier.Client:
        context = self.context or runtime.get_context()
        endpoint = context.address_table.resolve(self.address)
        return courier.Client(endpoint, wait_for_ready=False, tls=context.tls_for(endpoint))

    def __getstate__(self):
        return {'key': self.key, 'address': self.address, 'context': None}


class WorkerHandle(Handle):
    """The handle of a pool worker; dereferences into a `WorkerRef`."""

    def __init__(self, node: _WorkerServerNode, address: Address):
        super().__init__(node)
        self._address = address
        self._key = node.name or node.node_id

    def dereference(self) -> WorkerRef:
        return WorkerRef(self._key, self._address, runtime.get_context())


class PoolWorkerNode(MultiProcessingColocation):
    """A pool worker: a node whose worker process is restarted (up to `max_restarts` times)
    when it dies, instead of ending the program. Pass the handles to a node that builds
    `lp.Pool(workers=[...])`:

        with program.group('pool'):
            workers = [program.add_node(lp.PoolWorkerNode()) for _ in range(8)]
        program.add_node(lp.PyNode(main, workers), label='main')

        def main(workers):
            with lp.Pool(workers=workers) as pool:
                print(pool.map(score, range(100)))

    Args:
      max_restarts: restarts of the worker process before the node (and the program) fails.
      registry: set by a standalone `lp.Pool`: where the worker registers.
    """

    def __init__(self, max_restarts: int = 100, *, registry: Optional[Registry] = None):
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f'max_restarts must be an integer >= 0, got {max_restarts!r}.')
        self._server_node = _WorkerServerNode(registry)
        super().__init__([self._server_node], num_retries_on_failure=max_restarts)

    def create_handle(self) -> Handle:
        return self._server_node.create_handle()
