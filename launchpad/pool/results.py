"""What a pool's caller holds while its tasks run: `AsyncResult`, `MapResult` and the `imap`
iterators, with `multiprocessing.pool`'s semantics.

A job is split into tasks (chunks of items). The dispatcher delivers each task's outcomes once,
from its own thread, by calling `Job.deliver(task, outcomes)`; an outcome is `(True, value)` or
`(False, exception)`. Jobs never see workers: whether a task ran once or was re-run after its
worker died is the dispatcher's business.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

Outcome = Tuple[bool, Any]


class Task:
    """A chunk of one job's items, sent to one worker at a time.

    Attributes:
      job: the job it belongs to.
      start: the index of its first item within the job.
      payload: the pickled chunk (see `PoolWorker.execute`).
      size: how many items it holds.
      done: set once its outcomes were delivered; a later copy of them is dropped.
      runs: how many times it was sent to a worker.
    """
    __slots__ = ('job', 'start', 'payload', 'size', 'done', 'runs', 'seq')
    _counter = 0
    _lock = threading.Lock()

    def __init__(self, job: 'Job', start: int, payload: Any, size: int):
        self.job, self.start, self.payload, self.size = job, start, payload, size
        self.done = False
        self.runs = 0
        with Task._lock:
            Task._counter += 1
            self.seq = Task._counter  # submission order, kept when tasks are re-queued


class Job:
    """The caller's side of one submission; subclasses say how outcomes reach the caller."""

    def __init__(self, callback: Optional[Callable[[Any], None]] = None,
                 error_callback: Optional[Callable[[BaseException], None]] = None):
        self._cond = threading.Condition()
        self._callback = callback
        self._error_callback = error_callback

    def deliver(self, task: Task, outcomes: Sequence[Outcome]) -> None:
        """Records the outcomes of `task` (called once per task, by the dispatcher)."""
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        """Ends the job with `error` for every item still missing (the pool stopped)."""
        raise NotImplementedError


class AsyncResult(Job):
    """The result of `apply_async` (and, as `MapResult`, of `map_async`): like
    `multiprocessing.pool.AsyncResult`."""

    def __init__(self, callback=None, error_callback=None):
        super().__init__(callback, error_callback)
        self._ready = False
        self._success = False
        self._value: Any = None

    def ready(self) -> bool:
        """True once the result (or its exception) is there."""
        with self._cond:
            return self._ready

    def successful(self) -> bool:
        """True if the call returned without raising; a ValueError before it is ready."""
        with self._cond:
            if not self._ready:
                raise ValueError(f'{self!r} is not ready')
            return self._success

    def wait(self, timeout: Optional[float] = None) -> None:
        """Blocks until the result is ready or `timeout` seconds pass."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready, timeout)

    def get(self, timeout: Optional[float] = None) -> Any:
        """The result; raises the task's exception (with the remote traceback as its cause), or
        `multiprocessing.TimeoutError` if it is not ready within `timeout` seconds."""
        self.wait(timeout)
        with self._cond:
            if not self._ready:
                import multiprocessing  # pylint: disable=import-outside-toplevel
                raise multiprocessing.TimeoutError
            if self._success:
                return self._value
            raise self._value

    def deliver(self, task: Task, outcomes: Sequence[Outcome]) -> None:
        self._set(*outcomes[0])

    def fail(self, error: BaseException) -> None:
        self._set(False, error)

    def _set(self, success: bool, value: Any) -> None:
        with self._cond:
            if self._ready:
                return
            self._success, self._value = success, value
        callback = self._callback if success else self._error_callback
        if callback is not None:
            callback(value)
        with self._cond:
            self._ready = True
            self._cond.notify_all()


ApplyResult = AsyncResult


class MapResult(AsyncResult):
    """The result of `map_async` / `starmap_async`: the list of results in input order, or the
    first exception a task raised (as `multiprocessing` does, it does not wait for the rest)."""

    def __init__(self, length: int, callback=None, error_callback=None):
        super().__init__(callback, error_callback)
        self._values: List[Any] = [None] * length
        self._missing = length
        if length == 0:
            self._set(True, [])

    def deliver(self, task: Task, outcomes: Sequence[Outcome]) -> None:
        for offset, (success, value) in enumerate(outcomes):
            if not success:
                self._set(False, value)
                return
            self._values[task.start + offset] = value
        self._missing -= len(outcomes)
        if self._missing == 0:
            self._set(True, self._values)


class IMapIterator(Job):
    """The iterator `imap` returns: results in input order as they arrive; `next(timeout)` waits
    at most `timeout` seconds (`multiprocessing.TimeoutError`). An item whose task raised raises
    its exception at its place; iteration can go on after it."""

    def __init__(self):
        super().__init__()
        self._outcomes: dict = {}
        self._ready: collections.deque = collections.deque()
        self._next_index = 0
        self._length: Optional[int] = None  # known once every item was submitted
        self._failure: Optional[BaseException] = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: Optional[float] = None) -> Any:
        """The next result, waiting at most `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(self._has_next, timeout):
                import multiprocessing  # pylint: disable=import-outside-toplevel
                raise multiprocessing.TimeoutError
            if not self._ready:
                if self._failure is not None and not self._ended():
                    failure, self._failure = self._failure, None
                    self._length = self._next_index
                    raise failure
                raise StopIteration
            success, value = self._ready.popleft()
        if success:
            return value
        raise value

    def _ended(self) -> bool:
        return self._length is not None and self._next_index >= self._length

    def _has_next(self) -> bool:
        return bool(self._ready) or self._ended() or self._failure is not None

    def set_length(self, length: int) -> None:
        """Every item was submitted: there are `length` of them."""
        with self._cond:
            self._length = length
            self._cond.notify_all()

    def deliver(self, task: Task, outcomes: Sequence[Outcome]) -> None:
        with self._cond:
            for offset, outcome in enumerate(outcomes):
                self._outcomes[task.start + offset] = outcome
            self._release()
            self._cond.notify_all()

    def _release(self) -> None:
        while self._next_index in self._outcomes:
            self._ready.append(self._outcomes.pop(self._next_index))
            self._next_index += 1

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._failure is None and not self._ended():
                self._failure = error
            self._cond.notify_all()


class IMapUnorderedIterator(IMapIterator):
    """The iterator `imap_unordered` returns: results in the order they arrive."""

    def deliver(self, task: Task, outcomes: Sequence[Outcome]) -> None:
        with self._cond:
            self._ready.extend(outcomes)
            self._next_index += len(outcomes)
            self._cond.notify_all()
