"""Fixtures for the core tests: every test must leave no process or temp directory behind."""
import glob
import os
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

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


def _program_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), 'launchpad-*')))


@pytest.fixture(autouse=True)
def no_leftovers(private_tmpdir):
    """Fails a test that leaves child processes or program directories behind."""
    del private_tmpdir
    dirs_before = _program_dirs()
    me = psutil.Process()
    # Helpers that live as long as the test run (multiprocessing's resource tracker) are no leak.
    children_before = {child.pid for child in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        children = [c for c in me.children(recursive=True)
                    if c.pid not in children_before and c.status() != psutil.STATUS_ZOMBIE]
        if not children:
            break
        time.sleep(0.05)
    assert not children, f'processes left behind: {[c.cmdline() for c in children]}'
    left = _program_dirs() - dirs_before
    assert not left, f'program directories left behind: {left}'


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
