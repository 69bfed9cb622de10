"""The dispatcher of a pool: the task queue, the table of tasks in flight on each worker, and the
re-queueing of a lost worker's tasks (Fiber's resilient pool, over courier clients).

    caller threads           dispatcher thread (owns every table)            workers
    --------------           ------------------------------------            -------
    submit(tasks) --events--> pending: deque[Task]        --futures.execute--> PoolWorker
    add_worker(key, connect)  workers[key].in_flight       <--done callback---
    close()/terminate()           |  a ServerUnavailableError: the worker is lost; its tasks
                                  |  go back to the front of `pending`, a reviver thread
                                  v  reconnects it when it is back (restarted or re-registered)
                              job.deliver(task, outcomes)  -- once per task: the first outcome
                                                              wins, a late copy is dropped

Only the dispatcher thread touches the tables: callers, courier's completion callbacks and the
revivers post events to its queue. A task is *executed* at least once (twice if its worker died
after running it but before answering) and *delivered* exactly once.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
from typing import Any, Callable, Deque, Dict, List, Optional

import courier
from courier.errors import RemoteTraceback

from launchpad.pool.results import Job, Task

Connect = Callable[[], courier.Client]

_REVIVE_FIRST_WAIT = 0.05
_REVIVE_MAX_WAIT = 1.0
_PING_TIMEOUT = 10.0


class WorkerLostError(courier.ServerUnavailableError):
    """A pool had no worker left to run its tasks."""


@dataclasses.dataclass
class _Worker:
    key: str
    connect: Connect
    client: Optional[courier.Client] = None
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)
    incarnation: int = 0
    in_flight: Dict[int, Task] = dataclasses.field(default_factory=dict)
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
        pool's initializer); its exception fails the worker's start like a lost worker.
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
        self.stats = collections.Counter()  # 'requeued', 'lost', 'revived', 'duplicates'
        self._thread = threading.Thread(target=self._loop, name='lp-pool-dispatcher', daemon=True)
        self._thread.start()

    # --- What callers do (any thread) ---------------------------------------------------------

    def submit(self, tasks: List[Task]) -> None:
        """Queues `tasks` (in this order, after those already queued)."""
        if not tasks:
            return
        with self._idle:
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
        self._events.put(('ask', reply))
        return reply.get()

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Blocks until every submitted task was delivered (or the dispatcher ended)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0 or self._ended is not None,
                                       timeout)

    def end(self, error: BaseException) -> None:
        """Stops dispatching; every task not delivered yet fails with `error`."""
        with self._idle:
            if self._ended is None:
                self._ended = error
        self._closing.set()
        self._events.put(('end', error))

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    # --- The dispatcher thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            event = self._events.get()
            try:
                if event[0] == 'end':
                    self._fail_everything(event[1])
                    return
                getattr(self, f'_on_{event[0]}')(*event[1:])
                self._assign()
            except Exception:  # pylint: disable=broad-except
                logging.exception('The pool dispatcher failed on %s', event[0])
                self._fail_everything(RuntimeError('the pool dispatcher failed; see the log'))
                return

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

    def _on_done(self, worker: _Worker, incarnation: int, task: Task, future) -> None:
        error = future.exception()
        current = worker.incarnation == incarnation and task.seq in worker.in_flight
        if isinstance(error, courier.ServerUnavailableError):
            if current:  # this task and the others it holds go back to the queue
                self._lose(worker, str(error))
            return
        if current:
            del worker.in_flight[task.seq]
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

    def _deliver(self, task: Task, outcomes) -> None:
        task.done = True
        for success, value in outcomes:
            text = None if success else getattr(value, 'remote_traceback', None)
            if text and value.__cause__ is None:  # printed under the caller's traceback
                value.__cause__ = RemoteTraceback(text)
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
                    self._initialize(client)
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
        """Gives queued tasks to live workers with room, round-robin."""
        ready = [w for w in self._workers.values() if w.alive and not w.retiring]
        while self._pending and ready:
            for worker in list(ready):
                if len(worker.in_flight) >= self._prefetch:
                    ready.remove(worker)
                    continue
                task = self._next_task()
                if task is None:
                    return
                self._send(worker, task)

    def _next_task(self) -> Optional[Task]:
        while self._pending:
            task = self._pending.popleft()
            if not task.done:  # else an earlier run answered while it waited here
                return task
        return None

    def _send(self, worker: _Worker, task: Task) -> None:
        task.runs += 1
        worker.in_flight[task.seq] = task
        incarnation = worker.incarnation
        future = worker.client.futures.execute(*task.payload)
        future.add_done_callback(
            lambda f: self._events.put(('done', worker, incarnation, task, f)))

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


__all__ = ['Dispatcher', 'Job', 'Task', 'WorkerLostError']
