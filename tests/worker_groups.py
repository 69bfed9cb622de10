"""Which tests share a pytest-xdist worker, and a scheduler that keeps each group in one worker.

pyproject.toml runs the suite in worker processes (`-n 2 --dist loadgroup`). A group's tests run
in one worker, in collection order, as a plain session would run them. A test bed is machine-wide
and a session fixture holds it for the whole session, so the tests of a bed share a worker: those
of the podman bed alone in the group 'testbeds-podman', all other bed tests (the SSH and Slurm
beds share a network) in 'testbeds'; a test uses a bed through a bed's session fixture, or names
it with `@pytest.mark.holds(...)` (tests/testbeds' own tests that bring a bed up themselves must).
Should a test use the podman bed and another, the podman tests join 'testbeds'. Every other test
is in its file's group, so that module-scoped fixtures start once and a file's tests never race
each other (mypy's cache in tests/test_typing.py, for one).

The groups come from what the workers collected (fixture names are known there only), through a
directory the controlling process makes: pytest-xdist's own `xdist_group` suffix on node ids is
not written under pytest 9.2 (pytest-xdist issue 1386), so this does not rely on it.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Dict, Sequence, Set

import pytest

from tests import testbeds

GROUPS_DIR_ENV = 'LAUNCHPAD_TEST_GROUPS_DIR'  # where workers write {node id: group}
BEDS_GROUP = 'testbeds'
PODMAN_GROUP = 'testbeds-podman'
BED_FIXTURES = {'ssh_testbed': 'ssh', '_slurm_testbed': 'slurm', 'podman_testbed': 'podman'}
TESTBEDS_DIR = pathlib.Path(testbeds.__file__).parent


def beds_of(item: pytest.Item) -> Set[str]:
    """The beds a test uses: through their session fixtures, or held by name."""
    beds = {bed for fixture, bed in BED_FIXTURES.items()
            if fixture in getattr(item, 'fixturenames', ())}
    for marker in item.iter_markers('holds'):
        beds.update(marker.args)
    return beds


def groups(items: Sequence[pytest.Item]) -> Dict[str, str]:
    """Node id -> group, for every test of `items` (see above)."""
    beds = {item.nodeid: beds_of(item) for item in items}
    podman_alone = not any('podman' in used and len(used) > 1 for used in beds.values())
    found = {}
    for item in items:
        used = beds[item.nodeid]
        if used == {'podman'} and podman_alone:
            found[item.nodeid] = PODMAN_GROUP
        elif used or TESTBEDS_DIR in pathlib.Path(str(item.path)).parents:
            found[item.nodeid] = BEDS_GROUP
        else:
            found[item.nodeid] = item.nodeid.split('::')[0]
    return found


def start(config: pytest.Config) -> None:
    """In the controlling process of a distributed run: the directory the workers write to."""
    if _distributed(config) and not hasattr(config, 'workerinput'):
        os.environ[GROUPS_DIR_ENV] = tempfile.mkdtemp(prefix='lp-test-groups-')


def finish(config: pytest.Config) -> None:
    if _distributed(config) and not hasattr(config, 'workerinput'):
        shutil.rmtree(os.environ.pop(GROUPS_DIR_ENV, ''), ignore_errors=True)


def record(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """In a worker: writes each collected test's group for the controlling process."""
    directory = os.environ.get(GROUPS_DIR_ENV)
    if directory is None or not hasattr(config, 'workerinput'):
        return
    worker = config.workerinput['workerid']
    partial = pathlib.Path(directory, f'{worker}.json.partial')
    partial.write_text(json.dumps(groups(items)))
    partial.rename(partial.with_suffix(''))  # whole or absent


def _distributed(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin('xdist') and config.getoption('dist', 'no') != 'no'


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A `--dist loadgroup` scheduler that sends each group (see above) to one worker whole."""
    if config.getvalue('dist') != 'loadgroup':
        return None
    from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

    class GroupScheduling(LoadScopeScheduling):
        """Scopes are the groups the workers recorded (a test none recorded: its file)."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self._groups: Dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # read once every worker has collected (and written)
                self._groups = {}
                directory = pathlib.Path(os.environ.get(GROUPS_DIR_ENV, '/nonexistent'))
                for path in sorted(directory.glob('*.json')):
                    self._groups.update(json.loads(path.read_text()))
            return self._groups.get(nodeid) or nodeid.split('::')[0]

        def _assign_work_unit(self, node: Any) -> None:
            """The beds' groups first: the longest, and each needs a worker to itself."""
            for group in (PODMAN_GROUP, BEDS_GROUP):
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
