"""Looking inside running nodes from another shell: `stacks` of nodes busy in Python, blocked in
a call and stuck in C code with the GIL held; `waits` with a real deadlock between two nodes;
`top` in a terminal (tmux)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.request

import pytest

from launchpad.observe import dashboard, inspect_cli, waits
from tests import testbeds
from tests.observe import programs
from tests.observe.programs import environment, observer_of, running, wait_until

pytestmark = pytest.mark.timeout(150)

# a/0 serves `enter`, which holds a lock and calls b/0's `relay`, which calls a/0's `locked`,
# which waits for that lock: a deadlock, which the driver starts. busy/0 spins in Python; stuck/0
# (given a FIFO) blocks in read(2) through ctypes.PyDLL, which keeps the GIL held, until the
# test writes a byte into it.
PROGRAM = '''
import ctypes, os, sys, threading, time
import launchpad as lp

class Peer:
    def __init__(self):
        self.lock = threading.Lock()

    def enter(self, other, me):
        with self.lock:
            return other.relay(me)

    def relay(self, other):
        return other.locked()

    def locked(self):
        if self.lock.acquire(timeout=120):
            self.lock.release()

def driver(a, b):
    threading.Thread(target=a.enter, args=(b, a), daemon=True, name='entering').start()
    lp.wait_for_stop()

def spin_in_python():
    total = 0
    while not lp.wait_for_stop(0):
        for i in range(10000):
            total += i

def hold_the_gil(fifo):
    fd = os.open(fifo, os.O_RDWR)
    time.sleep(1.5)  # a stack sample is taken here
    ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)
    lp.wait_for_stop()

program = lp.Program('tangled')
a = program.add_node(lp.CourierNode(Peer), label='a')
b = program.add_node(lp.CourierNode(Peer), label='b')
program.add_node(lp.PyNode(driver, a, b), label='driver')
if len(sys.argv) > 2:
    program.add_node(lp.PyNode(spin_in_python), label='busy')
    program.add_node(lp.PyNode(hold_the_gil, sys.argv[2]), label='stuck')
lp.launch(program, launch_type=sys.argv[1])
'''


def _launch(tmp_path, *args: str) -> subprocess.Popen:
    script = tmp_path / 'tangled.py'
    script.write_text(PROGRAM)
    return subprocess.Popen([sys.executable, str(script), *args], env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _functions(answer: dict) -> dict:
    """Thread name -> the functions on its stack, outermost first."""
    return {thread['name']: [frame[2] for frame in thread['frames']]
            for thread in answer['stacks']}


def _deadlocked(observer, expected_nodes):
    result = observer.waits()  # what `waits --json` prints
    return result if result['deadlocks'] and expected_nodes <= {
        w['caller'] for w in result['waits']} else None


def _command(capsys, *argv: str):
    """(exit status, stdout, stderr) of `python -m launchpad.launch ARGV`, run here: the same
    code as in a process of its own, without an interpreter's start per look."""
    capsys.readouterr()
    status = inspect_cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _stop(process: subprocess.Popen) -> None:
    observer_of(running('tangled')).stop('the test')
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, out + err


def test_stacks_and_waits_of_a_tangled_local_program(runtime_dir, tmp_path, capsys):
    fifo = tmp_path / 'gil'
    os.mkfifo(fifo)
    process = _launch(tmp_path, 'local_mp', str(fifo))
    try:
        observer = observer_of(wait_until(lambda: running('tangled'), what='the program'))
        result = wait_until(lambda: _deadlocked(observer, {'driver/0', 'a/0', 'b/0'}),
                            what='a deadlock')
        # The cycle, with its methods, and the call into it from the driver's own thread.
        [cycle] = result['deadlocks']
        assert [(e['caller'], e['callee'], e['method']) for e in cycle] == [
            ('a/0', 'b/0', 'relay'), ('b/0', 'a/0', 'locked')]
        calls = {(w['caller'], w['callee'], w['method']): w for w in result['waits']}
        assert set(calls) == {('driver/0', 'a/0', 'enter'), ('a/0', 'b/0', 'relay'),
                              ('b/0', 'a/0', 'locked')}
        assert calls['driver/0', 'a/0', 'enter']['thread'] == 'entering'
        assert [w['age'] for w in result['waits']] == sorted(
            (w['age'] for w in result['waits']), reverse=True)
        assert sorted((s['node'], s['method']) for s in result['serving']) == [
            ('a/0', 'enter'), ('a/0', 'locked'), ('b/0', 'relay')]
        text = _command(capsys, 'waits', 'tangled')[1]
        assert 'DEADLOCK: a/0 -> b/0 (relay, ' in text and ') -> a/0 (locked, ' in text

        # Stuck with the GIL held: no live answer, its last sample, for how long.
        def stuck():
            answer = observer.probe(['stacks'], 'stuck/0')['nodes']['stuck/0']
            return answer if not answer['live'] and answer['silent'] > 3 else None
        answer = wait_until(stuck, what='stuck/0 silent for 3 s')
        assert 'hold_the_gil' in _functions(answer)['MainThread']
        # Its stacks now, from its fault handler: in the read that holds the GIL.
        holding = PROGRAM.splitlines().index(
            '    ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)') + 1
        assert f'tangled.py", line {holding} in hold_the_gil' in answer['dumped']
        assert answer['unchanged'] >= answer['silent'] - 2

        def all_live_but_stuck():  # on a busy machine a node may miss a probe's 0.5 s
            nodes = observer.probe(['stacks'])['nodes']  # what `stacks --json` prints
            return nodes if all(nodes[name]['live']
                                for name in ('a/0', 'b/0', 'driver/0', 'busy/0')) else None

        nodes = wait_until(all_live_but_stuck, what='the other nodes answering live')
        assert not nodes['stuck/0']['live']
        assert 'spin_in_python' in _functions(nodes['busy/0'])['MainThread']
        assert '_call' in _functions(nodes['driver/0'])['entering']  # blocked in a call
        served = [[frame[2] for frame in thread['frames']] for thread in nodes['a/0']['stacks']]
        assert any('enter' in f for f in served) and any('locked' in f for f in served)

        def stacks_with_busy_live():
            text = _command(capsys, 'stacks', 'tangled')[1]
            return text if '== busy/0: live (pid ' in text else None

        text = wait_until(stacks_with_busy_live, what='busy/0 answering `stacks` live')
        assert '== stuck/0: NO ANSWER; silent for ' in text and 'holds the GIL' in text
        assert 'in spin_in_python' in text
        assert 'stuck/0' in observer.waits()['silent']

        status, _, err = _command(capsys, 'stacks', 'tangled', 'nobody/0')
        assert status == 1 and "has no node 'nobody/0'" in err

        with open(fifo, 'wb') as release:  # it lets go of the GIL, and answers again
            release.write(b'x')
        wait_until(lambda: observer.probe(['stacks'], 'stuck/0')['nodes']['stuck/0']['live'],
                   what='stuck/0 answering again')
        _stop(process)
    finally:
        programs.end(process)


def test_stacks_and_waits_of_nodes_running_as_threads(runtime_dir, tmp_path, capsys):
    process = _launch(tmp_path, 'local_mt')
    try:
        observer = observer_of(wait_until(lambda: running('tangled'), what='the program'))
        result = wait_until(lambda: _deadlocked(observer, {'a/0', 'b/0'}), what='a deadlock')
        [cycle] = result['deadlocks']
        assert [(e['caller'], e['callee'], e['method']) for e in cycle] == [
            ('a/0', 'b/0', 'relay'), ('b/0', 'a/0', 'locked')]
        assert not result['silent']
        probed = observer.probe(['stacks'])
        assert sorted(probed['in_process']) == ['a/0', 'b/0', 'driver/0']
        threads = {thread['name'] for thread in probed['process']['stacks']}
        assert {'entering', 'lp-a/0', 'lp-driver/0'} <= threads
        assert 'threads of the launching process' in _command(capsys, 'stacks', 'tangled')[1]
        served = dashboard.Dashboard(observer)  # the same, one click away on the dashboard
        try:
            stacks = _get(served, '/api/stacks?node=a/0')
            assert 'Thread lp-a/0' in stacks['text'] and stacks['in_process']
            assert 'DEADLOCK: a/0 -> b/0 (relay, ' in _get(served, '/api/waits')['text']
            _see_the_deadlock_drawn(served)
        finally:
            served.close()
        _stop(process)
    finally:
        programs.end(process)


def _see_the_deadlock_drawn(served) -> None:
    """The dashboard's "calls in flight" button draws who waits on whom over the program graph,
    the deadlock's two waits in red (in headless chromium, as test_dashboard_browser)."""
    chromium = programs.chromium()
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=['--no-sandbox'])
        try:
            page = browser.new_page()
            errors = []
            page.on('pageerror', lambda error: errors.append(str(error)))
            page.goto(served.url)
            page.wait_for_selector('#graph .node[data-node="a/0"]', timeout=60_000)
            assert not page.query_selector('#graph .wait')  # drawn only when asked
            page.click('#show-waits')
            for caller, callee, method in (('a/0', 'b/0', 'relay'), ('b/0', 'a/0', 'locked')):
                page.wait_for_selector(f'#graph .wait.deadlock[data-source="{caller}"]'
                                       f'[data-target="{callee}"][data-method="{method}"]',
                                       timeout=30_000)
            assert 'DEADLOCK: a/0 -> b/0' in page.text_content('#inside')
            page.click('#show-stacks')  # the stacks replace the waits, on the graph too
            page.wait_for_function("!document.querySelector('#graph .wait')", timeout=30_000)
            assert not errors, errors
        finally:
            browser.close()


def _get(served, path: str) -> dict:
    request = urllib.request.Request(f'http://127.0.0.1:{served.port}{path}',
                                     headers={dashboard.TOKEN_HEADER: served.token})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _tmux(*args: str, socket: str) -> str:
    done = subprocess.run(['tmux', '-S', socket, *args], capture_output=True, text=True,
                          timeout=30, check=True)
    return done.stdout


def test_top_is_a_live_terminal_view(runtime_dir, tmp_path):
    if shutil.which('tmux') is None:
        testbeds.require_testbed('tmux is not installed (tests/testbeds/install_packages.sh)')
    socket = str(tmp_path / 'tmux.sock')
    process = _launch(tmp_path, 'local_mp')
    command = ' '.join(shlex.quote(f'{k}={v}') for k, v in environment().items()
                       if k in ('PYTHONPATH', 'LAUNCHPAD_RUNTIME_DIR', 'TMPDIR', 'PATH'))
    try:
        wait_until(lambda: running('tangled'), what='the program in the registry')
        _tmux('new-session', '-d', '-x', '160', '-y', '45',
              f'env {command} {sys.executable} -m launchpad.launch top tangled', socket=socket)
        screen = lambda: _tmux('capture-pane', '-p', socket=socket)  # noqa: E731

        def rows_when_all_run():  # a node may still be starting at top's first look
            text = screen()
            rows = {line.split()[0]: line for line in text.splitlines()
                    if line.split() and line.split()[0] in ('a/0', 'b/0', 'driver/0')}
            return (text, rows) if 'RSS' in text and len(rows) == 3 and all(
                ' running ' in row for row in rows.values()) else None

        text, rows = wait_until(rows_when_all_run, what='the node table, every node running')
        for column in ('CPU%', 'THR', 'CALLS/S', 'ERR/S', 'RESTARTS', 'PROGRESS'):
            assert column in text
        assert re.search(r' \d+\.\dM +\d+ ', rows['a/0'])  # RSS, threads: from its process
        _tmux('send-keys', 's', socket=socket)  # the stacks of the first node, a/0
        wait_until(lambda: 'stacks of a/0' in screen() and 'Thread MainThread' in screen(),
                   what="a/0's stacks")
        _tmux('send-keys', 'Escape', socket=socket)
        wait_until(lambda: 'NODE' in screen(), what='the node table again')
        _tmux('send-keys', 'w', socket=socket)
        wait_until(lambda: 'DEADLOCK: a/0 -> b/0' in screen(), what='the waits')
        _tmux('send-keys', 'q', socket=socket)
        wait_until(lambda: 'NODE' in screen(), what='the node table again')
        _tmux('send-keys', 'j', 'l', socket=socket)  # the log of the second node, b/0
        wait_until(lambda: 'log of b/0' in screen() and '(no output yet)' in screen(),
                   what="b/0's log")
        _tmux('send-keys', 'b', socket=socket)
        wait_until(lambda: 'NODE' in screen(), what='the node table again')
        _tmux('send-keys', 'q', socket=socket)  # quits
        wait_until(lambda: subprocess.run(['tmux', '-S', socket, 'has-session'],
                                          capture_output=True).returncode != 0,
                   what='top to end')
        _stop(process)
    finally:
        subprocess.run(['tmux', '-S', socket, 'kill-server'], capture_output=True)
        programs.end(process)


def test_top_needs_a_terminal(capsys):
    status, _, err = _command(capsys, 'top', 'any')  # (pytest's stdin is no terminal)
    assert status == 1 and 'top is a terminal program and needs one' in err


def _wait(caller: str, callee: str, method: str, age: float) -> dict:
    return {'caller': caller, 'callee': callee, 'method': method, 'age': age, 'thread': 't',
            'address': 'unix:x', 'future': False}


def test_a_cycle_is_a_deadlock_once_every_call_in_it_is_old():
    three = [_wait('c/0', 'a/0', 'third', 5.0), _wait('a/0', 'b/0', 'first', 7.0),
             _wait('b/0', 'c/0', 'second', 6.0), _wait('a/0', 'a/0', 'itself', 9.0),
             _wait('d/0', 'e/0', 'young', 0.2), _wait('e/0', 'd/0', 'young', 9.0)]
    [cycle] = waits.deadlocks(three)  # once, from its smallest node; d/0 <-> e/0 is too young
    assert [(e['caller'], e['callee'], e['method']) for e in cycle] == [
        ('a/0', 'b/0', 'first'), ('b/0', 'c/0', 'second'), ('c/0', 'a/0', 'third')]
    assert waits.describe_cycle(cycle) == (
        'a/0 -> b/0 (first, 7.0 s) -> c/0 (second, 6.0 s) -> a/0 (third, 5.0 s)')
    assert len(waits.deadlocks(three, min_age=0.1)) == 2



def _observer_of_pods():
    """An observer as a detached Kubernetes program's coordinator pod without a service account
    has: its coordinator only (no output); worker/0 reported pid 1 from another pod."""
    # pylint: disable=import-outside-toplevel
    import types
    from launchpad.observe.observer import Observer
    from launchpad.process.coordinator import Coordinator
    coordinator = Coordinator(['worker/0', 'local/0'])
    coordinator.node_started('worker/0', os.getpid(), 'another-pod')
    coordinator.node_started('local/0', os.getpid(), socket.gethostname())
    controller = types.SimpleNamespace(
        coordinator=coordinator, status=coordinator.status, launch_type='kubernetes',
        auth_token=None, output=None, done=False, scaling_log=[])
    return Observer(types.SimpleNamespace(name='pods', edges=()), controller)


def test_a_node_with_this_processs_pid_on_another_host_is_probed_not_taken_for_a_thread():
    """A Kubernetes pod's main process is pid 1, in the coordinator pod too: the coordinator
    pod's observer asks worker/0 through the coordinator instead of showing its own threads."""
    probed = _observer_of_pods().probe(['stacks'], timeout=0.1)
    assert probed['in_process'] == ['local/0']
    assert not probed['nodes']['worker/0']['live']  # asked, and silent here
    assert not probed['nodes']['worker/0'].get('in_process')


def test_logs_kept_nowhere_say_where_the_output_goes():
    with pytest.raises(LookupError) as refused:
        _observer_of_pods().logs()
    assert "program 'pods' (kubernetes) keeps no logs of its nodes where it is supervised" in (
        str(refused.value))
    assert '`kubectl logs`' in str(refused.value)
    assert 'nodes in the launching process' not in str(refused.value)  # (it is not there)
