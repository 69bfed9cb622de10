"""A benchmark run ends every process it started, even detached ones, and stays within its bound."""
import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import bench_cleanup
from .conftest import WORKLOADS

pytestmark = pytest.mark.timeout(60)

_SPAWNER = textwrap.dedent('''
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(120)
''')


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_marked_processes_are_ended_even_in_other_sessions():
    marker = bench_cleanup.new_marker()
    env = {**os.environ, bench_cleanup.MARKER_ENV: marker}
    parent = subprocess.Popen([sys.executable, '-c', _SPAWNER], env=env, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        detached = int(parent.stdout.readline())
        assert {p.pid for p in bench_cleanup.marked_processes(marker)} == {parent.pid, detached}
        assert sorted(bench_cleanup.kill_marked_processes(marker)) == sorted([parent.pid, detached])
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(detached) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(detached)
        assert bench_cleanup.marked_processes(marker) == []
    finally:
        parent.kill()
        parent.stdout.close()
        parent.wait()


_OVERRUN = textwrap.dedent('''
    import subprocess, sys, time
    import bench_harness
    args = bench_harness.parse_args('overrun', ['--workload', 'sync_calls', '--json',
                                                '--timeout', '1'])
    with bench_harness.Session('test', '0', args) as session:
        child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],
                                 start_new_session=True)
        sys.stderr.write(f'{child.pid}\\n')
        sys.stderr.flush()
        time.sleep(120)
''')


def test_run_over_its_time_bound_reports_it_and_ends_its_processes(tmp_path):
    script = tmp_path / 'overrun.py'
    script.write_text(_OVERRUN)
    env = {**os.environ, 'PYTHONPATH': WORKLOADS}
    env.pop(bench_cleanup.MARKER_ENV, None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    # Its bound (1 s) plus the cleanup's grace for the sleeper (SIGTERM, 2 s, then SIGKILL, 2 s:
    # a zombie while its parent sleeps) and the interpreter's start: far less than the sleep
    # (120 s), however loaded the machine (subprocess.run's own limit would fail first).
    assert time.monotonic() - started < 25
    assert done.returncode == 3
    result = json.loads(done.stdout)
    assert 'exceeded its time bound of 1 s' in result['error']
    assert result['workload'] == 'sync_calls' and result['metrics'] == {}
    child = int(done.stderr.strip().splitlines()[0])
    assert _gone(child)
