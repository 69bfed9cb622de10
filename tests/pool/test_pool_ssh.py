"""A standalone pool across the SSH test bed's three hosts: a worker SIGKILLed mid-map has its
tasks re-run on the others, and every result arrives exactly once."""
from __future__ import annotations

import pytest

import launchpad as lp
from tests.launch.test_ssh import hosts  # noqa: F401  (the fixture: bed hosts, nothing left)
from tests.pool.test_pool_failures import _live, dies_once

pytestmark = [pytest.mark.timeout(180), pytest.mark.holds('ssh')]


def test_a_pool_over_three_hosts_reruns_a_killed_workers_tasks(hosts, tmp_path):  # noqa: F811
    tmp_path.chmod(0o777)
    marker = str(tmp_path / 'died')
    resources = lp.SshHosts([hosts['lp-h1'], hosts['lp-h2'], hosts['lp-h3']])
    with lp.Pool(3, launch_type='ssh', resources=resources) as pool:
        assert sorted(w['host'] for w in _live(pool).values()) == [
            'lp-h1', 'lp-h2', 'lp-h3']
        results = pool.starmap(dies_once, [(x, marker) for x in range(60)], chunksize=2)
        assert results == [-x for x in range(60)]
        assert list(pool.imap(abs, range(-5, 5))) == [abs(x) for x in range(-5, 5)]
        assert pool.stats['lost'] == 1 and pool.stats['requeued'] >= 1, pool.stats
