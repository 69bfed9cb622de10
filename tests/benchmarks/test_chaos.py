"""benchmarks/chaos.py, short: under a SIGKILL, a hang and a SIGTERM on local_mp, and those and a
host cut off the network on the SSH bed, the learner consumes every item the actors produced
once, and every faulted node runs again."""
import functools
import math

import pytest

import chaos
from tests.launch.test_ssh import hosts  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(120)


def check(result: chaos.Result, kinds: list) -> None:
    assert result.consumed > 0
    assert (result.lost, result.duplicates, result.gaps) == (0, 0, 0)
    assert sorted(result.recoveries) == kinds
    assert all(math.isfinite(t) for times in result.recoveries.values() for t in times)


def test_faults_lose_nothing_and_deliver_nothing_twice():
    check(chaos.run(6.5, actors=3, faults=True, interval=2, seed=1, deadline=2.0),
          ['hang', 'kill', 'term'])


def test_on_ssh_hosts_a_host_cut_off_the_network_loses_nothing(hosts):  # noqa: F811
    check(chaos.run(20, actors=3, faults=True, interval=2, seed=1, deadline=2.0,
                    launch_type='ssh', hosts=[hosts[f'lp-h{i}'] for i in (1, 2, 3)],
                    cut=functools.partial(chaos.cut_off, seconds=10)),
          ['cut', 'hang', 'kill', 'term'])
