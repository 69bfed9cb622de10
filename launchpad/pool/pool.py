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

The threads, the registry server and the at-exit hook hold the pool's `_Parts`, never the `Pool`:
a pool dropped while it runs is collected, warns (ResourceWarning, as multiprocessing's does) and
is stopped by its finalizer.
"""
from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import secrets
import shutil
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import courier
from courier import serialization

from launchpad import runtime
from launchpad.context import is_local_launch_or_test
from launchpad.launch.launcher import launch
from launchpad.nodes.group import GroupClient
from launchpad.pool.dispatch import Dispatcher, PoolTerminatedError
from launchpad.pool.results import (AsyncResult, IMapIterator, IMapUnorderedIterator, Job,
                                    MapResult, Task)
from launchpad.pool.worker import PoolWorkerNode, Registry, WorkerRef, pack_chunk, pack_function
from launchpad.process import tempdirs
from launchpad.program import Program

_RUN, _CLOSE, _TERMINATE = 'RUN', 'CLOSE', 'TERMINATE'  # multiprocessing.pool's `_state`s
_GROUP = 'pool'
_POOL_OWNS = ('launch_type', 'resources', 'local_resources', 'tls', 'test_case')

Worker = Union[WorkerRef, courier.Client]


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
        in a restarted one. If it raises, the pool fails: construction (standalone) or its tasks
        raise a PoolTerminatedError whose cause is the initializer's exception.
      maxtasksperchild: must be None (workers are not recycled; a dead one is restarted).
      workers: worker handles (as clients) to run on instead of launching a program, or an
        `lp.GroupClient` of a group of `lp.PoolWorkerNode`s: the pool follows the group as it
        grows and shrinks (members that join get tasks, those that leave get none).
      launch_type: how to launch the standalone program (default 'local_mp').
      resources: the workers' resources, e.g. `lp.SshHosts([...])` for ssh.
      max_restarts: how many times each worker process is restarted after dying.
      prefetch: tasks in flight per worker (the next one waits in the worker, and moves to a
        worker that falls idle).
      pool_host: the launching machine's address the workers call back to (remote launch types;
        default: every address of this machine is tried).
      name: the standalone program's name.
      start_timeout: seconds a standalone pool waits for all its workers to answer, and a pool on
        a group for its first member, before it raises TimeoutError.
      tls: a `courier.TLSConfig` for the standalone program (`lp.launch(tls=...)`) and the pool's
        own server.
      launch_options: other keyword arguments of `lp.launch` for the standalone program, e.g.
        {'terminal': 'output_to_files', 'notice_period': 5}, or a launcher's own options.
    """

    def __init__(self, processes: Optional[int] = None, initializer: Optional[Callable] = None,
                 initargs: Sequence[Any] = (), maxtasksperchild: Optional[int] = None, *,
                 workers: Union[Sequence[Worker], GroupClient, None] = None,
                 launch_type: Optional[str] = None,
                 resources: Any = None, max_restarts: int = 100, prefetch: int = 2,
                 pool_host: Optional[str] = None, name: str = 'pool',
                 start_timeout: float = 300.0, tls: Optional[courier.TLSConfig] = None,
                 launch_options: Optional[Mapping[str, Any]] = None):
        if maxtasksperchild is not None:
            raise ValueError('maxtasksperchild is not supported: pool workers are not recycled '
                             '(a worker that dies is restarted). Leave it None.')
        if initializer is not None and not callable(initializer):
            raise TypeError(f'initializer must be callable, got {initializer!r}.')
        launch_options = _checked_launch_options(launch_options)
        group = workers if isinstance(workers, GroupClient) else None
        if workers is not None:
            if (processes, launch_type, resources, tls) != (None,) * 4 or launch_options:
                raise ValueError('Pass either workers= (a pool inside a program) or processes, '
                                 'launch_type, resources, tls and launch_options (a pool that '
                                 'launches its own program), not both.')
            # An elastic group: its members now (the first awaited), and those that join later.
            workers = (_first_members(group, start_timeout) if group is not None
                       else list(workers))
            if not workers:
                raise ValueError('workers= is empty: a pool needs at least one worker.')
            for worker in workers:
                _check_worker(worker[1] if group is not None else worker)
        else:
            processes = (os.cpu_count() or 1) if processes is None else processes
            if not isinstance(processes, int) or processes < 1:
                raise ValueError(f'Number of processes must be at least 1, got {processes!r}.')
        init = None
        authkey = bytes(multiprocessing.current_process().authkey)
        if initializer is not None:
            key, function = pack_function(initializer)
            init_args = serialization.cloudpickle_dumps(tuple(initargs))
            init = functools.partial(_initialize, key, function, init_args, authkey)
        self._state = _RUN
        self._lock = threading.Lock()
        self._authkey = authkey  # workers unpickle Manager() proxies with it, as multiprocessing's
        self._parts = _Parts(Dispatcher(prefetch=prefetch, initialize=init),
                             len(workers) if workers is not None else processes)
        self._dispatcher = self._parts.dispatcher
        self._finalizer = weakref.finalize(
            self, self._parts.shutdown, PoolTerminatedError('the pool was garbage-collected'))
        if workers is not None:
            for worker in workers:
                if group is not None:
                    self._add_worker(worker[1], key=worker[0])
                else:
                    self._add_worker(worker)
            if group is not None:
                _follow(self._parts, group, {name for name, _ in workers})
            return
        try:
            self._launch(processes, launch_type or 'local_mp', resources, max_restarts,
                         pool_host, name, tls, launch_options)
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
        """Like `map`, lazily: an iterator of the results in order, as they come. An error of
        `iterable` itself comes after the results of the items read before it."""
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
        self._parts.shutdown(PoolTerminatedError('the pool was terminated before the task was '
                                                 'done'))

    def join(self) -> None:
        """Waits for the submitted tasks and for the workers to end; after close() or
        terminate()."""
        with self._lock:
            if self._state == _RUN:
                raise ValueError('Pool is still running: call close() or terminate() first.')
        self._dispatcher.wait_idle()
        self._parts.shutdown(PoolTerminatedError('the pool was closed'))

    def __enter__(self) -> 'Pool':
        self._check_running()
        return self

    def __exit__(self, *exc_info) -> None:
        self.terminate()

    def __repr__(self) -> str:
        return f'<lp.Pool state={self._state} workers={self._parts.size}>'

    def __del__(self, _warn=warnings.warn) -> None:
        if getattr(self, '_state', None) == _RUN:  # then the finalizer stops it
            _warn(f'unclosed running multiprocessing pool {self!r}: close() and join() it, or '
                  'terminate() it, or use it in a with block', ResourceWarning, source=self)

    # --- Growing and shrinking (for elastic groups) ------------------------------------------

    def _add_worker(self, worker: Worker, key: Optional[str] = None) -> None:
        """Adds a worker while the pool runs: a `WorkerRef`, or a `courier.Client` of a node
        serving `PoolWorker`. It gets tasks as soon as it answers."""
        _add_worker(self._dispatcher, worker, key)

    def _remove_worker(self, key: str) -> None:
        """Gives worker `key` no more tasks; the ones it holds finish."""
        self._dispatcher.remove_worker(key)

    def _workers(self) -> dict:
        """Live workers: key -> {'pid': ..., 'host': ...}."""
        return self._dispatcher.workers()

    @property
    def stats(self):
        """Counters: workers 'joined', 'lost', 'revived'; tasks 'requeued', 'duplicates' (run
        twice after a loss), 'moved' (withdrawn from a busy worker for an idle one)."""
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
            tasks.append(Task(job, start + offset,
                              (key, function, data, buffers, mode, self._authkey), len(chunk)))
        return tasks

    def _map_async(self, func, iterable, mode, chunksize, callback=None, error_callback=None):
        self._check_running()
        items = list(iterable)
        if chunksize is None:
            chunksize, extra = divmod(len(items), self._parts.size * 4)
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
            """Reads the input chunk by chunk, as multiprocessing's task handler: an item that
            cannot be sent fails in its place; an error of the input itself ends it there."""
            count, packed = 0, None
            try:
                iterator = iter(iterable)
                while True:
                    try:
                        chunk = list(itertools.islice(iterator, chunksize))
                    except Exception as error:  # pylint: disable=broad-except
                        _fail_in_place(job, count, 1, error)
                        job.set_length(count + 1)
                        return
                    if not chunk:
                        break
                    try:
                        packed = packed or _pack(func)  # once, not per chunk
                        tasks = self._tasks(job, packed, chunk, chunksize, 'call', count)
                    except Exception as error:  # pylint: disable=broad-except
                        _fail_in_place(job, count, len(chunk), error)
                    else:
                        self._dispatcher.submit(tasks)
                    count += len(chunk)
            except BaseException as error:  # pylint: disable=broad-except  (the pool ended)
                job.fail(error)
            else:
                job.set_length(count)

        threading.Thread(target=feed, name='lp-pool-feeder', daemon=True).start()
        return job

    def _launch(self, processes, launch_type, resources, max_restarts, pool_host, name, tls,
                launch_options) -> None:
        token = secrets.token_hex(16)
        parts = self._parts
        if is_local_launch_or_test(launch_type):
            parts.tmpdir = tempdirs.make('pool')
            parts.server = courier.Server(address=f'unix:{parts.tmpdir}/pool.sock',
                                          auth_token=token)
            candidates = [parts.server.address]
        else:
            parts.server = courier.Server(host=pool_host or '0.0.0.0', auth_token=token, tls=tls)
            port = parts.server.address.rpartition(':')[2]
            candidates = [f'{host}:{port}' for host in ([pool_host] if pool_host
                                                         else _machine_addresses())]
        registry = Registry(candidates, token, None if parts.tmpdir else tls)
        parts.server.Bind('ping', lambda: True)
        parts.server.Bind('register', functools.partial(parts.register, registry))
        parts.server.Start()
        program = Program(name)
        with program.group(_GROUP):
            for _ in range(processes):
                program.add_node(PoolWorkerNode(max_restarts, registry=registry))
        if resources is not None and not isinstance(resources, Mapping):
            resources = {_GROUP: resources}
        parts.controller = launch(program, launch_type=launch_type, resources=resources, tls=tls,
                                  **launch_options)
        threading.Thread(target=parts.watch_program, name='lp-pool-monitor',
                         daemon=True).start()
        register = getattr(threading, '_register_atexit', None)
        if register is not None:  # runs before the launcher's own wait for the program
            register(self._finalizer)

    def _wait_for_workers(self, count: int, timeout: float) -> None:
        """Returns once `count` workers answer; raises if the program ends, the initializer
        fails or time runs out."""
        deadline = time.monotonic() + timeout
        while len(self._workers()) < count:
            if self._dispatcher.ended is not None:
                raise self._dispatcher.ended
            if self._parts.controller.done:
                self._parts.controller.wait()  # raises the failure, if a node failed
                raise PoolTerminatedError(f'the pool\'s program ended before its {count} '
                                          'workers started')
            if time.monotonic() > deadline:
                raise TimeoutError(f'Only {len(self._workers())} of the pool\'s {count} workers '
                                   f'answered within {timeout:g} s; see the program\'s output.')
            time.sleep(0.02)


class _Parts:
    """What a pool runs on, apart from the `Pool` object: its dispatcher and, standalone, its
    program, registry server and directory. Its threads hold this, never the Pool."""

    def __init__(self, dispatcher: Dispatcher, size: int):
        self.dispatcher = dispatcher
        self.size = size  # workers, for map's default chunk size (a group's, as it changes)
        self.controller = None
        self.server: Optional[courier.Server] = None
        self.tmpdir: Optional[str] = None
        self.endpoints: dict = {}
        self.shut_down = False
        self._lock = threading.Lock()

    def register(self, registry: Registry, key: str, endpoint: str, info: dict) -> None:
        """A standalone pool's worker serves at `endpoint` (called by the worker)."""
        self.endpoints[key] = endpoint

        def connect() -> courier.Client:
            return registry.client(self.endpoints[key])

        self.dispatcher.add_worker(key, connect, info)

    def watch_program(self) -> None:
        try:
            self.controller.wait()
            error: BaseException = PoolTerminatedError(
                f'the pool\'s program {self.controller.program_name!r} ended')
        except Exception as failure:  # pylint: disable=broad-except
            error = failure
        self.dispatcher.end(error)

    def shutdown(self, error: BaseException) -> None:
        """Fails what is not done with `error` and stops the program and the server (once)."""
        with self._lock:
            if self.shut_down:
                return
            self.shut_down = True
        self.dispatcher.end(error)
        self.dispatcher.join()
        if self.controller is not None:
            self.controller.stop()
        if self.server is not None:
            self.server.Stop()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _follow(parts: _Parts, group: GroupClient, members: set) -> None:
    """Adds the members that join `group` as workers, and removes those that leave, from a
    thread of its own until the pool shuts down."""
    context = runtime.get_context()

    def follow():
        runtime.set_thread_context(context)
        known = set(members)
        while not parts.shut_down and not context.stop.event.is_set():
            try:
                if not group.wait_for_change(0.5):
                    continue
                current = group.members()
            except Exception:  # pylint: disable=broad-except  (the program stops)
                return
            for name in known - set(current):
                parts.dispatcher.remove_worker(name)
            for name in set(current) - known:
                if current[name] is not None:
                    _add_worker(parts.dispatcher, current[name], name)
            known = set(current)
            parts.size = max(1, len(known))

    threading.Thread(target=follow, daemon=True, name=f'lp-pool-{group.label}').start()


def _first_members(group: GroupClient, timeout: float) -> List[Tuple[str, Any]]:
    """The members of `group` (name, client), once it has one; TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    members = group.members()
    while not members:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f'lp.Pool(workers=...): group {group.label!r} has no member after {timeout:g} s. '
                f'Give it nodes, or grow it (lp.resize({group.label!r}, n), a scaling policy), '
                'or pass a longer start_timeout.')
        group.wait_for_change(min(left, 1.0))
        members = group.members()
    return list(members.items())


def _add_worker(dispatcher: Dispatcher, worker: Worker, key: Optional[str]) -> None:
    _check_worker(worker)
    if isinstance(worker, WorkerRef):
        dispatcher.add_worker(key or worker.key, worker.connect)
    else:
        dispatcher.add_worker(key or repr(worker), functools.partial(_fresh, worker))


def _checked_launch_options(options: Optional[Mapping[str, Any]]) -> dict:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f'launch_options is a mapping of lp.launch keyword arguments, got '
                        f'{options!r}.')
    owned = sorted(set(options) & set(_POOL_OWNS))
    if owned:
        raise TypeError(f'launch_options={owned} are the pool\'s own: pass launch_type=, '
                        'resources= and tls= to lp.Pool itself.')
    return dict(options)


def _initialize(key: str, function: bytes, args: bytes, authkey: bytes,
                client: courier.Client) -> None:
    """Runs the pool's initializer (packed) in the worker of `client`."""
    client.initialize(key, function, args, authkey)


def _fail_in_place(job: Job, start: int, size: int, error: BaseException) -> None:
    """Items `start`..`start + size` of `job` fail with `error`, here rather than in a worker."""
    job.deliver(Task(job, start, None, size), [(False, error)] * size)


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
