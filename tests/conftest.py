"""Fixtures shared by the whole test suite: the multi-host test beds (see tests/testbeds)."""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import tempfile
import threading
from typing import Iterator

import pytest

from tests import testbeds
from tests import worker_groups

TESTBEDS_DIR = worker_groups.TESTBEDS_DIR


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs the test beds' own tests first: they bring each bed up and down themselves, which
    they cannot do while a session fixture below holds that bed. In a pytest-xdist worker, also
    tells the scheduler which tests share a worker (tests/worker_groups.py)."""
    items.sort(key=lambda item: TESTBEDS_DIR not in pathlib.Path(str(item.path)).parents)
    worker_groups.record(config, items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a run may lack
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return worker_groups.make_scheduler(config, log)


def _private_directory(variable: str, prefix: str) -> Iterator[str]:
    """A new directory named by the environment variable `variable` until the end, then
    removed (and the variable as it was)."""
    path = tempfile.mkdtemp(prefix=prefix)
    before = os.environ.get(variable)
    os.environ[variable] = path
    yield path
    if before is None:
        del os.environ[variable]
    else:
        os.environ[variable] = before
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope='session', autouse=True)
def private_registry() -> Iterator[str]:
    """Programs the tests launch register in a registry of their own (launchpad/observe/
    registry.py), not in the user's, and leave no registry directory behind."""
    yield from _private_directory('LAUNCHPAD_RUNTIME_DIR', 'lp-runtime-tests-')


@pytest.fixture(scope='session', autouse=True)
def private_runs() -> Iterator[str]:
    """Programs the tests launch keep their run directories (launchpad/observe/runstore.py) in
    a directory of their own, removed at the end, not in the user's."""
    yield from _private_directory('LAUNCHPAD_RUNS_DIR', 'lp-runs-tests-')


@pytest.fixture(scope='session')
def ssh_testbed() -> Iterator[list[testbeds.SshHost]]:
    """Three SSH hosts lp-h1..3 (see testbeds.ssh_hosts), up for the whole session."""
    with testbeds.ssh_hosts(3) as hosts:
        yield hosts


@pytest.fixture(scope='session')
def _slurm_testbed() -> Iterator[testbeds.SlurmTestbed]:
    with testbeds.slurm_testbed() as bed:
        yield bed


@pytest.fixture
def slurm_single(_slurm_testbed: testbeds.SlurmTestbed) -> testbeds.SlurmCluster:
    """A one-node Slurm cluster on 127.0.0.1. It stays up for the session; a test that wants
    the other mode switches the cluster (a few seconds), so group tests by mode."""
    return _slurm_testbed.cluster_for('single')


@pytest.fixture
def slurm_multi(_slurm_testbed: testbeds.SlurmTestbed) -> testbeds.SlurmCluster:
    """A three-node Slurm cluster lp-h1..3, one slurmd per network namespace."""
    return _slurm_testbed.cluster_for('multi', 3)


@pytest.fixture(scope='session')
def podman_testbed() -> Iterator[testbeds.PodmanNetwork]:
    """Podman with the offline image localhost/lp-python and the internal network lpnet."""
    with testbeds.podman_network() as network:
        yield network


def _sigterm_as_ctrl_c(signum, frame) -> None:
    """SIGTERM (`timeout`, a CI runner's cancel) ends the run as Ctrl-C does, so that fixtures'
    teardowns run: by default it ends the process at once, and session fixtures leave their
    directories (`lp-runtime-tests-*`, ...) in the temp dir."""
    del frame
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _default_sigterm_in_child() -> None:
    """A process forked from a pytest process (multiprocessing's workers, say) ends at SIGTERM,
    as it would have without `_sigterm_as_ctrl_c`."""
    if signal.getsignal(signal.SIGTERM) is _sigterm_as_ctrl_c:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pytest_configure(config: pytest.Config) -> None:
    # (in the main process and in each pytest-xdist worker: `timeout` signals them all)
    if (signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGTERM, _sigterm_as_ctrl_c)
        os.register_at_fork(after_in_child=_default_sigterm_in_child)
    worker_groups.start(config)
    config.addinivalue_line('markers', 'holds(*beds): keep other processes away from these test '
                                       "beds ('ssh', 'slurm', 'podman') during the test")


def pytest_unconfigure(config: pytest.Config) -> None:
    worker_groups.finish(config)
