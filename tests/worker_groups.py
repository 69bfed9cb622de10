"""Which tests share a pytest-xdist worker, and a scheduler that keeps each group in one worker.

pyproject.toml runs the suite in worker processes (`-n 3 --dist loadgroup`). A group's tests run
in one worker, in collection order, as a plain session would run them: every test of a test bed
(tests/testbeds, a bed's session fixture, or `@pytest.mark.holds`) is in the group 'testbeds',
since a bed is machine-wide and held by one process for a whole session; every other test is in
its file's group, so that module-scoped fixtures start once and a file's tests never race each
other (mypy's cache in tests/test_typing.py, for one).

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
from typing import Any, Dict, Iterable

import pytest

from tests import testbeds

GROUPS_DIR_ENV = 'LAUNCHPAD_TEST_GROUPS_DIR'  # where workers write {node id: group}
BEDS_GROUP = 'testbeds'
BED_FIXTURES = frozenset({'ssh_testbed', '_slurm_testbed', 'podman_testbed'})
TESTBEDS_DIR = pathlib.Path(testbeds.__file__).parent


def group_of(item: pytest.Item) -> str:
    """The group of a collected test: 'testbeds' for a test of a bed, else its file."""
    path = pathlib.Path(str(item.path))
    uses_a_bed = (TESTBEDS_DIR in path.parents or item.get_closest_marker('holds') is not None
                  or BED_FIXTURES.intersection(getattr(item, 'fixturenames', ())))
    return BEDS_GROUP if uses_a_bed else item.nodeid.split('::')[0]


def start(config: pytest.Config) -> None:
    """In the controlling process of a distributed run: the directory the workers write to."""
    if _distributed(config) and not hasattr(config, 'workerinput'):
        os.environ[GROUPS_DIR_ENV] = tempfile.mkdtemp(prefix='lp-test-groups-')


def finish(config: pytest.Config) -> None:
    if _distributed(config) and not hasattr(config, 'workerinput'):
        shutil.rmtree(os.environ.pop(GROUPS_DIR_ENV, ''), ignore_errors=True)


def record(config: pytest.Config, items: Iterable[pytest.Item]) -> None:
    """In a worker: writes each collected test's group for the controlling process."""
    directory = os.environ.get(GROUPS_DIR_ENV)
    if directory is None or not hasattr(config, 'workerinput'):
        return
    worker = config.workerinput['workerid']
    partial = pathlib.Path(directory, f'{worker}.json.partial')
    partial.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
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

    return GroupScheduling(config, log)
