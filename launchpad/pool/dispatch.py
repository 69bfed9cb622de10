"""The dispatcher of a pool: the task queue, the table of tasks in flight on each worker, and the
re-queueing of a lost worker's tasks (Fiber's resilient pool, over courier clients).

    caller threads           dispatcher thread (owns every table)            workers
    --------------           ------------------------------------            -------
    submit(tasks) --events--> pending: deque[Task]        --futures.execute--> PoolWorker
    add_worker(key, connect)  workers[key].in_flight       <--done callback---
    close()/terminate()           |  a ServerUnavailableError: the worker is lost; its tasks
                                  |  go back to the front of `pending`, a reviver thread
                                  |  reconnects it when it is back (restarted or re-registered)
                                  |  an idle worker, nothing pending: --futures.withdraw--> a
                                  |  task waiting behind a running one comes back, runs here
                                  v
                              job.deliver(task, outcomes)  -- once per task: the first outcome
                                                              wins, a late copy is dropped

Only the dispatcher thread touches the tables: callers, courier's completion callbacks and the
revivers post events to its queue. A task is *executed* at least once (twice if its worker died
after running it but before answering) and *delivered* exactly once.

Prefetch (a worker's next task sent while its current one runs) hides the round trip between
tasks, but a task sent ahead waits behind the running one. So a task goes to the least busy
worker, and when a worker is idle with nothing pending, the dispatcher withdraws a task waiting
in a busy worker (`PoolWorker.withdraw`: only one that has not started) and sends it to the idle
one. No task waits behind another while a worker is idle, as in multiprocessing's shared queue.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import secrets
import threading
from typing import Any, Callable, Deque, Dict, List, Optional

import courier
from courier.errors import RemoteTraceback as CourierRemoteTraceback

from launchpad.pool.results import Job, Task

Connect = Callable[[], courier.Client]

_REVIVE_FIRST_WAIT = 0.05
_REVIVE_MAX_WAIT = 1.0
_PING_TIMEOUT = 10.0


class WorkerLostError(courier.ServerUnavailableError):
    """A pool had no worker left to run its tasks."""


class PoolTerminatedError(RuntimeError):
    """The pool was terminated (or its program ended, or its initializer failed) before the task
    was done."""


@dataclasses.dataclass
class _Worker:
    key: str
    connect: Connect
    client: Optional[courier.Client] = None
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)
    incarnation: int = 0
    in_flight: Dict[int, Task] = dataclasses.field(default_factory=dict)  # in the order sent
    started: set = dataclasses.field(default_factory=set)  # tasks it refused to give back
    alive: bool = False
    retiring: bool = False
    reviving: bool = False
    was_alive: bool = False


class Dispatcher:
    """Runs tasks on a changing set of workers, each task's outcomes delivered once.

    Args:
      prefetch: tasks in flight per worker; above 1 the next task waits in the worker while the
        current one runs, hiding the round trip (the worker runs them one at a time).
      initialize: called with each new or restarted worker's client before it gets tasks (the
        pool's initializer); an exception other than courier's ServerUnavailableError ends the
        dispatcher: every task fails with a PoolTerminatedError naming it (its cause).
    """

    def __init__(self, prefetch: int = 2,
                 initialize: Optional[Callable[[courier.Client], None]] = None):
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f'prefetch must be an integer >= 1, got {prefetch!r}.')
        self._prefetch = prefetch
        self._initialize = initialize
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: Deque[Task] = collections.deque()
        self._workers: Dict[str, _Worker] = {}
        self._ended: Optional[BaseException] = None
        self._closing = threading.Event()
        self._idle = threading.Condition()
        self._unfinished = 0  # tasks submitted and not yet delivered
        self._stopped = False  # the dispatcher thread no longer reads its events
        self._withdrawing: Dict[int, _Worker] = {}  # task seq -> the worker asked to give it back
        self._name = secrets.token_hex(6)  # in the task ids workers see: several pools may share
        self.stats = collections.Counter()  # see `Pool.stats`
        self._thread = threading.Thread(target=self._loop, name='lp-pool-dispatcher', daemon=True)
        self._thread.start()

    # --- What callers do (any thread) ---------------------------------------------------------

    def submit(self, tasks: List[Task]) -> None:
        """Queues `tasks` (in this order, after those already queued)."""
        if not tasks:
            return
        with self._idle:  # queued before an 'end' (they fail with it), or refused after it
            if self._ended is not None:
                raise self._ended
            self._unfinished += len(tasks)
            self._events.put(('submit', tasks))

    def add_worker(self, key: str, connect: Connect, info: Optional[Dict[str, Any]] = None
                   ) -> None:
        """Adds a worker (or, for a known `key`, says it is back: `connect()` makes a client of
        its new incarnation). This is how a pool grows while it runs."""
        self._events.put(('worker', key, connect, dict(info or {})))

    def remove_worker(self, key: str) -> None:
        """Gives a worker no new tasks; those it holds finish there. How a pool shrinks."""
        self._events.put(('retire', key))

    def workers(self) -> Dict[str, Dict[str, Any]]:
        """Live workers: key -> what the worker said about itself (pid, host)."""
        reply: queue.SimpleQueue = queue.SimpleQueue()
        with self._idle:
            if self._stopped:
                return {}
            self._events.put(('ask', reply))
        return reply.get()

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Blocks until every submitted task was delivered (or the dispatcher ended)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0 or self._ended is not None,
                                       timeout)

    def end(self, error: BaseException) -> None:
        """Stops dispatching; every task not delivered yet fails with `error`."""
        self._mark_ended(error)
        self._events.put(('end', error))

    def _mark_ended(self, error: BaseException) -> None:
        with self._idle:
            if self._ended is None:
                self._ended = error
        self._closing.set()

    @property
    def ended(self) -> Optional[BaseException]:
        """The error every task not delivered failed with, once the dispatcher ended."""
        with self._idle:
            return self._ended

    def join(self, timeout: Optional[float] = None) -> None:
        if threading.current_thread() is not self._thread:  # a callback may end its pool
            self._thread.join(timeout)

    # --- The dispatcher thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            kind, *args = self._events.get()
            try:
                if kind == 'end':
                    self._fail_everything(args[0])
                    self._stop()
                    return
                getattr(self, f'_on_{kind}')(*args)
                self._assign()
            except Exception:  # pylint: disable=broad-except
                logging.exception('The pool dispatcher failed on %s', kind)
                failure = RuntimeError('the pool dispatcher failed; see the log')
                self._mark_ended(failure)
                self._fail_everything(failure)
                self._stop()
                return
            del args  # a done task holds its job's results: they are the caller's alone now

    def _stop(self) -> None:
        """Ends the thread's reading: questions asked meanwhile get an empty answer."""
        with self._idle:
            self._stopped = True
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            if event[0] == 'ask':
                event[1].put({})

    def _on_submit(self, tasks: List[Task]) -> None:
        self._pending.extend(tasks)

    def _on_ask(self, reply: queue.SimpleQueue) -> None:
        reply.put({key: dict(w.info) for key, w in self._workers.items() if w.alive})

    def _on_worker(self, key: str, connect: Connect, info: Dict[str, Any]) -> None:
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker(key, connect)
        elif worker.alive and info and info == worker.info:
            return  # the same incarnation registered twice
        worker.connect = connect  # a reviver at work uses it from its next try on
        if worker.alive:
            self._lose(worker, 'a new incarnation of it registered')
        elif not worker.reviving:
            self._revive(worker)

    def _on_revived(self, worker: _Worker, incarnation: int, client: courier.Client,
                    info: Dict[str, Any]) -> None:
        if worker.incarnation != incarnation or worker.alive or worker.retiring:
            return
        worker.client, worker.alive, worker.reviving = client, True, False
        worker.info = info
        self.stats['revived' if worker.was_alive else 'joined'] += 1
        worker.was_alive = True

    def _on_retire(self, key: str) -> None:
        worker = self._workers.get(key)
        if worker is not None:
            worker.retiring = True
            if not worker.in_flight:
                worker.alive = False
                del self._workers[key]

    def _on_done(self, worker: _Worker, incarnation: int, task: Task, sent: int, future) -> None:
        error = future.exception()
        current = self._holds(worker, incarnation, task, sent)
        if isinstance(error, courier.ServerUnavailableError):
            if current:  # this task and the others it holds go back to the queue
                self._lose(worker, str(error))
            return
        if error is None and future.result() is None:  # withdrawn before it started
            self._take_back(worker, incarnation, task, sent)
            return
        if current:
            del worker.in_flight[task.seq]
            worker.started.discard(task.seq)
        if not current and error is not None:
            return  # an earlier incarnation's failure: the task was re-queued and runs again
        if task.done:
            self.stats['duplicates'] += 1  # re-run after a loss, and the first run answered too
            return
        if error is not None:
            outcomes = [(False, error)] * task.size
        else:
            outcomes = future.result()
        self._deliver(task, outcomes)
        if worker.retiring and not worker.in_flight:
            self._on_retire(worker.key)

    def _on_withdrawn(self, worker: _Worker, incarnation: int, task: Task, sent: int,
                      future) -> None:
        if self._withdrawing.get(task.seq) is worker:
            del self._withdrawing[task.seq]
        if future.exception() is None and future.result():
            self._take_back(worker, incarnation, task, sent)
        elif self._holds(worker, incarnation, task, sent):
            worker.started.add(task.seq)  # it runs there (or a worker that cannot give back)

    def _on_initializer_failed(self, worker: _Worker, error: BaseException) -> None:
        _with_remote_traceback(error)
        failure = PoolTerminatedError(
            f"the pool's initializer failed in worker {worker.key} ({type(error).__name__}: "
            f'{error}); its traceback is above. Fix the initializer, or its arguments.')
        failure.__cause__ = error
        self.end(failure)

    @staticmethod
    def _holds(worker: _Worker, incarnation: int, task: Task, sent: int) -> bool:
        """Whether `worker` holds `task` as sent then (not lost, withdrawn or sent anew since)."""
        return (worker.incarnation == incarnation and worker.in_flight.get(task.seq) is task
                and task.runs == sent)

    def _take_back(self, worker: _Worker, incarnation: int, task: Task, sent: int) -> None:
        """`worker` gave `task` back unstarted: it goes first in the queue, for an idle worker."""
        if not self._holds(worker, incarnation, task, sent):
            return  # its other notice came first
        del worker.in_flight[task.seq]
        if not task.done:
            self._pending.appendleft(task)
            self.stats['moved'] += 1
        if worker.retiring and not worker.in_flight:
            self._on_retire(worker.key)

    def _deliver(self, task: Task, outcomes) -> None:
        task.done = True
        task.payload = None  # it may hold buffers of the caller's arrays
        for success, value in outcomes:
            if not success:
                _with_remote_traceback(value)
        try:
            task.job.deliver(task, outcomes)
        except Exception:  # pylint: disable=broad-except
            logging.exception('A pool callback failed')
        with self._idle:
            self._unfinished -= 1
            self._idle.notify_all()

    def _lose(self, worker: _Worker, reason: str) -> None:
        """The worker is gone: its tasks go back to the front of the queue, in their order."""
        logging.warning('Pool worker %s was lost (%s); re-queueing its %d task(s).', worker.key,
                        reason, len(worker.in_flight))
        self.stats['lost'] += 1
        lost = sorted((t for t in worker.in_flight.values() if not t.done), key=lambda t: t.seq)
        self.stats['requeued'] += len(lost)
        self._pending.extendleft(reversed(lost))
        worker.in_flight.clear()
        worker.started.clear()
        self._withdrawing = {seq: w for seq, w in self._withdrawing.items() if w is not worker}
        worker.alive = False
        worker.incarnation += 1
        if worker.retiring:
            del self._workers[worker.key]
        else:
            self._revive(worker)

    def _revive(self, worker: _Worker) -> None:
        """Reconnects `worker` in a thread of its own: until its (new) incarnation answers."""
        worker.incarnation += 1
        worker.reviving = True
        threading.Thread(target=self._reviver, args=(worker, worker.incarnation),
                         name=f'lp-pool-revive-{worker.key}', daemon=True).start()

    def _reviver(self, worker: _Worker, incarnation: int) -> None:
        wait = _REVIVE_FIRST_WAIT
        while not self._closing.is_set():
            try:
                client = worker.connect()
                info = client.ping()
                if self._initialize is not None:
                    try:
                        self._initialize(client)
                    except courier.ServerUnavailableError:
                        raise
                    except Exception as error:  # pylint: disable=broad-except
                        self._events.put(('initializer_failed', worker, error))
                        return
            except courier.ServerUnavailableError:
                pass
            except Exception:  # pylint: disable=broad-except
                logging.exception('Pool worker %s cannot start', worker.key)
            else:
                self._events.put(('revived', worker, incarnation, client, info))
                return
            self._closing.wait(wait)
            wait = min(2 * wait, _REVIVE_MAX_WAIT)

    def _assign(self) -> None:
        """Gives queued tasks to the least busy live workers with room; with none queued, has a
        task waiting in a busy worker moved to an idle one."""
        if self._closing.is_set():
            return
        ready = [w for w in self._workers.values() if w.alive and not w.retiring]
        while self._pending:
            worker = min(ready, key=lambda w: len(w.in_flight), default=None)
            if worker is None or len(worker.in_flight) >= self._prefetch:
                return
            task = self._next_task()
            if task is None:
                break
            self._send(worker, task)
        idle = sum(1 for w in ready if not w.in_flight) - len(self._withdrawing)
        for worker in sorted(ready, key=lambda w: -len(w.in_flight)):
            if idle <= 0 or len(worker.in_flight) < 2:
                return
            waiting = [t for t in worker.in_flight.values()
                       if t.seq not in worker.started and t.seq not in self._withdrawing]
            if len(waiting) == len(worker.in_flight):  # the first one sent is likely running
                waiting = waiting[1:]
            if waiting:
                self._withdraw(worker, waiting[-1])
                idle -= 1

    def _next_task(self) -> Optional[Task]:
        while self._pending:
            task = self._pending.popleft()
            if not task.done:  # else an earlier run answered while it waited here
                return task
        return None

    def _send(self, worker: _Worker, task: Task) -> None:
        task.runs += 1
        worker.in_flight[task.seq] = task
        self._call(worker, task, 'execute', 'done', *task.payload, self._task_id(task))

    def _withdraw(self, worker: _Worker, task: Task) -> None:
        self._withdrawing[task.seq] = worker
        self._call(worker, task, 'withdraw', 'withdrawn', self._task_id(task))

    def _call(self, worker: _Worker, task: Task, method: str, event: str, *args) -> None:
        """Calls `method` of `worker` about `task`; its outcome comes back as `event`."""
        incarnation, sent = worker.incarnation, task.runs
        future = getattr(worker.client.futures, method)(*args)
        future.add_done_callback(
            lambda f: self._events.put((event, worker, incarnation, task, sent, f)))

    def _task_id(self, task: Task) -> str:
        """What a worker knows a task's send by (a task sent again gets a new one)."""
        return f'{self._name}-{task.seq}-{task.runs}'

    def _fail_everything(self, error: BaseException) -> None:
        tasks = list(self._pending) + [t for w in self._workers.values()
                                       for t in w.in_flight.values()]
        for task in sorted(tasks, key=lambda t: t.seq):
            if not task.done:
                self._deliver(task, [(False, error)] * task.size)
        for job in {id(t.job): t.job for t in tasks}.values():
            job.fail(error)
        self._pending.clear()
        for worker in self._workers.values():
            worker.in_flight.clear()
        with self._idle:
            self._unfinished = 0
            self._idle.notify_all()


def _with_remote_traceback(error: BaseException) -> None:
    """Gives `error`, raised in a worker, the cause multiprocessing gives it: a
    `multiprocessing.pool.RemoteTraceback` whose `tb` is the worker's traceback text (printed
    under the caller's traceback). Code written for multiprocessing reads it."""
    text = getattr(error, 'remote_traceback', None)
    if not text or not (error.__cause__ is None
                        or isinstance(error.__cause__, CourierRemoteTraceback)):
        return
    import multiprocessing.pool  # pylint: disable=import-outside-toplevel  (slow, and rare here)
    error.__cause__ = multiprocessing.pool.RemoteTraceback(f'\n"""\n{text}"""')


__all__ = ['Dispatcher', 'Job', 'PoolTerminatedError', 'Task', 'WorkerLostError']
