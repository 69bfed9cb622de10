"""A program to look at, run by a launching process of its own, and the CLI run beside it."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, Optional

import courier

from launchpad.observe import registry
from tests.testbeds import require_testbed

REPO = pathlib.Path(__file__).resolve().parents[2]

# Two producers call a counter; each reports what it made, the counter its total.
PROGRAM = '''
import json, sys
import launchpad as lp

class Counter:
    def __init__(self):
        self.total = 0

    def add(self, n):
        self.total += n
        lp.report(total=self.total)
        return self.total

def producer(counter, index):
    made = 0
    while not lp.wait_for_stop(0.05):
        counter.add(1)
        made += 1
        lp.count(produced=1)
        if made % 10 == 1:
            print(f'producer {index} made {made}', flush=True)

launch_type = sys.argv[1]
program = lp.Program('observed')
counter = program.add_node(lp.CourierNode(Counter), label='counter')
with program.group('producer'):
    for i in range(2):
        program.add_node(lp.PyNode(producer, counter, i))
resources = {}
if launch_type == 'ssh':
    hosts = {name: lp.SshHost(name, **options) for name, options in json.loads(sys.argv[2]).items()}
    resources = {'counter': hosts['lp-h1'],
                 'producer': lp.SshHosts([hosts['lp-h2'], hosts['lp-h3']])}
lp.launch(program, launch_type=launch_type, resources=resources)
'''


def environment(**extra: str) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))
    return {**os.environ, 'PYTHONPATH': path, **extra}


def launch(tmp_path, launch_type: str, *args: str) -> subprocess.Popen:
    """Starts PROGRAM in a launching process of its own (the registry comes from our
    environment)."""
    script = tmp_path / 'observed.py'
    script.write_text(PROGRAM)
    return subprocess.Popen([sys.executable, str(script), launch_type, *args], env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@contextlib.contextmanager
def launched(tmp_path, launch_type: str, *args: str) -> Iterator[subprocess.Popen]:
    """PROGRAM running (as `launch` starts it); ended (`end`) if it still runs at the end of
    the block."""
    process = launch(tmp_path, launch_type, *args)
    try:
        yield process
    finally:
        end(process)


def end(process: subprocess.Popen) -> None:
    """Ends a launch that a failed test left running: a Ctrl-C first, so that its nodes stop
    and its registry entry goes, and the fixture reports the failure, not leftovers of it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m launchpad.launch ARGS` in a process of its own."""
    return subprocess.run([sys.executable, '-m', 'launchpad.launch', *args], env=environment(),
                          capture_output=True, text=True, timeout=timeout)


def cli_json(*args: str) -> Any:
    done = cli(*args, '--json')
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = '') -> Any:
    """Polls `check` until it returns something true, which it returns; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f'not within {timeout} s: {what or check}'
        time.sleep(0.1)


def running(name: str) -> Optional[registry.Entry]:
    """The registry entry of the running program `name` (read here: waiting through the CLI
    would start an interpreter per look)."""
    return next((entry for entry in registry.entries() if entry.name == name), None)


def observer_of(entry: registry.Entry) -> courier.Client:
    """A client of the program's observer, as the CLI makes it."""
    return courier.Client(entry.address, auth_token=entry.token, wait_for_ready=False)


def chromium() -> str:
    """The headless browser the dashboard tests drive (with Playwright), or a test bed's skip."""
    path = shutil.which('chromium') or shutil.which('chromium-browser')
    if path is None:
        require_testbed('no chromium to run the dashboard in: install it with '
                        'tests/testbeds/install_packages.sh (as root)')
    try:
        import playwright.sync_api  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        require_testbed("playwright is not installed: pip install -e '.[test]'")
    return path
