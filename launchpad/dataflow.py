"""Dataflow operators over nodes: a distributed RL algorithm as a few lines of iterator algebra
(RLlib Flow's operators, over courier clients and their futures).

Actors are clients of courier nodes (what handles dereference into inside a node). A
`ParallelIterator` is one stream of remote calls per actor; gathering it gives a
`LocalIterator`, which runs where it is iterated (the driver node or the script) and is
transformed lazily with `for_each`, `filter`, `combine`, `union`, ... Nothing runs until the
driver asks for the next item, so every operator has back-pressure: at most `num_async` calls
are in flight per actor, and an async union runs each input at most `queue_size` items ahead.

    rollouts = ParallelRollouts(workers, mode='async')         # A3C, asynchronous
    train_op = rollouts.for_each(compute_gradients).for_each(ApplyGradients(learner, workers))
    for metrics in StandardMetricsReporting(train_op, workers).take(100): ...

Operators only call clients (any object with `futures.<method>`), so a pipeline runs
unchanged on every launcher. RLlib's rollout workers become courier nodes with
`sample()` (and, for metrics, `metrics()`) methods; batches are dicts of numpy arrays.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import queue
import threading
import time
from typing import (Any, Callable, Deque, Dict, Generic, Iterable, Iterator, List, Literal,
                    Optional, Sequence, Tuple, TypeVar, Union, overload)

T = TypeVar('T')
U = TypeVar('U')
Batch = Dict[str, Any]

STEPS_SAMPLED = 'num_steps_sampled'
STEPS_TRAINED = 'num_steps_trained'


class SharedMetrics:
    """Counters and info shared by every iterator derived from one source (RLlib's
    MetricsContext): operators count steps here; `StandardMetricsReporting` reports them."""

    def __init__(self):
        self.counters: collections.Counter = collections.Counter()
        self.info: Dict[str, Any] = {}
        self.current_actor: Any = None  # the actor the item being processed came from


class LocalIterator(Generic[T]):
    """A lazy iterator with dataflow operators; it runs in the process that iterates it."""

    def __init__(self, items: Union[Iterable[T], Callable[[], Iterable[T]]],
                 metrics: Optional[SharedMetrics] = None, name: str = 'LocalIterator'):
        self._make = items if callable(items) and not hasattr(items, '__iter__') else None
        self._items: Optional[Iterator[T]] = None if self._make else iter(items)
        self.metrics = metrics or SharedMetrics()
        self.name = name

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._items is None:
            self._items = iter(self._make())
        return next(self._items)

    def __repr__(self) -> str:
        return f'LocalIterator[{self.name}]'

    def _derive(self, generate: Callable[[], Iterable[U]], what: str) -> 'LocalIterator[U]':
        return LocalIterator(generate, self.metrics, f'{self.name}.{what}')

    def for_each(self, fn: Callable[[T], U]) -> 'LocalIterator[U]':
        """`fn(item)` for every item, in order."""
        return self._derive(lambda: map(fn, self), f'for_each({_name(fn)})')

    def filter(self, predicate: Callable[[T], bool]) -> 'LocalIterator[T]':
        """The items for which `predicate(item)` is true."""
        return self._derive(lambda: filter(predicate, self), f'filter({_name(predicate)})')

    def combine(self, fn: Callable[[T], Iterable[U]]) -> 'LocalIterator[U]':
        """Every element of `fn(item)` (a flat map; `fn` may return [] to hold items back)."""
        return self._derive(lambda: (out for item in self for out in fn(item)),
                            f'combine({_name(fn)})')

    def batch(self, n: int) -> 'LocalIterator[List[T]]':
        """Lists of `n` consecutive items (the last one may be shorter)."""
        _positive(n, 'n')
        return self._derive(lambda: iter(lambda it=iter(self): list(itertools.islice(it, n)), []),
                            f'batch({n})')

    def zip_with_source_actor(self) -> 'LocalIterator[Tuple[Any, T]]':
        """(actor, item) pairs: the actor that produced each item of a `gather_async`."""
        return self._derive(lambda: ((self.metrics.current_actor, item) for item in self),
                            'zip_with_source_actor')

    def take(self, n: int) -> List[T]:
        """The next `n` items (fewer if the iterator ends)."""
        return list(itertools.islice(self, n))

    def union(self, *others: 'LocalIterator', mode: str = 'round_robin',
              round_robin_weights: Optional[Sequence[int]] = None,
              queue_size: int = 1) -> 'LocalIterator':
        """The items of this iterator and `others` together (see `Concurrently`)."""
        return Concurrently([self, *others], mode=mode, round_robin_weights=round_robin_weights,
                            queue_size=queue_size)


class ParallelIterator(Generic[T]):
    """One stream of items per actor: item i of actor a is `a.<method>(*args)`, then each stage
    of `par_for_each` applied to it on the same actor. Gather it to iterate it."""

    def __init__(self, actors: Sequence[Any], method: str, args: Tuple = (),
                 stages: Tuple[Union[str, Callable], ...] = (),
                 metrics: Optional[SharedMetrics] = None):
        actors = list(actors)
        if not actors:
            raise ValueError('A parallel iterator needs at least one actor (a client of a '
                             'courier node); got none.')
        self.actors = actors
        self._method, self._args, self._stages = method, tuple(args), tuple(stages)
        self.metrics = metrics or SharedMetrics()

    @classmethod
    def from_actors(cls, actors: Sequence[Any], method: str = 'sample', *args
                    ) -> 'ParallelIterator':
        """Each actor's stream: the results of calling `method(*args)` on it again and again."""
        return cls(actors, method, args)

    def par_for_each(self, stage: Union[str, Callable[[Any, Any], Any]]) -> 'ParallelIterator':
        """Transforms each item on its shard: a method name is called on the actor that produced
        the item, with the item (`actor.<stage>(item)`); a callable is called as
        `stage(actor, item)` in the gathering process and may return a future."""
        return ParallelIterator(self.actors, self._method, self._args, self._stages + (stage,),
                                self.metrics)

    def _start(self, actor: Any) -> concurrent.futures.Future:
        """Starts one item of `actor`'s stream; the future gives the item after every stage."""
        future = getattr(actor.futures, self._method)(*self._args)
        for stage in self._stages:
            future = _then(future, actor, stage)
        return future

    def gather_async(self, num_async: int = 1) -> LocalIterator:
        """Items as they complete, from any actor; each actor has `num_async` items in flight,
        and a new one is started only when the consumer takes one."""
        _positive(num_async, 'num_async')

        def generate() -> Iterator:
            in_flight: Dict[concurrent.futures.Future, int] = {}  # -> its actor's index
            for index, actor in enumerate(self.actors):
                for _ in range(num_async):
                    in_flight[self._start(actor)] = index
            try:
                while in_flight:
                    done, _ = concurrent.futures.wait(
                        in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in sorted(done, key=in_flight.__getitem__):
                        index = in_flight.pop(future)
                        actor = self.actors[index]
                        item = future.result()
                        self.metrics.current_actor = actor
                        _count(self.metrics, item)
                        yield item
                        in_flight[self._start(actor)] = index
            finally:
                for future in in_flight:
                    future.cancel()

        return LocalIterator(generate, self.metrics, f'gather_async({num_async})')

    def batch_across_shards(self) -> LocalIterator:
        """Lists of one item per actor, in actor order: each round starts every actor's call at
        once and waits for all (bulk synchronous)."""

        def generate() -> Iterator:
            while True:
                futures = [self._start(actor) for actor in self.actors]
                items = [future.result() for future in futures]
                for item in items:
                    _count(self.metrics, item)
                yield items

        return LocalIterator(generate, self.metrics, 'batch_across_shards')

    def gather_sync(self) -> LocalIterator:
        """One item per actor per round, in actor order (rounds as in `batch_across_shards`)."""
        return self.batch_across_shards().combine(lambda items: items)


@overload
def ParallelRollouts(workers: Sequence[Any], mode: Literal['bulk_sync', 'async'] = 'bulk_sync',
                     num_async: int = 1) -> LocalIterator: ...  # pylint: disable=invalid-name


@overload
def ParallelRollouts(workers: Sequence[Any], mode: Literal['raw'],
                     num_async: int = 1) -> ParallelIterator: ...  # pylint: disable=invalid-name


@overload
def ParallelRollouts(workers: Sequence[Any], mode: str,  # pylint: disable=invalid-name
                     num_async: int = 1) -> Union[LocalIterator, ParallelIterator]: ...


def ParallelRollouts(  # pylint: disable=invalid-name
        workers: Sequence[Any], mode: str = 'bulk_sync',
        num_async: int = 1) -> Union[LocalIterator, ParallelIterator]:
    """Experience from rollout workers (clients of nodes with a `sample()` method).

    Modes: 'bulk_sync' (each item is one batch from every worker, concatenated), 'async'
    (each worker's batches as they come, `num_async` requests in flight per worker), 'raw'
    (the `ParallelIterator`, to transform on the workers with `par_for_each` first).
    """
    rollouts = ParallelIterator.from_actors(workers, 'sample')
    if mode == 'bulk_sync':
        return rollouts.batch_across_shards().for_each(concat_batches)
    if mode == 'async':
        return rollouts.gather_async(num_async)
    if mode == 'raw':
        return rollouts
    raise ValueError(f"Unknown rollout mode {mode!r}; use 'bulk_sync', 'async' or 'raw'.")


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """One batch from several: the arrays of each key concatenated along the first axis."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    batches = [batch for batch in batches if batch_size(batch)]
    if not batches:
        return {}
    return {key: np.concatenate([batch[key] for batch in batches]) for key in batches[0]}


def batch_size(batch: Batch) -> int:
    """The number of steps (rows) in a batch: the length of its arrays."""
    return len(next(iter(batch.values()))) if batch else 0


class ConcatBatches:
    """`for_each`'s companion for `combine`: holds batches back until they add up to at least
    `min_batch_size` steps, then gives them as one batch."""

    def __init__(self, min_batch_size: int):
        _positive(min_batch_size, 'min_batch_size')
        self.min_batch_size = min_batch_size
        self._held: List[Batch] = []
        self._count = 0

    def __call__(self, batch: Batch) -> List[Batch]:
        self._held.append(batch)
        self._count += batch_size(batch)
        if self._count < self.min_batch_size:
            return []
        out, self._held, self._count = concat_batches(self._held), [], 0
        return [out]


def Concurrently(  # pylint: disable=invalid-name
        ops: Sequence[LocalIterator], mode: str = 'round_robin',
        output_indexes: Optional[Sequence[int]] = None,
        round_robin_weights: Optional[Sequence[int]] = None,
        queue_size: int = 1) -> LocalIterator:
    """Runs several iterators together and gives their items as one iterator.

    mode='round_robin': in the consumer's thread, `round_robin_weights[i]` items of op i in turn
    (default 1 each); an op that ends drops out. mode='async': each op runs in a thread of its
    own, at most `queue_size` items ahead of the consumer (back-pressure: a producer whose item
    waits in the queue does not compute the next one); items come in the order they are produced.
    `output_indexes` keeps only the items of those ops (the others still run, for their effects).
    """
    ops = list(ops)
    if not ops:
        raise ValueError('Concurrently needs at least one iterator.')
    if mode not in ('round_robin', 'async'):
        raise ValueError(f"Unknown mode {mode!r}; use 'round_robin' or 'async'.")
    keep = set(range(len(ops)) if output_indexes is None else output_indexes)
    if not keep <= set(range(len(ops))):
        raise ValueError(f'output_indexes {sorted(keep)} name ops that do not exist (there are '
                         f'{len(ops)}).')
    metrics = ops[0].metrics
    if mode == 'round_robin':
        weights = list(round_robin_weights or [1] * len(ops))
        if len(weights) != len(ops):
            raise ValueError(f'round_robin_weights has {len(weights)} entries for {len(ops)} ops.')
        for weight in weights:
            _positive(weight, 'a round-robin weight')
        generate = lambda: _round_robin(ops, weights, keep)  # noqa: E731
    else:
        if round_robin_weights is not None:
            raise ValueError("round_robin_weights only applies to mode='round_robin'.")
        _positive(queue_size, 'queue_size')
        generate = lambda: _async_union(ops, keep, queue_size)  # noqa: E731
    return LocalIterator(generate, metrics, f'Concurrently({mode})')


def _round_robin(ops: List[LocalIterator], weights: List[int], keep: set) -> Iterator:
    live = list(range(len(ops)))
    while live:
        for index in list(live):
            for _ in range(weights[index]):
                try:
                    item = next(ops[index])
                except StopIteration:
                    live.remove(index)
                    break
                if index in keep:
                    yield item


_END = object()


def _async_union(ops: List[LocalIterator], keep: set, queue_size: int) -> Iterator:
    """Each op in a thread, feeding one bounded queue: a producer blocks while its items wait."""
    items: queue.Queue = queue.Queue(maxsize=queue_size)
    stop = threading.Event()

    def drain(index: int, op: LocalIterator) -> None:
        try:
            for item in op:
                if not _put(items, (index, item, None), stop):
                    return
        except BaseException as error:  # pylint: disable=broad-except
            _put(items, (index, _END, error), stop)
            return
        _put(items, (index, _END, None), stop)

    threads = [threading.Thread(target=drain, args=(i, op), daemon=True,
                                name=f'lp-dataflow-{op.name}') for i, op in enumerate(ops)]
    for thread in threads:
        thread.start()
    running = len(ops)
    try:
        while running:
            index, item, error = items.get()
            if error is not None:
                raise error
            if item is _END:
                running -= 1
            elif index in keep:
                yield item
    finally:
        stop.set()


def _put(items: queue.Queue, entry: tuple, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            items.put(entry, timeout=0.1)
            return True
        except queue.Full:
            pass
    return False


# --- Replay ----------------------------------------------------------------------------------

class ReplayBuffer:
    """A uniform replay buffer of steps, to serve with `lp.CourierNode(ReplayBuffer, capacity)`:
    `add(batch)` stores a batch's steps (the oldest go first when full), `sample(n)` returns
    `n` steps drawn uniformly (None until it holds `min_size`)."""

    def __init__(self, capacity: int, min_size: int = 1, seed: Optional[int] = None):
        import numpy as np  # pylint: disable=import-outside-toplevel
        _positive(capacity, 'capacity')
        self._capacity, self._min_size = capacity, min_size
        self._rng = np.random.default_rng(seed)
        self._steps: Deque[Dict[str, Any]] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._added = 0

    def add(self, batch: Batch) -> int:
        """Stores every step of `batch`; returns how many steps it holds."""
        rows = [{key: values[i] for key, values in batch.items()}
                for i in range(batch_size(batch))]
        with self._lock:
            self._steps.extend(rows)
            self._added += len(rows)
            return len(self._steps)

    def sample(self, n: int) -> Optional[Batch]:
        """`n` steps drawn uniformly with replacement, as one batch; None if too few are held."""
        import numpy as np  # pylint: disable=import-outside-toplevel
        with self._lock:
            if len(self._steps) < max(self._min_size, 1):
                return None
            picks = [self._steps[i] for i in self._rng.integers(len(self._steps), size=n)]
        return {key: np.stack([row[key] for row in picks]) for key in picks[0]}

    def stats(self) -> Dict[str, int]:
        with self._lock:
            return {'size': len(self._steps), 'added': self._added}


class StoreToReplayBuffer:
    """A `for_each` operator: stores each batch in a replay node and passes it on.

    `replay` is a client of a `ReplayBuffer` node, or a `reverb.Client` of an `lp.ReverbNode`
    (then give `table`: each step is inserted as one item with priority 1)."""

    def __init__(self, replay: Any, table: Optional[str] = None):
        self._replay, self._table = replay, table

    def __call__(self, batch: Batch) -> Batch:
        if self._table is None:
            self._replay.add(batch)
        else:
            keys = sorted(batch)
            with self._replay.trajectory_writer(num_keep_alive_refs=1) as writer:
                for i in range(batch_size(batch)):
                    writer.append({key: batch[key][i] for key in keys})
                    writer.create_item(self._table, priority=1.0,
                                       trajectory={key: writer.history[key][-1] for key in keys})
                writer.flush()
        return batch


def Replay(  # pylint: disable=invalid-name
        replay: Any, num_items: int, num_async: int = 1,
        table: Optional[str] = None) -> LocalIterator[Batch]:
    """Batches of `num_items` steps sampled from a replay node, `num_async` requests in flight;
    while the buffer is too small it waits (it yields nothing). For a `reverb.Client`, `table`
    names the table to sample."""
    _positive(num_items, 'num_items')
    _positive(num_async, 'num_async')
    if table is not None:
        return LocalIterator(lambda: _reverb_samples(replay, table, num_items))

    def generate() -> Iterator[Batch]:
        pending: Deque[concurrent.futures.Future] = collections.deque(
            replay.futures.sample(num_items) for _ in range(num_async))
        while True:
            batch = pending.popleft().result()
            pending.append(replay.futures.sample(num_items))
            if batch is None:
                time.sleep(0.01)
                continue
            yield batch

    return LocalIterator(generate, name='Replay')


def _reverb_samples(client: Any, table: str, num_items: int) -> Iterator[Batch]:
    import numpy as np  # pylint: disable=import-outside-toplevel
    while True:
        steps = [sample[0].data for sample in client.sample(table, num_samples=num_items)]
        yield {key: np.stack([step[key] for step in steps]) for key in steps[0]}


# --- Metrics ---------------------------------------------------------------------------------

def StandardMetricsReporting(  # pylint: disable=invalid-name
        train_op: LocalIterator, workers: Sequence[Any],
        min_history: int = 100) -> LocalIterator[Dict[str, Any]]:
    """After each item of `train_op`, a metrics dict: the episodes the workers finished
    (their `metrics()` method returns the returns of episodes finished since its last call),
    ('returns', in worker order), the mean return over the last `min_history` episodes, the
    shared counters and the time.
    The item itself is under 'info'."""
    returns: Deque[float] = collections.deque(maxlen=min_history)
    started = time.monotonic()
    episodes = [0]

    def report(item: Any) -> Dict[str, Any]:
        futures = [worker.futures.metrics() for worker in workers]
        finished = [value for future in futures for value in future.result()]
        returns.extend(finished)
        episodes[0] += len(finished)
        return {'episodes_total': episodes[0], 'returns': finished,
                'episode_return_mean': (sum(returns) / len(returns)) if returns else float('nan'),
                'counters': dict(train_op.metrics.counters),
                'time_s': time.monotonic() - started, 'info': item}

    return train_op.for_each(report)


# --- Helpers ---------------------------------------------------------------------------------

def _then(future: concurrent.futures.Future, actor: Any, stage: Union[str, Callable]
          ) -> concurrent.futures.Future:
    """A future of `stage` applied (on `actor`) to `future`'s result, once it is there.

    Cancelling the returned future cancels whichever call it is waiting on.
    """
    out: concurrent.futures.Future = concurrent.futures.Future()
    out.add_done_callback(lambda done: done.cancelled() and future.cancel())

    def settle(produce: Callable[[], Any]) -> None:
        try:
            result = produce()
        except BaseException as error:  # pylint: disable=broad-except
            _settle(out, out.set_exception, error)
        else:
            _settle(out, out.set_result, result)

    def step(done: concurrent.futures.Future) -> None:
        if out.done():  # Cancelled by the consumer meanwhile.
            return
        try:
            item = done.result()
            if isinstance(stage, str):
                next_future = getattr(actor.futures, stage)(item)
            else:
                next_future = stage(actor, item)
        except BaseException as error:  # pylint: disable=broad-except
            _settle(out, out.set_exception, error)
            return
        if isinstance(next_future, concurrent.futures.Future):
            out.add_done_callback(lambda done: done.cancelled() and next_future.cancel())
            next_future.add_done_callback(lambda inner: settle(inner.result))
        else:
            _settle(out, out.set_result, next_future)

    future.add_done_callback(step)
    return out


def _count(metrics: SharedMetrics, item: Any) -> None:
    if isinstance(item, dict) and item:
        try:
            metrics.counters[STEPS_SAMPLED] += batch_size(item)
        except TypeError:
            pass


def _positive(value: Any, what: str) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f'{what} must be an integer >= 1, got {value!r}.')


def _name(fn: Any) -> str:
    return getattr(fn, '__name__', type(fn).__name__)


def _settle(future: concurrent.futures.Future, setter: Callable[[Any], None], value: Any) -> None:
    """``setter(value)``, unless ``future`` was cancelled (or completed) meanwhile."""
    try:
        setter(value)
    except concurrent.futures.InvalidStateError:
        pass
