"""benchmarks/chaos.py, short: under a SIGKILL, a hang and a SIGTERM on local_mp, and those and a
host cut off the network on the SSH bed, the learner consumes every item the actors produced
once, and every faulted node runs again; an actor's outbox keeps what an unreachable replay did
not accept."""
import functools
import math
import threading

import pytest

import chaos
from tests.launch.test_ssh import hosts  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(120)


def check(result: chaos.Result, kinds: list) -> None:
    assert result.consumed > 0
    assert (result.lost, result.duplicates, result.gaps) == (0, 0, 0)
    assert sorted(result.recoveries) == kinds
    assert all(math.isfinite(t) for times in result.recoveries.values() for t in times)
    # The segments between faults cover the run, and the shortfall per fault adds up.
    assert sum(seconds for _, seconds, _ in result.segments) == pytest.approx(result.seconds)
    assert sum(consumed for _, _, consumed in result.segments) == result.consumed
    shares = result.shortfall(fault_free=2 * result.throughput)
    assert sum(share for _, share in shares.values()) == pytest.approx(0.5)
    assert sum(count for count, _ in shares.values()) == 1 + sum(map(len, result.recoveries.values()))


def test_faults_lose_nothing_and_deliver_nothing_twice():
    check(chaos.run(6.5, actors=3, faults=True, interval=2, seed=1, deadline=2.0),
          ['hang', 'kill', 'term'])


def test_on_ssh_hosts_a_host_cut_off_the_network_loses_nothing(hosts):  # noqa: F811
    result = chaos.run(20, actors=3, faults=True, interval=2, seed=1, deadline=2.0,
                       launch_type='ssh', hosts=[hosts[f'lp-h{i}'] for i in (1, 2, 3)],
                       cut=functools.partial(chaos.cut_off, seconds=10))
    check(result, ['cut', 'hang', 'kill', 'term'])
    placed = {'lp-h1': ['actor/0', 'replay/0'], 'lp-h2': ['actor/1', 'learner/0'],
              'lp-h3': ['actor/2']}
    assert result.cuts and all(nodes == placed[host] for host, nodes in result.cuts)
    assert [f'cut {host}' for host, _ in result.cuts] == [
        fault for fault, _, _ in result.segments if fault.startswith('cut')]


class _Replay:
    """The replay's insert, in memory: it can be unreachable, lose its answers, or forget."""

    def __init__(self):
        self.items, self.unreachable, self.answers_lost = [], False, False

    def insert(self, actor: int, first: int, count: int) -> int:
        if self.unreachable:
            raise ConnectionError('no route to host')
        if first == len(self.items):
            self.items.extend(range(first, first + count))
        if self.answers_lost:
            raise TimeoutError('the answer never came')
        return len(self.items)


def test_an_outbox_keeps_what_the_replay_did_not_accept_and_numbers_each_item_once():
    replay = _Replay()
    box = chaos._Outbox(replay, 0, capacity=100, stop=threading.Event())
    replay.unreachable = True
    assert box.put(20) == 20
    box.flush()
    assert (box.pending, replay.items) == (20, [])
    assert box.put(20) == 20  # the actor goes on producing
    replay.unreachable, replay.answers_lost = False, True
    box.flush()  # accepted, but the actor does not know
    assert (box.pending, len(replay.items)) == (40, 40)
    replay.answers_lost = False
    box.put(20)
    box.flush()  # refused (it starts at 0); the answer says the first 40 are in
    assert (box.pending, box.acked) == (20, 40)
    box.flush()
    assert (box.pending, box.acked, replay.items) == (0, 60, list(range(60)))
    replay.unreachable = True
    assert box.put(150) == 100  # full: what finds no room is not produced
    replay.unreachable = False
    del replay.items[50:]  # restored from an older checkpoint: numbers 50..59 are made again
    box.flush()
    box.flush()
    assert (box.pending, box.acked, replay.items) == (0, 150, list(range(150)))
