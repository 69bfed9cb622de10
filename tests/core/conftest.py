"""Fixtures for the core tests: every test must leave no process or temp directory behind."""
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tests.leftovers import no_new_children, no_new_temp_dirs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='package', autouse=True)
def private_tmpdir(tmp_path_factory):
    """Launches in these tests (and the scripts they run) make their directories in here."""
    path = str(tmp_path_factory.mktemp('launches'))
    old_env, old_tempdir = os.environ.get('TMPDIR'), tempfile.tempdir
    os.environ['TMPDIR'] = tempfile.tempdir = path
    yield path
    tempfile.tempdir = old_tempdir
    if old_env is None:
        del os.environ['TMPDIR']
    else:
        os.environ['TMPDIR'] = old_env


@pytest.fixture(autouse=True)
def no_leftovers(private_tmpdir):
    """Fails a test that leaves child processes or program directories behind."""
    del private_tmpdir
    with no_new_temp_dirs(grace=0), no_new_children():
        yield


def run_script(source: str, *args, timeout=60, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Runs `source` as a Python script in a fresh interpreter and returns what it did."""
    with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f:
        f.write(source)
    try:
        return subprocess.run([sys.executable, f.name, *args], capture_output=True, text=True,
                              timeout=timeout, env=script_env(env), **kwargs)
    finally:
        os.unlink(f.name)


def script_env(extra=None):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
    env.update(extra or {})
    return env


def wait_until(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
