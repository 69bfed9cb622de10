"""Gathers concurrent calls of one method into batched calls.

A server method decorated with :func:`batched_handler` is called once per
batch with the arguments of up to ``batch_size`` concurrent calls batched
together, and its batched result is split back among the callers.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from courier import durations


def batched_handler(batch_size: int, max_parallelism: int = 1,
                    timeout: durations.Duration = 0.2, pad_batch: bool = False
                    ) -> Callable[[Callable[..., Any]], 'BatchedHandler']:
    """Decorator gathering concurrent calls of a function into batched calls.

    Calls wait until ``batch_size`` of them have arrived, or until ``timeout``
    passed since the first of them, and then the function runs once with their
    arguments batched: numpy arrays are stacked on a new leading axis, lists,
    tuples and dicts are batched element by element, and any other value
    becomes the list of the calls' values. Positional and keyword arguments
    must have the same structure in every call. The function returns a batched
    result: arrays and lists hand their ``i``-th entry to the ``i``-th caller,
    tuples and dicts are split element by element, and ``None`` gives every
    caller ``None``. If the function raises, every caller in the batch gets the
    exception.

    Works on functions and methods alike (each instance batches separately).
    Every waiting call holds a server thread, so the server's
    ``thread_pool_size`` must be at least ``batch_size * max_parallelism`` (plus
    threads for other methods), or batches can only ever fill by timing out.

    Args:
      batch_size: Most calls in one batch.
      max_parallelism: Most batches running at once.
      timeout: Seconds (or ``datetime.timedelta``) a batch waits to fill up.
      pad_batch: Fill a short batch up to ``batch_size`` with copies of its first
        call's arguments (results of the copies are dropped), so the function
        always sees ``batch_size`` entries.
    """
    for name, value in (('batch_size', batch_size), ('max_parallelism', max_parallelism)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'{name} must be a positive int, got {value!r}')
    timeout_seconds = durations.to_seconds(timeout, 'timeout')

    def decorate(fn: Callable[..., Any]) -> BatchedHandler:
        if not callable(fn):
            raise TypeError(f'batched_handler decorates callables, got {type(fn).__name__}')
        return BatchedHandler(fn, batch_size, max_parallelism, timeout_seconds, bool(pad_batch))

    return decorate


class BatchedHandler:
    """A function wrapped by :func:`batched_handler`; call it like the function."""

    def __init__(self, fn: Callable[..., Any], batch_size: int, max_parallelism: int,
                 timeout: float, pad_batch: bool):
        functools.update_wrapper(self, fn)
        self.batch_size = batch_size
        self.max_parallelism = max_parallelism
        self.timeout = timeout
        self.pad_batch = pad_batch
        self._attribute = getattr(fn, '__name__', None)
        self._instance = None  # The instance whose method this handler batches, if any.
        self._batcher = _Batcher(fn, batch_size, max_parallelism, timeout, pad_batch)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._batcher.submit(args, kwargs)

    def __reduce__(self):
        """Pickles by reference when possible; a copy never carries waiting calls."""
        if self._instance is not None:  # A method's handler: the copy's own, via the class.
            return getattr, (self._instance, self._attribute)
        module = sys.modules.get(getattr(self, '__module__', None) or '')
        if _lookup(module, getattr(self, '__qualname__', '')) is self:
            return self.__qualname__  # A module-level function: pickled by name.
        return BatchedHandler, (self.__wrapped__, self.batch_size, self.max_parallelism,
                                self.timeout, self.pad_batch)

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = name

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        """Binds a decorated method: each instance gets its own batches."""
        if instance is None:
            return self
        bound = BatchedHandler(self.__wrapped__.__get__(instance, owner), self.batch_size,
                               self.max_parallelism, self.timeout, self.pad_batch)
        bound._attribute = self._attribute  # pylint: disable=protected-access
        bound._instance = instance  # pylint: disable=protected-access
        try:
            attributes = vars(instance)
        except TypeError:
            raise TypeError(
                f'batched_handler on {type(instance).__name__}.{self._attribute} needs '
                f'instances with a __dict__; wrap the bound method in __init__ instead: '
                f'self.f = courier.batched_handler(...)(self.f)') from None
        # Cached on the instance (shadowing this descriptor); setdefault keeps one batcher
        # when threads race on the first access.
        return attributes.setdefault(self._attribute, bound)


def _lookup(scope: Any, qualified_name: str) -> Any:
    for name in qualified_name.split('.'):
        scope = getattr(scope, name, None)
    return scope


class _Batch:
    """Calls gathered for one execution of the batched function."""

    __slots__ = ('calls', 'closed', 'done', 'results', 'error')

    def __init__(self):
        self.calls: List[Tuple[tuple, dict]] = []
        self.closed = False  # No more calls may join.
        self.done = threading.Event()
        self.results: List[Any] = []
        self.error: Optional[BaseException] = None


class _Batcher:
    """Runs ``fn`` on batches of concurrent calls.

    The call that fills a batch runs it; if the timeout passes first, the call
    that opened the batch runs it. Both run it in their own thread, so no
    thread of our own is needed.
    """

    def __init__(self, fn: Callable[..., Any], batch_size: int, max_parallelism: int,
                 timeout: float, pad_batch: bool):
        self._fn = fn
        self._name = getattr(fn, '__qualname__', repr(fn))
        self._batch_size = batch_size
        self._timeout = timeout
        self._pad_batch = pad_batch
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(max_parallelism)
        self._open = _Batch()

    def submit(self, args: tuple, kwargs: dict) -> Any:
        with self._lock:
            batch = self._open
            index = len(batch.calls)
            batch.calls.append((args, kwargs))
            filled = len(batch.calls) == self._batch_size
            if filled:
                self._close(batch)
        if filled:
            with self._slots:
                self._run(batch)
        elif index == 0 and not batch.done.wait(self._timeout):
            self._run_on_timeout(batch)
        batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return batch.results[index]

    def _close(self, batch: _Batch) -> None:
        batch.closed = True
        if self._open is batch:
            self._open = _Batch()

    def _run_on_timeout(self, batch: _Batch) -> None:
        with self._lock:
            if batch.closed:  # Filled up meanwhile; whoever filled it runs it.
                return
        # The batch keeps accepting calls while it waits for a free slot.
        with self._slots:
            with self._lock:
                if batch.closed:
                    return
                self._close(batch)
            self._run(batch)

    def _run(self, batch: _Batch) -> None:
        try:
            calls = batch.calls
            if self._pad_batch and len(calls) < self._batch_size:
                calls = calls + [calls[0]] * (self._batch_size - len(calls))
            args, kwargs = _batch_arguments(calls, self._name)
            result = self._fn(*args, **kwargs)
            batch.results = _unbatch(result, len(calls), self._name, 'result')
        except BaseException as error:  # pylint: disable=broad-except
            batch.error = error
        finally:
            batch.done.set()


def _batch_arguments(calls: Sequence[Tuple[tuple, dict]], name: str) -> Tuple[tuple, dict]:
    first_args, first_kwargs = calls[0]
    for args, kwargs in calls:
        if len(args) != len(first_args) or kwargs.keys() != first_kwargs.keys():
            raise ValueError(
                f'calls batched together for {name} must pass the same arguments; one '
                f'passed {len(first_args)} positional and keywords {sorted(first_kwargs)}, '
                f'another {len(args)} positional and keywords {sorted(kwargs)}')
    args = tuple(_batch([call[0][i] for call in calls], f'argument {i}', name)
                 for i in range(len(first_args)))
    kwargs = {key: _batch([call[1][key] for call in calls], f'argument {key!r}', name)
              for key in first_kwargs}
    return args, kwargs


def _is_array(value: Any) -> bool:
    numpy = sys.modules.get('numpy')  # No numpy loaded: there are no arrays.
    return numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic))


def _batch(values: List[Any], path: str, name: str) -> Any:
    """Batches the values the calls passed at one position of the arguments."""
    first = values[0]
    kind = type(first)
    if _is_array(first):
        import numpy  # pylint: disable=import-outside-toplevel
        try:
            return numpy.stack(values)
        except ValueError as error:
            raise ValueError(f'cannot batch {path} of the calls to {name}: {error}') from None
    if isinstance(first, (dict, list, tuple)):
        for value in values:
            same_shape = (type(value) is kind and len(value) == len(first) and
                          (not isinstance(first, dict) or value.keys() == first.keys()))
            if not same_shape:
                raise ValueError(f'cannot batch {path} of the calls to {name}: one call '
                                 f'passed {_describe(first)}, another {_describe(value)}')
        if isinstance(first, dict):
            return kind((key, _batch([value[key] for value in values], f'{path}[{key!r}]',
                                     name)) for key in first)
        items = [_batch([value[i] for value in values], f'{path}[{i}]', name)
                 for i in range(len(first))]
        return kind(*items) if hasattr(first, '_fields') else kind(items)
    return list(values)


def _unbatch(result: Any, count: int, name: str, path: str) -> List[Any]:
    """Splits the batched function's result into one result per call."""
    if result is None:
        return [None] * count
    if isinstance(result, dict):
        columns = {key: _unbatch(value, count, name, f'{path}[{key!r}]')
                   for key, value in result.items()}
        return [type(result)((key, column[i]) for key, column in columns.items())
                for i in range(count)]
    if isinstance(result, tuple):
        columns = [_unbatch(value, count, name, f'{path}[{i}]')
                   for i, value in enumerate(result)]
        if hasattr(result, '_fields'):
            return [type(result)(*row) for row in zip(*columns)] if columns else [result] * count
        return [type(result)(row) for row in zip(*columns)] if columns else [()] * count
    if isinstance(result, list) or (_is_array(result) and getattr(result, 'ndim', 0) > 0):
        if len(result) != count:
            raise ValueError(f'{name} returned {path} with {len(result)} entries for a batch '
                             f'of {count} calls; return one entry per call')
        return list(result)
    raise TypeError(f'{name} returned {path} of type {type(result).__name__}, which cannot '
                    f'be split among {count} calls; return an array or list with one entry '
                    f'per call, or a tuple or dict of those')


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f'a dict with keys {sorted(map(repr, value))}'
    if isinstance(value, (list, tuple)):
        return f'a {type(value).__name__} of length {len(value)}'
    return f'a {type(value).__name__}'
