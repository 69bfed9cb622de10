"""The suite's pytest-xdist groups (tests/worker_groups.py): a file's tests share a worker, and so
do all tests of the test beds, wherever they are, whichever way they use a bed."""
from __future__ import annotations

import collections
import os
import pathlib
import subprocess
import sys

import pytest

from tests import worker_groups

REPO = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)

CONFTEST = '''
import pytest

from tests import worker_groups
from tests.conftest import (pytest_collection_modifyitems, pytest_configure, pytest_unconfigure,
                            pytest_xdist_make_scheduler)

@pytest.fixture(scope='session')
def ssh_testbed():  # stands in for the real bed's session fixture
    return 'hosts'

@pytest.fixture
def hosts(ssh_testbed):  # as tests/launch/test_ssh.py's, a bed reached through a fixture
    return ssh_testbed
'''

RECORDING_TESTS = '''
import os, pytest

{mark}
@pytest.mark.parametrize('i', range(6))
def test_{name}(i{fixture}):
    with open(os.environ['WHERE_TESTS_RAN'], 'a') as f:
        f.write('{group} ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')
'''


def _tests(name: str, group: str, fixture: str = '', mark: str = '') -> str:
    return RECORDING_TESTS.format(name=name, group=group, fixture=fixture and f', {fixture}',
                                  mark=mark)


def test_a_files_tests_share_a_worker_and_all_bed_tests_share_one(tmp_path):
    """Six tests in each of four files, three workers: the two files of bed tests (one through a
    fixture of the SSH bed's, one holding the Slurm bed) run in one worker, each other file in
    one; the directory the workers told the scheduler through is gone at the end."""
    suite, temp = tmp_path / 'suite', tmp_path / 'temp'
    suite.mkdir()
    temp.mkdir()
    (suite / 'pytest.ini').write_text('[pytest]\naddopts = -n 3 --dist loadgroup\n')
    (suite / 'conftest.py').write_text(CONFTEST)
    (suite / 'test_one.py').write_text(_tests('one', 'one'))
    (suite / 'test_two.py').write_text(_tests('two', 'two'))
    (suite / 'test_ssh.py').write_text(_tests('ssh', 'bed', fixture='hosts'))
    (suite / 'test_slurm.py').write_text(_tests('slurm', 'bed', mark="@pytest.mark.holds('slurm')"))
    where = tmp_path / 'where'
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTEST_')}
    env.update(WHERE_TESTS_RAN=str(where), TMPDIR=str(temp), PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), env.get('PYTHONPATH')])))
    done = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-q', '.'],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = collections.defaultdict(list)
    for line in where.read_text().splitlines():
        group, worker = line.split()
        workers[group].append(worker)
    assert {group: len(ran) for group, ran in workers.items()} == {'one': 6, 'two': 6, 'bed': 12}
    assert {group: len(set(ran)) for group, ran in workers.items()} == {
        'one': 1, 'two': 1, 'bed': 1}, dict(workers)
    assert not list(temp.glob('lp-test-groups-*'))


class _Item:
    """What worker_groups reads of a collected test."""

    def __init__(self, nodeid: str, fixtures=(), holds=()):
        self.nodeid, self.fixturenames, self._holds = nodeid, list(fixtures), holds
        self.path = REPO / nodeid.split('::')[0]

    def iter_markers(self, name):
        return [pytest.mark.holds(*self._holds).mark] if name == 'holds' and self._holds else []


def test_the_podman_beds_tests_have_a_group_of_their_own_unless_a_test_mixes_beds():
    items = [_Item('tests/testbeds/test_testbeds.py::test_require'),
             _Item('tests/testbeds/test_testbeds.py::test_pods', holds=('podman',)),
             _Item('tests/launch/test_pods.py::test_run', fixtures=['podman_testbed']),
             _Item('tests/launch/test_slurm.py::test_job', fixtures=['_slurm_testbed']),
             _Item('tests/launch/test_slurm.py::test_parse'),
             _Item('tests/pool/test_pool_ssh.py::test_map', holds=('ssh',))]
    assert worker_groups.groups(items) == {
        'tests/testbeds/test_testbeds.py::test_require': 'testbeds',
        'tests/testbeds/test_testbeds.py::test_pods': 'testbeds-podman',
        'tests/launch/test_pods.py::test_run': 'testbeds-podman',
        'tests/launch/test_slurm.py::test_job': 'testbeds',
        'tests/launch/test_slurm.py::test_parse': 'tests/launch/test_slurm.py',
        'tests/pool/test_pool_ssh.py::test_map': 'testbeds'}
    both = items + [_Item('tests/test_all.py::test_all', ['ssh_testbed', 'podman_testbed'])]
    assert set(worker_groups.groups(both).values()) == {'testbeds', 'tests/launch/test_slurm.py'}
