"""benchmarks/chaos.py, short: under a SIGKILL, a hang and a SIGTERM on local_mp, the learner
consumes every item the actors produced once, and every faulted node runs again."""
import math

import pytest

import chaos

pytestmark = pytest.mark.timeout(120)


def test_faults_lose_nothing_and_deliver_nothing_twice():
    result = chaos.run(6.5, actors=3, faults=True, interval=2, seed=1, deadline=2.0)
    assert result.consumed > 0
    assert (result.lost, result.duplicates, result.gaps) == (0, 0, 0)
    assert sorted(result.recoveries) == ['hang', 'kill', 'term']
    assert all(math.isfinite(t) for times in result.recoveries.values() for t in times)
