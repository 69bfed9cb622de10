"""Runs example programs through the launchpad CLI, bounded in time, and checks they leave nothing.

Every run gets a private, empty TMPDIR and a marker in its environment, which every node process
inherits; after the run no process may carry the marker and the TMPDIR must be empty again.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import List

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, 'examples')
_MARKER = 'LAUNCHPAD_EXAMPLE_TEST_RUN'
_PREFIX = re.compile(r'^\[[\w/.+-]+\] ')  # the node-name prefix local_mp puts on output lines


@dataclasses.dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> List[str]:
        """Non-empty stdout lines without node-name prefixes."""
        return [_PREFIX.sub('', line) for line in self.stdout.splitlines() if line.strip()]

    @property
    def final_line(self) -> str:
        return self.lines[-1] if self.lines else ''


def _marked_processes(marker: str) -> List[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(_MARKER) == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _kill(processes: List[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=5)


@pytest.fixture
def run_example(tmp_path):
    """run_example(name, launch_type, *args, timeout=60) -> Run, with the program checked to have
    ended completely (no process and no temporary file left)."""

    def run(name: str, launch_type: str, *args: str, timeout: float = 60.0) -> Run:
        marker = uuid.uuid4().hex
        tmpdir = tempfile.mkdtemp(prefix='lp-example-')  # short: Unix socket paths live here
        try:
            return _run(name, launch_type, args, timeout, marker, tmpdir)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _run(name, launch_type, args, timeout, marker, tmpdir) -> Run:
        python_path = [p for p in (os.environ.get('PYTHONPATH'), REPO) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(python_path), TMPDIR=tmpdir,
                   **{_MARKER: marker})
        argv = [sys.executable, '-m', 'launchpad.launch', f'--type={launch_type}',
                os.path.join(EXAMPLES, f'{name}.py'), *args]
        process = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _kill(_marked_processes(marker))
            stdout, stderr = process.communicate()
            pytest.fail(f'{name} under {launch_type} did not end within {timeout} s.\n'
                        f'stdout:\n{stdout}\nstderr:\n{stderr}')
        deadline = time.monotonic() + 5
        left = _marked_processes(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _marked_processes(marker)
        _kill(left)
        assert not left, f'{name} left processes behind: {[p.pid for p in left]}\n{stderr}'
        assert not os.listdir(tmpdir), f'{name} left {os.listdir(tmpdir)} in its TMPDIR'
        return Run(process.returncode, stdout, stderr)

    return run
