"""`lp.Pool`: `multiprocessing.Pool`'s API over launchpad worker nodes, on any launch type.

Standalone, a pool launches and owns a program of `PoolWorkerNode`s, and its workers call back
to register; inside a program, it runs on the worker handles a node was given:

    with lp.Pool(8, launch_type='ssh', resources=lp.SshHosts(['a', 'b'])) as pool:
        print(sum(pool.map(score, candidates)))

    launching process (standalone)                    the pool's program
    ------------------------------                    ------------------
    Pool -- map/imap/apply_async --> Dispatcher --courier--> pool/0 .. pool/N-1 (PoolWorkerNode)
     |                                                            | register(key, endpoint, pid)
     +- registry server (Unix socket or TCP, the pool's token) <--+ at start, after each restart
     +- monitor thread: the program ended or failed -> every pending task fails with its error

A worker that dies has its tasks re-run on the others (see dispatch.py); a task that raises is
not retried: its exception reaches the caller with the remote traceback as its cause.
"""
from __future__ import annotations

import functools
import itertools
import os
import secrets
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import courier
from courier import serialization

from launchpad import runtime
from launchpad.context import is_local_launch_or_test
from launchpad.launch.launcher import launch
from launchpad.nodes.group import GroupClient
from launchpad.pool.dispatch import Dispatcher
from launchpad.pool.results import (AsyncResult, IMapIterator, IMapUnorderedIterator, Job,
                                    MapResult, Task)
from launchpad.pool.worker import PoolWorkerNode, Registry, WorkerRef, pack_chunk, pack_function
from launchpad.program import Program

_RUN, _CLOSE, _TERMINATE = 'running', 'closed', 'terminated'
_GROUP = 'pool'

Worker = Union[WorkerRef, courier.Client]


class PoolTerminatedError(RuntimeError):
    """The pool was terminated (or its program ended) before the task was done."""


class Pool:
    """A pool of worker processes with `multiprocessing.Pool`'s methods.

    Standalone (`workers` not given): launches a program of `processes` `lp.PoolWorkerNode`s
    in group 'pool' with `launch_type` and `resources` (the group's resources, or a mapping
    {'pool': ...}), and stops it on `close()`+`join()`, `terminate()` or when the script ends.
    Inside a program: `lp.Pool(workers=handles)` in a node given worker handles (or
    `courier.Client`s of nodes serving `lp.PoolWorker`).

    Args:
      processes: how many workers to launch (default: os.cpu_count()).
      initializer, initargs: `initializer(*initargs)` runs once in every worker process, and again
        in a restarted one.
      maxtasksperchild: must be None (workers are not recycled; a dead one is restarted).
      workers: worker handles (as clients) to run on instead of launching a program, or an
        `lp.GroupClient` of a group of `lp.PoolWorkerNode`s: the pool follows the group as it
        grows and shrinks (members that join get tasks, those that leave get none).
      launch_type: how to launch the standalone program (default 'local_mp').
      resources: the workers' resources, e.g. `lp.SshHosts([...])` for ssh.
      max_restarts: how many times each worker process is restarted after dying.
      prefetch: tasks in flight per worker (the next one waits in the worker).
      pool_host: the launching machine's address the workers call back to (remote launch types;
        default: every address of this machine is tried).
      name: the standalone program's name.
      start_timeout: seconds a standalone pool waits for all its workers to answer before it
        returns (a TimeoutError after them).
      **launch_options: other `lp.launch` keyword arguments (terminal=, tls=, notice_period=).
    """

    def __init__(self, processes: Optional[int] = None, initializer: Optional[Callable] = None,
                 initargs: Sequence[Any] = (), maxtasksperchild: Optional[int] = None, *,
                 workers: Union[Sequence[Worker], GroupClient, None] = None,
                 launch_type: Optional[str] = None,
                 resources: Any = None, max_restarts: int = 100, prefetch: int = 2,
                 pool_host: Optional[str] = None, name: str = 'pool',
                 start_timeout: float = 300.0, **launch_options):
        if maxtasksperchild is not None:
            raise ValueError('maxtasksperchild is not supported: pool workers are not recycled '
                             '(a worker that dies is restarted). Leave it None.')
        if initializer is not None and not callable(initializer):
            raise TypeError(f'initializer must be callable, got {initializer!r}.')
        self._state = _RUN
        self._lock = threading.Lock()
        self._controller = None
        self._server: Optional[courier.Server] = None
        self._tmpdir: Optional[str] = None
        self._endpoints: dict = {}
        self._shut_down = False
        group = workers if isinstance(workers, GroupClient) else None
        if group is not None:  # an elastic group: its members now, and those that join later
            workers = list(group.members().items())
        if workers is not None:
            if processes is not None or launch_type is not None or resources is not None:
                raise ValueError('Pass either workers= (a pool inside a program) or processes, '
                                 'launch_type and resources (a pool that launches its own '
                                 'program), not both.')
            workers = list(workers)
            if not workers and group is None:
                raise ValueError('workers= is empty: a pool needs at least one worker.')
            for worker in workers:
                _check_worker(worker[1] if group is not None else worker)
            self._size = len(workers)
        else:
            processes = (os.cpu_count() or 1) if processes is None else processes
            if not isinstance(processes, int) or processes < 1:
                raise ValueError(f'Number of processes must be at least 1, got {processes!r}.')
            self._size = processes
        init = None
        if initializer is not None:
            key, function = pack_function(initializer)
            init_args = serialization.cloudpickle_dumps(tuple(initargs))
            init = lambda client: client.initialize(key, function, init_args)  # noqa: E731
        self._dispatcher = Dispatcher(prefetch=prefetch, initialize=init)
        if workers is not None:
            for worker in workers:
                if group is not None:
                    self._add_worker(worker[1], key=worker[0])
                else:
                    self._add_worker(worker)
            if group is not None:
                self._follow(group, {name for name, _ in workers})
            return
        try:
            self._launch(processes, launch_type or 'local_mp', resources, max_restarts,
                         pool_host, name, launch_options)
            self._wait_for_workers(processes, start_timeout)
        except BaseException:
            self.terminate()
            raise

    # --- multiprocessing.Pool's methods -------------------------------------------------------

    def apply(self, func: Callable, args: Sequence = (), kwds: Optional[Mapping] = None) -> Any:
        """`func(*args, **kwds)` in a worker; blocks until it returns."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable, args: Sequence = (), kwds: Optional[Mapping] = None,
                    callback: Optional[Callable] = None,
                    error_callback: Optional[Callable] = None) -> AsyncResult:
        """Starts `func(*args, **kwds)` in a worker; returns an `AsyncResult`."""
        self._check_running()
        job = AsyncResult(callback, error_callback)
        self._dispatcher.submit(self._tasks(job, _pack(func), [(tuple(args), dict(kwds or {}))],
                                            1, 'apply'))
        return job

    def map(self, func: Callable, iterable: Iterable, chunksize: Optional[int] = None) -> List:
        """`[func(x) for x in iterable]`, computed by the workers, in order."""
        return self._map_async(func, iterable, 'call', chunksize).get()

    def map_async(self, func: Callable, iterable: Iterable, chunksize: Optional[int] = None,
                  callback: Optional[Callable] = None,
                  error_callback: Optional[Callable] = None) -> MapResult:
        """Starts `map`; returns a `MapResult`."""
        return self._map_async(func, iterable, 'call', chunksize, callback, error_callback)

    def starmap(self, func: Callable, iterable: Iterable[Iterable],
                chunksize: Optional[int] = None) -> List:
        """`[func(*args) for args in iterable]`, computed by the workers, in order."""
        return self._map_async(func, iterable, 'star', chunksize).get()

    def starmap_async(self, func: Callable, iterable: Iterable[Iterable],
                      chunksize: Optional[int] = None, callback: Optional[Callable] = None,
                      error_callback: Optional[Callable] = None) -> MapResult:
        """Starts `starmap`; returns a `MapResult`."""
        return self._map_async(func, iterable, 'star', chunksize, callback, error_callback)

    def imap(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> IMapIterator:
        """Like `map`, lazily: an iterator of the results in order, as they come."""
        return self._imap(IMapIterator(), func, iterable, chunksize)

    def imap_unordered(self, func: Callable, iterable: Iterable,
                       chunksize: int = 1) -> IMapUnorderedIterator:
        """Like `imap`, in the order results come."""
        return self._imap(IMapUnorderedIterator(), func, iterable, chunksize)

    def close(self) -> None:
        """No more tasks; the workers end once the submitted ones are done (see `join`)."""
        with self._lock:
            if self._state == _RUN:
                self._state = _CLOSE

    def terminate(self) -> None:
        """Stops the workers now; tasks not done fail with PoolTerminatedError."""
        with self._lock:
            self._state = _TERMINATE
        self._shutdown(PoolTerminatedError('the pool was terminated before the task was done'))

    def join(self) -> None:
        """Waits for the submitted tasks and for the workers to end; after close() or
        terminate()."""
        with self._lock:
            if self._state == _RUN:
                raise ValueError('Pool is still running: call close() or terminate() first.')
        self._dispatcher.wait_idle()
        self._shutdown(PoolTerminatedError('the pool was closed'))

    def __enter__(self) -> 'Pool':
        self._check_running()
        return self

    def __exit__(self, *exc_info) -> None:
        self.terminate()

    def __repr__(self) -> str:
        return f'<lp.Pool state={self._state} workers={self._size}>'

    # --- Growing and shrinking (for elastic groups) ------------------------------------------

    def _add_worker(self, worker: Worker, key: Optional[str] = None) -> None:
        """Adds a worker while the pool runs: a `WorkerRef`, or a `courier.Client` of a node
        serving `PoolWorker`. It gets tasks as soon as it answers."""
        _check_worker(worker)
        if isinstance(worker, WorkerRef):
            self._dispatcher.add_worker(key or worker.key, worker.connect)
        else:
            self._dispatcher.add_worker(key or repr(worker), functools.partial(_fresh, worker))

    def _follow(self, group: GroupClient, members: set) -> None:
        """Adds the members that join `group` as workers, and removes those that leave, from a
        thread of its own until the pool shuts down."""
        context = runtime.get_context()

        def follow():
            runtime.set_thread_context(context)
            known = set(members)
            while not self._shut_down and not context.stop.event.is_set():
                try:
                    if not group.wait_for_change(0.5):
                        continue
                    current = group.members()
                except Exception:  # pylint: disable=broad-except  (the program stops)
                    return
                for name in known - set(current):
                    self._remove_worker(name)
                for name in set(current) - known:
                    if current[name] is not None:
                        self._add_worker(current[name], key=name)
                known = set(current)
                self._size = len(known)

        threading.Thread(target=follow, daemon=True, name=f'lp-pool-{group.label}').start()

    def _remove_worker(self, key: str) -> None:
        """Gives worker `key` no more tasks; the ones it holds finish."""
        self._dispatcher.remove_worker(key)

    def _workers(self) -> dict:
        """Live workers: key -> {'pid': ..., 'host': ...}."""
        return self._dispatcher.workers()

    @property
    def stats(self):
        """Counters: workers 'joined', 'lost', 'revived'; tasks 'requeued', 'duplicates'."""
        return self._dispatcher.stats

    # --- Inside -------------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state != _RUN:
            raise ValueError('Pool not running')

    def _tasks(self, job: Job, packed: Tuple[str, bytes], items: Sequence, chunksize: int,
               mode: str, start: int = 0) -> List[Task]:
        """The tasks of `items`, `chunksize` at a time, for the function `packed` by `_pack`."""
        key, function = packed
        tasks = []
        for offset in range(0, len(items), chunksize):
            chunk = items[offset:offset + chunksize]
            data, buffers = pack_chunk(chunk)
            tasks.append(Task(job, start + offset, (key, function, data, buffers, mode),
                              len(chunk)))
        return tasks

    def _map_async(self, func, iterable, mode, chunksize, callback=None, error_callback=None):
        self._check_running()
        items = list(iterable)
        if chunksize is None:
            chunksize, extra = divmod(len(items), self._size * 4)
            chunksize = max(1, chunksize + bool(extra))
        _check_chunksize(chunksize)
        job = MapResult(len(items), callback, error_callback)
        self._dispatcher.submit(self._tasks(job, _pack(func), items, chunksize, mode))
        return job

    def _imap(self, job: IMapIterator, func, iterable, chunksize):
        self._check_running()
        _check_chunksize(chunksize)
        if not callable(func):
            raise TypeError(f'The pool needs a callable, got {func!r}.')

        def feed():
            count, packed = 0, None
            try:
                iterator = iter(iterable)
                while True:
                    chunk = list(itertools.islice(iterator, chunksize))
                    if not chunk:
                        break
                    packed = packed or _pack(func)  # once, not per chunk
                    self._dispatcher.submit(self._tasks(job, packed, chunk, chunksize, 'call',
                                                        count))
                    count += len(chunk)
            except BaseException as error:  # pylint: disable=broad-except
                job.fail(error)
            else:
                job.set_length(count)

        threading.Thread(target=feed, name='lp-pool-feeder', daemon=True).start()
        return job

    def _launch(self, processes, launch_type, resources, max_restarts, pool_host, name,
                launch_options) -> None:
        token = secrets.token_hex(16)
        tls = launch_options.get('tls')
        if is_local_launch_or_test(launch_type):
            self._tmpdir = tempfile.mkdtemp(prefix='launchpad-pool-')
            self._server = courier.Server(address=f'unix:{self._tmpdir}/pool.sock',
                                          auth_token=token)
            candidates = [self._server.address]
        else:
            self._server = courier.Server(host=pool_host or '0.0.0.0', auth_token=token, tls=tls)
            port = self._server.address.rpartition(':')[2]
            candidates = [f'{host}:{port}' for host in ([pool_host] if pool_host
                                                         else _machine_addresses())]
        registry = Registry(candidates, token, None if self._tmpdir else tls)
        self._server.Bind('ping', lambda: True)
        self._server.Bind('register', functools.partial(self._register, registry))
        self._server.Start()
        program = Program(name)
        with program.group(_GROUP):
            for _ in range(processes):
                program.add_node(PoolWorkerNode(max_restarts, registry=registry))
        if resources is not None and not isinstance(resources, Mapping):
            resources = {_GROUP: resources}
        self._controller = launch(program, launch_type=launch_type, resources=resources,
                                  **launch_options)
        threading.Thread(target=self._watch_program, name='lp-pool-monitor', daemon=True).start()
        register = getattr(threading, '_register_atexit', None)
        if register is not None:  # runs before the launcher's own wait for the program
            register(self._at_exit)

    def _wait_for_workers(self, count: int, timeout: float) -> None:
        """Returns once `count` workers answer; raises if the program ends or time runs out."""
        deadline = time.monotonic() + timeout
        while len(self._workers()) < count:
            if self._controller.done:
                self._controller.wait()  # raises the failure, if a node failed
                raise PoolTerminatedError(f'the pool\'s program ended before its {count} '
                                          'workers started')
            if time.monotonic() > deadline:
                raise TimeoutError(f'Only {len(self._workers())} of the pool\'s {count} workers '
                                   f'answered within {timeout:g} s; see the program\'s output.')
            time.sleep(0.02)

    def _register(self, registry: Registry, key: str, endpoint: str, info: dict) -> None:
        self._endpoints[key] = endpoint

        def connect() -> courier.Client:
            return registry.client(self._endpoints[key])

        self._dispatcher.add_worker(key, connect, info)

    def _watch_program(self) -> None:
        try:
            self._controller.wait()
            error: BaseException = PoolTerminatedError(
                f'the pool\'s program {self._controller.program_name!r} ended')
        except Exception as failure:  # pylint: disable=broad-except
            error = failure
        self._dispatcher.end(error)

    def _at_exit(self) -> None:
        if not self._shut_down:
            self.terminate()

    def _shutdown(self, error: BaseException) -> None:
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        self._dispatcher.end(error)
        self._dispatcher.join()
        if self._controller is not None:
            self._controller.stop()
        if self._server is not None:
            self._server.Stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def _check_worker(worker: Any) -> None:
    if not isinstance(worker, (WorkerRef, courier.Client)):
        raise TypeError(f'A pool worker is a pool worker handle (lp.PoolWorkerNode) or a '
                        f'courier.Client of a node serving lp.PoolWorker, got {worker!r}.')


def _check_chunksize(chunksize: Any) -> None:
    if not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError(f'Chunksize must be 1+, not {chunksize!r}.')


def _fresh(client: courier.Client) -> courier.Client:
    """A new client to the same server (a dead connection is not reused)."""
    return courier.Client(**client.__getstate__())


def _machine_addresses() -> List[str]:
    """This machine's IPv4 addresses, loopback last: where remote workers may reach the pool."""
    import psutil  # pylint: disable=import-outside-toplevel
    import socket  # pylint: disable=import-outside-toplevel
    found = [entry.address for entries in psutil.net_if_addrs().values() for entry in entries
             if entry.family == socket.AF_INET]
    return sorted(set(found), key=lambda address: address.startswith('127.'))


def _pack(func: Callable) -> Tuple[str, bytes]:
    """`pack_function(func)`, for a callable only."""
    if not callable(func):
        raise TypeError(f'The pool needs a callable, got {func!r}.')
    return pack_function(func)
