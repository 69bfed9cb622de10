"""A detached local_mp program outlives its launcher and its supervisor (`launchpad.launch.
detached`, `launchpad.launch.supervisor`): one program goes through attach from another process,
grow and shrink, a SIGKILL of its supervisor, re-adoption and stop, and leaves nothing behind."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import launchpad as lp
from launchpad.launch import detached
from launchpad.observe import registry
from tests.launch.detached_program import Counter, idle, make_program
from tests.leftovers import no_new_children

PYTHON = [sys.executable, '-m', 'launchpad.launch']


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON, *args], capture_output=True, text=True, timeout=120,
                          check=check)


def _supervisor_pid(program_id: str) -> int:
    return json.loads(_cli('status', program_id, '--json').stdout)['controller']['pid']


def _calls(path: str, more_than: int) -> int:
    deadline = time.monotonic() + 60
    while Counter.read(path)['calls'] <= more_than:
        assert time.monotonic() < deadline, 'the counter served no more calls'
        time.sleep(0.05)
    return Counter.read(path)['calls']


def _settled(controller, expected: dict) -> dict:
    """Node name -> state, once they are `expected` (a removed node may still be stopping) or
    after 60 s."""
    deadline = time.monotonic() + 60
    while True:
        states = {name: s.state.value for name, s in controller.status().items()}
        if states == expected or time.monotonic() > deadline:
            return states
        time.sleep(0.05)


def test_a_detached_program_outlives_its_launcher_and_its_supervisor(tmp_path, monkeypatch):
    monkeypatch.setenv('LAUNCHPAD_LOGGING_DIR', str(tmp_path / 'logs'))
    counter = str(tmp_path / 'counter.json')
    with no_new_children():  # the daemon is not a child of the launching process
        controller = lp.launch(make_program(counter), launch_type='local_mp', detach=True,
                               supervisor_grace=60)
    program_id = controller.id
    assert controller.detached
    assert {s.state for s in controller.status().values()} == {lp.NodeState.RUNNING}
    supervisor = _supervisor_pid(program_id)
    keeper = registry.find(program_id).keeper_pid
    assert os.getsid(supervisor) == keeper != os.getsid(0)  # a session of its own
    node_pids = {name: s.pid for name, s in controller.status().items()}
    seen = {keeper, supervisor, *node_pids.values()}
    follower = None
    try:
        # Another process attaches and grows the elastic group; this one shrinks it.
        grown = subprocess.run(
            [sys.executable, '-c', 'import sys, launchpad as lp; c = lp.attach(sys.argv[1]); '
             'c.resize("worker", 3); print(c.group_size("worker"))', program_id],
            capture_output=True, text=True, timeout=120, check=True)
        assert grown.stdout.split()[-1] == '3'
        controller.resize('worker', 2)
        assert controller.group_size('worker') == 2
        expected = {**{name: 'running' for name in node_pids}, 'worker/1': 'running',
                    'worker/2': 'removed'}
        assert _settled(controller, expected) == expected
        follower = subprocess.Popen([*PYTHON, 'attach', program_id], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)

        # The supervisor dies; the nodes serve on, and a new one re-adopts them.
        before = _calls(counter, 0)
        os.kill(supervisor, signal.SIGKILL)
        assert _calls(counter, before) > before
        assert _settled(controller, expected) == expected  # answered by the new supervisor
        status = controller.status()
        new_supervisor = registry.find(program_id).pid
        seen.add(new_supervisor)
        assert new_supervisor != supervisor
        assert {name: s.pid for name, s in status.items() if name in node_pids} == node_pids
        assert all(s.restarts == 0 for s in status.values())
        # What it re-adopted includes the program as it grew: the next node is worker/3.
        controller.resize('worker', 3)
        seen.update(s.pid for s in controller.status().values())
        assert 'worker/3' in controller.status()

        stopped = _cli('stop', program_id)
        assert 'Stopped' in stopped.stdout
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert f'Program detached ({program_id}) ended: stopped by' in err
        assert controller.wait(timeout=10)
    finally:
        if not controller.done:
            with contextlib.suppress(detached.ProgramEndedError):  # (keeps the test's own error)
                controller.stop()
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()
    seen.discard(None)
    deadline = time.monotonic() + 30
    while [pid for pid in seen if psutil.pid_exists(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in seen if psutil.pid_exists(pid)]
    assert not glob.glob(os.path.join(tempfile.gettempdir(),
                                      f'{detached.RUN_PREFIX}{program_id}*'))
    assert not glob.glob(str(registry.directory() / f'{program_id}.*'))



def test_without_a_supervisor_the_nodes_wait_for_recover_then_stop_after_the_grace(
        tmp_path, monkeypatch):
    monkeypatch.setenv('LAUNCHPAD_LOGGING_DIR', str(tmp_path / 'logs'))
    program = lp.Program('graceful')
    program.add_node(lp.PyNode(idle), label='idle')
    controller = lp.launch(program, launch_type='local_mp', detach=True, supervisor_grace=12)
    program_id = controller.id
    nodes = {name: s.pid for name, s in controller.status().items()}

    def kill_supervision() -> None:
        entry = registry.find(program_id)
        for pid in (entry.keeper_pid, entry.pid):
            os.kill(pid, signal.SIGKILL)

    kill_supervision()
    follower = subprocess.Popen([*PYTHON, 'attach', '--recover', program_id],
                                stderr=subprocess.PIPE, text=True)
    try:
        assert 'Attached to graceful' in follower.stderr.readline()
        # A new keeper and supervisor re-adopted the nodes: none was restarted.
        status = controller.status()
        assert {name: s.pid for name, s in status.items()} == nodes
        assert {(s.state, s.restarts) for s in status.values()} == {
            (lp.NodeState.RUNNING, 0)}
        # Ctrl-C detaches the follower and leaves the program running.
        follower.send_signal(signal.SIGINT)
        code, said = follower.wait(60), follower.stderr.read()
        assert code == 0 and 'it keeps running' in said, (code, said)
        assert controller.status()
        # Killed again, no supervisor comes back within the grace: the nodes stop by themselves.
        kill_supervision()
    except BaseException:
        with contextlib.suppress(Exception):  # (without a supervisor, nodes stop after the grace)
            controller.stop()
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        raise
    deadline = time.monotonic() + 60
    while [pid for pid in nodes.values() if psutil.pid_exists(pid)]:
        assert time.monotonic() < deadline, 'nodes outlived the supervisor grace'
        time.sleep(0.1)
    assert not glob.glob(os.path.join(tempfile.gettempdir(),
                                      f'{detached.RUN_PREFIX}{program_id}*'))
    assert program_id not in [entry.id for entry in registry.entries()]
    assert not glob.glob(str(registry.directory() / f'{program_id}.*'))


def test_a_killed_keeper_that_init_has_not_reaped_is_gone():
    """`attach --recover` starts a new keeper when the old one is dead, also while it is a
    zombie that init has not reaped yet (a container's init may take a second or more): the
    old check, `kill -0`, said such a keeper lived, so recover waited 60 s for nothing."""
    keeper = subprocess.Popen(['sleep', '60'])  # not waited for: a zombie once killed
    try:
        assert detached._alive(keeper.pid)  # pylint: disable=protected-access
        keeper.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(keeper.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not detached._alive(keeper.pid)  # pylint: disable=protected-access
    finally:
        keeper.kill()
        keeper.wait()
