"""The dataflow operators: their ordering and back-pressure, over fake actors (futures of a
thread pool, so nothing here is timed) and over a real courier replay node."""
from __future__ import annotations

import concurrent.futures
import gc
import threading

import numpy as np
import pytest

import courier
from launchpad import dataflow as df

pytestmark = pytest.mark.timeout(60)


class FakeActor:
    """A client-like actor: `futures.sample()` returns a future this test completes (or at once
    with `auto=True`); it records every call and the most calls it ever had in flight."""

    def __init__(self, name, auto=True):
        self.name, self.auto = name, auto
        self.calls, self.in_flight, self.most_in_flight = [], 0, 0
        self.pending = []
        self._lock = threading.Lock()
        self.futures = self

    def _future(self, method, value):
        future = concurrent.futures.Future()
        with self._lock:
            self.calls.append(method)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

        def done(_):
            with self._lock:
                self.in_flight -= 1
        future.add_done_callback(done)
        if self.auto:
            future.set_result(value)
        else:
            self.pending.append((future, value))
        return future

    def sample(self):
        n = self.calls.count('sample')
        return self._future('sample', {'x': np.array([f'{self.name}{n}'] * 2)})

    def double(self, batch):
        return self._future('double', {'x': np.concatenate([batch['x'], batch['x']])})

    def metrics(self):
        return self._future('metrics', [1.0, 3.0])


def names(batches):
    return [b['x'][0] for b in batches]


def test_gather_async_keeps_num_async_calls_in_flight_per_actor_and_starts_one_per_item():
    actors = [FakeActor('a'), FakeActor('b'), FakeActor('c')]
    items = df.ParallelIterator.from_actors(actors).gather_async(num_async=2)
    assert all(a.calls == [] for a in actors)  # lazy: nothing runs before the first next()
    taken = items.take(7)
    assert len(taken) == 7
    # An item's replacement starts when the consumer asks for the next item: 6 + 6 calls.
    assert sum(len(a.calls) for a in actors) == 3 * 2 + 6
    assert all(a.most_in_flight <= 2 for a in actors)


def test_gather_async_gives_items_in_the_order_they_complete():
    slow, fast = FakeActor('slow', auto=False), FakeActor('fast', auto=False)
    items = df.ParallelIterator.from_actors([slow, fast]).gather_async()
    results = []
    consumer = threading.Thread(target=lambda: results.extend(items.take(2)))
    consumer.start()
    while not (slow.pending and fast.pending):
        threading.Event().wait(0.001)
    future, value = fast.pending.pop(0)
    future.set_result(value)
    while len(fast.pending) < 1:  # the consumer took fast's item and asked fast for the next
        threading.Event().wait(0.001)
    future, value = slow.pending.pop(0)
    future.set_result(value)
    consumer.join(10)
    assert names(results) == ['fast0', 'slow0']


def test_bulk_sync_rounds_take_one_batch_per_worker_in_worker_order_and_concatenate():
    actors = [FakeActor('a'), FakeActor('b')]
    rounds = df.ParallelRollouts(actors, mode='bulk_sync')
    first = next(rounds)
    assert list(first['x']) == ['a0', 'a0', 'b0', 'b0']
    assert [len(a.calls) for a in actors] == [1, 1]  # the next round waits for the consumer
    assert list(next(rounds)['x']) == ['a1', 'a1', 'b1', 'b1']
    assert rounds.metrics.counters[df.STEPS_SAMPLED] == 8


def test_gather_sync_is_round_robin_over_actors():
    actors = [FakeActor('a'), FakeActor('b')]
    assert names(df.ParallelIterator.from_actors(actors).gather_sync().take(5)) == [
        'a0', 'b0', 'a1', 'b1', 'a2']


def test_par_for_each_runs_each_stage_on_the_actor_that_made_the_item():
    actors = [FakeActor('a'), FakeActor('b')]
    stream = df.ParallelRollouts(actors, mode='raw').par_for_each('double')
    stream = stream.par_for_each(lambda actor, batch: {'x': batch['x'], 'by': actor.name})
    pairs = stream.gather_async().zip_with_source_actor().take(4)
    for actor, item in pairs:
        assert item['by'] == actor.name and len(item['x']) == 4
        assert item['x'][0].startswith(actor.name)
    assert all(a.calls[:2] == ['sample', 'double'] for a in actors)


def test_items_left_in_flight_when_the_consumer_stops_are_cancelled_quietly(caplog):
    class SlowSecondDouble(FakeActor):
        def double(self, batch):
            self.auto = self.calls.count('double') == 0
            return super().double(batch)

    actor = SlowSecondDouble('a')
    items = df.ParallelRollouts([actor], mode='raw').par_for_each('double').gather_async(
        num_async=2)
    assert len(items.take(1)) == 1
    del items
    gc.collect()  # closes the generator: its calls in flight are cancelled
    [(pending, value)] = actor.pending
    assert pending.cancelled()
    with pytest.raises(concurrent.futures.InvalidStateError):
        pending.set_result(value)  # the call finishing late changes nothing downstream
    assert 'exception calling callback' not in caplog.text


def test_a_failing_call_reaches_the_consumer():
    class Broken(FakeActor):
        def sample(self):
            future = concurrent.futures.Future()
            future.set_exception(courier.ServerUnavailableError('gone'))
            return future

    with pytest.raises(courier.ServerUnavailableError, match='gone'):
        df.ParallelRollouts([Broken('x')], mode='async').take(1)


def test_concat_batches_holds_batches_until_the_minimum_size():
    batches = [{'x': np.arange(n)} for n in (3, 3, 5, 1, 1)]
    out = df.LocalIterator(batches).combine(df.ConcatBatches(6)).take(10)
    assert [len(b['x']) for b in out] == [6, 6]  # the last 1 step is held back
    assert list(out[1]['x']) == [0, 1, 2, 3, 4, 0]


def test_round_robin_union_interleaves_by_weight_and_keeps_output_indexes():
    a = df.LocalIterator(['a1', 'a2', 'a3', 'a4'])
    b = df.LocalIterator(['b1', 'b2'])
    assert list(df.Concurrently([a, b], round_robin_weights=[2, 1])) == [
        'a1', 'a2', 'b1', 'a3', 'a4', 'b2']
    side_effects = []
    c = df.LocalIterator(range(3)).for_each(side_effects.append)
    d = df.LocalIterator(['d1', 'd2', 'd3'])
    assert list(df.Concurrently([c, d], output_indexes=[1])) == ['d1', 'd2', 'd3']
    assert side_effects == [0, 1, 2]  # op 0 still ran
    assert list(df.LocalIterator([1]).union(df.LocalIterator([2, 3]))) == [1, 2, 3]


def test_async_union_runs_each_op_at_most_queue_size_items_ahead():
    produced = []

    def counting(tag):
        for i in range(100):
            produced.append(tag)
            yield f'{tag}{i}'

    merged = df.Concurrently([df.LocalIterator(counting('a')), df.LocalIterator(counting('b'))],
                             mode='async', queue_size=2)
    taken = merged.take(5)
    threading.Event().wait(0.2)  # let the producers run as far as they can
    # Each producer holds at most one item it cannot put, beside the 2 in the queue.
    assert len(produced) <= 5 + 2 + 2
    assert sorted(taken + list(merged)) == sorted([f'{t}{i}' for t in 'ab' for i in range(100)])


def test_async_union_raises_an_ops_error():
    def broken():
        yield 1
        raise RuntimeError('op failed')

    with pytest.raises(RuntimeError, match='op failed'):
        list(df.Concurrently([df.LocalIterator(broken), df.LocalIterator([2])], mode='async'))


def test_replay_store_and_sample_through_a_courier_replay_node(tmp_path):
    server = courier.Server(address=f'unix:{tmp_path}/replay.sock')
    server.bind_object(df.ReplayBuffer(capacity=5, min_size=3, seed=0))
    server.Start()
    try:
        replay = courier.Client(server.address)
        samples = df.Replay(replay, num_items=4, num_async=2)
        store = df.LocalIterator([{'obs': np.arange(2)}, {'obs': np.arange(2, 6)}]).for_each(
            df.StoreToReplayBuffer(replay))
        assert len(store.take(2)) == 2
        assert replay.stats() == {'size': 5, 'added': 6}  # capacity 5: step 0 went first
        batch = next(samples)
        assert batch['obs'].shape == (4,) and set(batch['obs']) <= {1, 2, 3, 4, 5}
    finally:
        server.Stop()


def test_standard_metrics_reporting_reports_every_item_with_the_workers_episodes():
    actors = [FakeActor('a'), FakeActor('b')]
    reports = df.StandardMetricsReporting(df.ParallelRollouts(actors), actors).take(2)
    assert [r['episodes_total'] for r in reports] == [4, 8]
    assert reports[1]['episode_return_mean'] == 2.0
    assert reports[1]['counters'][df.STEPS_SAMPLED] == 8
    assert list(reports[0]['info']['x']) == ['a0', 'a0', 'b0', 'b0']


@pytest.mark.parametrize('call, message', [
    (lambda: df.ParallelRollouts([FakeActor('a')], mode='sideways'), 'Unknown rollout mode'),
    (lambda: df.ParallelRollouts([]), 'at least one actor'),
    (lambda: df.ParallelRollouts([FakeActor('a')], mode='async', num_async=0), 'num_async'),
    (lambda: df.Concurrently([df.LocalIterator([])], mode='zigzag'), 'Unknown mode'),
    (lambda: df.Concurrently([df.LocalIterator([])], output_indexes=[3]), 'do not exist'),
    (lambda: df.ConcatBatches(0), 'min_batch_size'),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
