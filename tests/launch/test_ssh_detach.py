"""A detached SSH program is supervised on one of its hosts (`launchpad.launch.ssh.detach`): it
outlives the process that launched it and the launching machine's network, and this machine
reaches it through ssh (`launchpad.observe.tunnel`)."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import launchpad as lp
from launchpad.launch import detached
from launchpad.launch.launcher import LaunchOptions
from launchpad.launch.ssh import masters, protocol
from launchpad.observe import registry, relay
from tests.core.conftest import wait_until
from tests.launch.detached_program import Counter
from tests.launch.test_detach import _calls
from tests.launch.test_ssh import REPO, host_options, hosts  # pylint: disable=unused-import

pytestmark = pytest.mark.timeout(180)

PYTHON = [sys.executable, '-m', 'launchpad.launch']
BRIDGE, LAUNCHER_ADDRESS = 'lpbr0', '10.200.0.1/24'  # this machine on the SSH bed
H3_LINK = 'lpv3'  # lp-h3's link to the bridge

LAUNCH = '''
import json, sys
import launchpad as lp
from tests.launch.detached_program import make_program
hosts = {name: lp.SshHost(name, **options) for name, options in json.loads(sys.argv[2]).items()}
controller = lp.launch(make_program(sys.argv[1]), launch_type='ssh', detach=True,
                       supervisor_host='lp-h2', resources={
                           'counter': hosts['lp-h1'], 'caller': hosts['lp-h2'],
                           'worker': lp.SshHosts([hosts['lp-h3'], hosts['lp-h1']])})
print('LAUNCHED', controller.id, flush=True)
lp.wait_for_stop()
'''

# A second program, whose supervisor and keeper are killed: its nodes stop after its grace.
LAUNCH_BRIEF = '''
import json, sys
import launchpad as lp
from tests.launch.detached_program import idle
hosts = {name: lp.SshHost(name, **options) for name, options in json.loads(sys.argv[1]).items()}
program = lp.Program('brief')
with program.group('idle'):
    for _ in range(2):
        program.add_node(lp.PyNode(idle))
controller = lp.launch(program, launch_type='ssh', detach=True, supervisor_host='lp-h1',
                       supervisor_grace=10, resources={
                           'idle': lp.SshHosts([hosts['lp-h1'], hosts['lp-h3']])})
print('LAUNCHED', controller.id, flush=True)
'''
CUT = 35.0  # seconds, more than an agent waits for its connection (protocol.LAUNCHER_SILENCE_TIMEOUT)


@pytest.fixture
def short_tmp_path():
    """A new directory with a short path, removed afterwards."""
    path = pathlib.Path(tempfile.mkdtemp(prefix='lp-'))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _new_supervisor(entry: pathlib.Path, old: int) -> int:
    """The pid of the supervisor that replaced `old`, once it serves (from its host's registry
    `entry`)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            pid = json.loads(entry.read_text())['pid']
        except (OSError, ValueError):
            pid = old
        if pid != old and entry.with_suffix('.sock').exists():
            return pid
        assert time.monotonic() < deadline, 'no new supervisor registered'
        time.sleep(0.05)


def _wait_for_line(path: pathlib.Path, text: str, timeout: float = 30.0) -> None:
    """Waits until the file at `path` has a line containing `text`."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors='replace')):
        assert time.monotonic() < deadline, f'{path} never said {text!r}'
        time.sleep(0.1)


def master_pids(directory: str) -> dict:
    """Socket name -> pid of each ssh master connection in `directory` that answers
    (`launchpad.launch.ssh.masters`)."""
    pids = {}
    for name in sorted(os.listdir(directory)):
        if not re.fullmatch(r'h\d+', name):  # (not a master's: 'a...' forwards to an agent)
            continue
        check = subprocess.run(['ssh', '-F', os.devnull, '-S', os.path.join(directory, name),
                                '-O', 'check', 'master'], capture_output=True, text=True,
                               timeout=30, check=False)
        found = re.search(r'pid=(\d+)', check.stderr)
        if check.returncode == 0 and found:
            pids[name] = int(found.group(1))
    return pids


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON, *args], capture_output=True, text=True, timeout=60,
                          check=check)


@pytest.mark.timeout(180, func_only=True)  # (not the wait for a bed another process holds)
def test_a_detached_ssh_program_outlives_its_launcher_and_the_launching_network(
        ssh_testbed, hosts, tmp_path, short_tmp_path):
    # The hosts' registry, runs and logs (a user's home there), in a short path: a Unix socket's
    # path holds at most 107 bytes, and pytest's (under xdist) leaves too little room.
    remote = short_tmp_path
    env = {'LAUNCHPAD_RUNTIME_DIR': str(remote / 'runtime'), 'LAUNCHPAD_RUNS_DIR':
           str(remote / 'runs'), 'LAUNCHPAD_LOGGING_DIR': str(remote / 'logs')}
    options = {}
    for bed_host in ssh_testbed:
        options[bed_host.name] = host_options(bed_host)
        options[bed_host.name]['env'].update(env)
    counter = str(tmp_path / 'counter.json')
    started = time.monotonic()
    launcher = subprocess.Popen([sys.executable, '-c', LAUNCH, counter, json.dumps(options)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO)
    brief_launcher = subprocess.Popen([sys.executable, '-c', LAUNCH_BRIEF, json.dumps(options)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd=REPO)
    line = launcher.stdout.readline()
    launched = time.monotonic() - started
    brief_line, brief_errors = brief_launcher.communicate(timeout=60)
    if not line.startswith('LAUNCHED') or not brief_line.startswith('LAUNCHED'):
        launcher.kill()
        pytest.fail(f'a launch failed: {line}{launcher.communicate()[1]}\n{brief_errors}')
    program_id, brief_id = line.split()[1], brief_line.split()[1]
    launcher.send_signal(signal.SIGKILL)
    printed = launcher.communicate()[1]
    assert f'python -m launchpad.launch attach {program_id}' in printed
    print(f'detached SSH launch: {launched:.1f} s')
    try:
        # The brief program's supervisor and keeper die, and no new one comes: its nodes run
        # on for its grace (10 s), then stop, and their hosts remove its directories; its ssh
        # master connections end once idle.
        brief = json.loads(_cli('status', brief_id, '--json').stdout)
        brief_nodes = [row['pid'] for row in brief['nodes']]
        brief_run, = glob.glob(os.path.join(tempfile.gettempdir(),
                                            f'{detached.RUN_PREFIX}{brief_id}*'))
        brief_masters = list(master_pids(os.path.join(brief_run, masters.NAME)).values())
        assert len(brief_masters) == 2
        brief_there = remote / 'runtime' / f'{brief_id}.json'
        killed = (json.loads(brief_there.read_text())['keeper_pid'], brief['controller']['pid'])
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        _wait_until_dead(killed)
        assert all(psutil.pid_exists(pid) for pid in brief_nodes)
        # The nodes go on without the launching process; its supervisor is on lp-h2.
        before = _calls(counter, 0)
        assert _calls(counter, before) > before
        status = json.loads(_cli('status', program_id, '--json').stdout)
        assert status['controller']['host'] == 'lp-h2'
        nodes = {row['name']: (row['state'], row['host'], row['pid']) for row in status['nodes']}
        assert {name: state for name, (state, _, _) in nodes.items()} == {
            'counter/0': 'running', 'caller/0': 'running', 'worker/0': 'running'}
        assert nodes['counter/0'][1] == 'lp-h1' and nodes['worker/0'][1] == 'lp-h3'
        listed = _cli('list').stdout
        assert program_id in listed and f'{status["controller"]["pid"]} on lp-h2' in listed

        # This machine loses the hosts' network for CUT s, and so does lp-h3 (the worker's
        # host): the program runs on; commands say why they cannot reach it. Meanwhile its
        # supervisor is SIGKILLed: the nodes serve on, and the keeper on lp-h2 starts a new
        # supervisor, which re-adopts them through their hosts' agents (seen here in lp-h2's
        # registry: the hosts share this file system) and reaches lp-h3's again once it is
        # back: lp-h3's agent keeps its node for the supervisor grace, not the 30 s after which
        # an attached program's agent takes its launcher for gone.
        there = remote / 'runtime' / f'{program_id}.json'
        supervisor = status['controller']['pid']
        subprocess.run(['ip', 'addr', 'del', LAUNCHER_ADDRESS, 'dev', BRIDGE], check=True)
        subprocess.run(['ip', 'link', 'set', H3_LINK, 'down'], check=True)
        cut = time.monotonic()
        try:
            before = Counter.read(counter)['calls']
            cut_off = _cli('status', program_id, check=False)
            assert cut_off.returncode == 1
            assert 'cannot reach host lp-h2' in cut_off.stderr, cut_off.stderr
            # (--recover tries the program's other hosts too, and a --host given)
            recover = _cli('attach', '--recover', program_id, check=False)
            assert recover.returncode == 1
            assert 'cannot reach lp-h2' in recover.stderr, recover.stderr
            assert 'nor any other host of the program (lp-h1, lp-h3)' in recover.stderr
            assert '--host HOST' in recover.stderr, recover.stderr
            moving = _cli('attach', '--recover', program_id, '--host', 'lp-h3', check=False)
            assert moving.returncode == 1
            assert 'could be started on lp-h3 (exit 255)' in moving.stderr, moving.stderr
            before = _calls(counter, before)
            os.kill(supervisor, signal.SIGKILL)
            new_supervisor = _new_supervisor(there, supervisor)
            assert _calls(counter, _calls(counter, before)) > before
            time.sleep(max(0.0, CUT - (time.monotonic() - cut)))
        finally:
            subprocess.run(['ip', 'link', 'set', H3_LINK, 'up'], check=True)
            subprocess.run(['ip', 'addr', 'add', LAUNCHER_ADDRESS, 'dev', BRIDGE], check=True)
        # (Past its grace, which ended during the cut: waited for, the hosts being loaded.)
        _wait_until_dead(brief_nodes + brief_masters, timeout=30)
        assert wait_until(lambda: not glob.glob(os.path.join(
            tempfile.gettempdir(), f'{detached.RUN_PREFIX}{brief_id}*')), timeout=30)
        assert _cli('status', brief_id, check=False).returncode == 1
        assert not glob.glob(str(registry.directory() / f'{brief_id}.*'))
        _wait_for_line(remote / 'logs' / program_id / 'supervisor.log',
                       'Reached the agent on lp-h3 again')
        controller = lp.attach(program_id)
        assert controller.supervisor['host'] == 'lp-h2'
        after = {name: (s.state.value, s.host, s.pid, s.restarts)
                 for name, s in controller.status().items()}
        assert after == {name: (*node, 0) for name, node in nodes.items()}  # none restarted
        assert controller.supervisor['pid'] == new_supervisor
        status = json.loads(_cli('status', program_id, '--json').stdout)
        assert status['controller'] == {'host': 'lp-h2', 'pid': new_supervisor}
        assert f'{new_supervisor} on lp-h2' in _cli('list').stdout

        # Its keeper dies too: commands say so, and `attach --recover` starts a new keeper on
        # lp-h2 through ssh, whose supervisor re-adopts the nodes.
        killed = (json.loads(there.read_text())['keeper_pid'], new_supervisor)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        _wait_until_dead(killed)  # (a SIGKILL is delivered after kill() returns)
        orphaned = _cli('status', program_id, check=False)
        assert 'attach --recover' in orphaned.stderr, orphaned.stderr
        follower = subprocess.Popen([*PYTHON, 'attach', '--recover', program_id],
                                    stderr=subprocess.PIPE, text=True)
        try:
            assert 'Attached to detached' in follower.stderr.readline()
            assert {name: (s.state.value, s.host, s.pid, s.restarts)
                    for name, s in controller.status().items()} == after
            assert controller.supervisor['pid'] not in (supervisor, new_supervisor)
        finally:
            follower.send_signal(signal.SIGINT)
            follower.wait(60)

        stopped = _cli('stop', program_id)
        assert 'Stopped' in stopped.stdout
        assert controller.wait(timeout=30)
    finally:
        subprocess.run(['ip', 'link', 'set', H3_LINK, 'up'], check=False)
        subprocess.run(['ip', 'addr', 'replace', LAUNCHER_ADDRESS, 'dev', BRIDGE], check=False)
        if program_id in [e.id for e in registry.entries()]:
            _cli('stop', program_id, check=False)
    _assert_nothing_left(program_id, remote.glob('runtime'))


# A program supervised on lp-h1 whose nodes run on lp-h2 and lp-h3 (lp-h1 is a host of the
# counter's group, where none of its nodes landed).
LAUNCH_MOVED = """
import json, sys
import launchpad as lp
from tests.launch.detached_program import Counter, call_forever
hosts = {name: lp.SshHost(name, **options) for name, options in json.loads(sys.argv[2]).items()}
program = lp.Program('moved')
counter = program.add_node(lp.CourierNode(Counter, sys.argv[1]), label='counter')
program.add_node(lp.PyNode(call_forever, counter), label='caller')
controller = lp.launch(program, launch_type='ssh', detach=True, supervisor_host='lp-h1',
                       resources={'counter': lp.SshHosts([hosts['lp-h2'], hosts['lp-h1']]),
                                  'caller': hosts['lp-h3']})
print('LAUNCHED', controller.id, flush=True)
"""
H1_LINK = 'lpv1'  # lp-h1's link to the bridge


@pytest.mark.timeout(180, func_only=True)  # (not the wait for a bed another process holds)
def test_the_supervision_of_a_detached_ssh_program_moves_to_another_host(
        ssh_testbed, hosts, tmp_path, short_tmp_path):
    # Each host has a registry and logs of its own, as separate machines do (the bed's hosts
    # share this file system).
    remote = short_tmp_path
    options = {}
    for bed_host in ssh_testbed:
        options[bed_host.name] = host_options(bed_host)
        options[bed_host.name]['env'].update({
            'LAUNCHPAD_RUNTIME_DIR': str(remote / bed_host.name / 'runtime'),
            'LAUNCHPAD_RUNS_DIR': str(remote / bed_host.name / 'runs'),
            'LAUNCHPAD_LOGGING_DIR': str(remote / bed_host.name / 'logs')})
    counter = str(tmp_path / 'counter.json')
    launched = subprocess.run([sys.executable, '-c', LAUNCH_MOVED, counter, json.dumps(options)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    assert launched.stdout.startswith('LAUNCHED'), launched.stderr
    program_id = launched.stdout.split()[1]
    old_run_dirs = glob.glob(os.path.join(tempfile.gettempdir(),
                                          f'{detached.RUN_PREFIX}{program_id}*'))
    old = None
    try:
        # (`status` shows the supervisor's latest sample, which can predate the nodes' reports)
        placed = {'counter/0': 'lp-h2', 'caller/0': 'lp-h3'}

        answers = []

        def status_with_hosts() -> bool:
            answers.append(json.loads(_cli('status', program_id, '--json').stdout))
            return all(row['host'] for row in answers[-1]['nodes'])

        wait_until(status_with_hosts, timeout=30, interval=0.5)
        status = answers[-1]
        assert status['controller']['host'] == 'lp-h1'
        nodes = {row['name']: (row['state'], row['host'], row['pid']) for row in status['nodes']}
        assert {name: host for name, (_, host, _) in nodes.items()} == placed
        before = _calls(counter, 0)

        # lp-h1 is gone: its supervisor and keeper stop (frozen, as a suspended machine's) and
        # it leaves the network. Its keeper cannot help; `attach --recover` finds lp-h1 out of
        # reach and starts a supervisor on the program's first other host, lp-h2, from the
        # copies of the state that lp-h2's agent keeps (as `--host lp-h2` would). The nodes
        # serve on, none restarted, and report to it: their agents tell them where it is.
        there = remote / 'lp-h1' / 'runtime' / f'{program_id}.json'
        old = (status['controller']['pid'], json.loads(there.read_text())['keeper_pid'])
        # (the directory of its ssh control sockets, which goes with its last connection)
        sockets, = {os.path.dirname(child.cmdline()[3])
                    for child in psutil.Process(old[0]).children() if child.name() == 'sh'}
        for pid in old:
            os.kill(pid, signal.SIGSTOP)
        subprocess.run(['ip', 'link', 'set', H1_LINK, 'down'], check=True)
        follower = subprocess.Popen([*PYTHON, 'attach', '--recover', program_id],
                                    stderr=subprocess.PIPE, text=True)
        try:
            attached = follower.stderr.readline()
            assert 'Attached to moved' in attached, attached + follower.stderr.read() + (
                remote / 'lp-h2' / 'logs' / program_id / 'supervisor.log').read_text()
        finally:
            follower.send_signal(signal.SIGINT)
            follower.wait(60)
        status = json.loads(_cli('status', program_id, '--json').stdout)
        assert status['controller']['host'] == 'lp-h2'
        new_supervisor = status['controller']['pid']
        assert new_supervisor not in old
        moved = {row['name']: (row['state'], row['host'], row['pid'], row['restarts'])
                 for row in status['nodes']}
        assert moved == {name: (*node, 0) for name, node in nodes.items()}
        before = _calls(counter, _calls(counter, before))

        # lp-h1 comes back once it has been away longer than ssh's keepalive allows, so that
        # the old supervisor's connections have all ended (taking its control sockets'
        # directory). It reaches the agents again, claims them and is refused (a newer supervisor
        # holds them); it leaves without touching the nodes, and so does its keeper.
        deadline = time.monotonic() + 2 * protocol.LAUNCHER_SILENCE_TIMEOUT
        while os.path.exists(sockets):
            assert time.monotonic() < deadline, 'the cut-off ssh connections did not end'
            time.sleep(0.5)
        subprocess.run(['ip', 'link', 'set', H1_LINK, 'up'], check=True)
        for pid in old:
            os.kill(pid, signal.SIGCONT)
        _wait_until_dead(old, timeout=60)
        _wait_for_line(remote / 'lp-h1' / 'logs' / program_id / 'supervisor.log',
                       'refused this supervisor')
        assert not any(os.path.exists(run) for run in old_run_dirs)
        controller = lp.attach(program_id)
        assert controller.supervisor == {'host': 'lp-h2', 'pid': new_supervisor}
        assert {name: (s.state.value, s.host, s.pid, s.restarts)
                for name, s in controller.status().items()} == moved
        assert _calls(counter, before) > before

        assert 'Stopped' in _cli('stop', program_id).stdout
        assert controller.wait(timeout=30)
    finally:
        subprocess.run(['ip', 'link', 'set', H1_LINK, 'up'], check=False)
        for pid in old or ():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if program_id in [e.id for e in registry.entries()]:
            _cli('stop', program_id, check=False)
    _assert_nothing_left(program_id, remote.glob('*/runtime'))


def _assert_nothing_left(program_id: str, runtimes) -> None:
    """Nothing of the program is left: no process (the `hosts` fixture checks every host and
    this machine), no run directory, registry entry, socket or tunnel, here or in the hosts'
    registries `runtimes`."""
    assert program_id not in _cli('list').stdout
    assert not glob.glob(os.path.join(tempfile.gettempdir(),
                                      f'{detached.RUN_PREFIX}{program_id}*'))
    assert not glob.glob(str(registry.directory() / f'{program_id}.*'))
    for runtime in runtimes:
        assert not list(runtime.glob(f'{program_id}.*'))


def test_a_detached_agent_takes_only_a_newer_supervisor_and_tells_the_one_it_drops(tmp_path):
    # The agent runs here as ssh would start it (its first session on stdin and stdout); later
    # supervisors reach its socket as their relay does. Nothing else of the program is needed.
    agent = subprocess.Popen([sys.executable, *protocol.agent_argv(sys.executable, True)[1:]],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, 'TMPDIR': str(tmp_path)})
    try:
        agent.stdin.write(protocol.pack_command('claim', {'epoch': 1, 'owner': 'h1:/run'}))
        agent.stdin.flush()
        hello = _event(agent.stdout.readline)
        assert hello['event'] == 'hello' and hello['nodes'] == {}
        directory = hello['directory']
        assert (pathlib.Path(directory) / protocol.CLAIM_FILE).read_text() == '1 h1:/run'

        def claim(epoch: int, owner: str) -> socket.socket:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.connect(os.path.join(directory, protocol.SOCKET_NAME))
            connection.sendall(protocol.pack_command('claim', {'epoch': epoch, 'owner': owner}))
            return connection

        # An older claim, or the same epoch from another run directory, is refused.
        for epoch, owner in ((0, 'h2:/run'), (1, 'h2:/run')):
            with claim(epoch, owner) as refused:
                stream = refused.makefile('rb')
                assert _event(stream.readline) == {'event': 'refused', 'epoch': 1,
                                                   'owner': 'h1:/run'}
                assert stream.read() == b''  # and closed
        # A newer one takes the agent: the supervisor it drops hears who holds it now.
        with claim(3, 'h2:/run') as newer:
            stream = newer.makefile('rb')
            assert _event(stream.readline)['event'] == 'hello'
            assert _event(agent.stdout.readline) == {'event': 'refused', 'epoch': 3,
                                                     'owner': 'h2:/run'}
            assert agent.stdout.read() == b''
            newer.sendall(protocol.pack_command('resume', None)
                          + protocol.pack_command('close', None))
            assert _event(stream.readline)['event'] == 'closed'
        assert agent.wait(30) == 0
        assert not os.path.exists(directory)
    finally:
        agent.kill()
        agent.wait()


def _event(readline) -> dict:
    """The next event an agent sent (lines that are not events are skipped)."""
    while True:
        line = readline()
        assert line, 'the agent closed the connection'
        event = protocol.unpack_event(line)
        if event is not None:
            return event


@pytest.mark.parametrize('options, error', [
    (dict(supervisor_host='elsewhere'), r"supervisor_host='elsewhere' is not one of the "
                                        r"program's hosts \(lp-h1, lp-h2\)"),
    (dict(supervisor_host=lp.SshHost('lp-h1', port=2222)), 'is not one of the program'),
    (dict(detach=False, supervisor_host='lp-h1'), 'applies to detached programs only'),
    (dict(supervisor_grace=-1), 'supervisor_grace=-1 must be a positive number of seconds'),
    (dict(terminal='tmux_session'), "terminal='tmux_session' cannot be detached"),
])
def test_a_detached_ssh_launch_refuses_what_it_cannot_do(options, error):
    program = lp.Program('refused')
    program.add_node(lp.PyNode(print), label='a')
    program.add_node(lp.PyNode(print), label='b')
    with pytest.raises(ValueError, match=error):
        lp.launch(program, launch_type='ssh', resources={'a': 'lp-h1', 'b': ['lp-h2', 'lp-h1']},
                  **{'detach': True, **options})


def test_a_detached_ssh_launch_refuses_a_runtime_directory_too_long_for_its_tunnels(
        tmp_path, monkeypatch):
    monkeypatch.setenv(registry.ENV, str(tmp_path / ('r' * max(1, 90 - len(str(tmp_path))))))
    program = lp.Program('refused')
    program.add_node(lp.PyNode(print), label='a')
    with pytest.raises(registry.RegistryError, match=f'Set {registry.ENV}= to a shorter'):
        lp.launch(program, launch_type='ssh', resources={'a': 'nowhere.invalid'}, detach=True)


def test_the_plain_relay_joins_a_session_to_an_agent_socket_or_says_none_listens(
        short_tmp_path):
    # What a new supervisor runs on a detached program's host to reach its agent again
    # (`protocol.relay_argv`), and what its first session does.
    path = str(short_tmp_path / 'agent.sock')
    command = [sys.executable, relay.__file__, relay.PLAIN, path]
    none = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert none.returncode == 1  # (not 255: ssh's own failures; the agent is gone for good)
    assert f'No agent listens on {path}' in none.stderr
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    joined = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        agent, _ = listener.accept()
        joined.stdin.write(b'to the agent')
        joined.stdin.close()  # the session ends: the agent hears the end
        heard = b''
        while len(heard) < len(b'to the agent'):
            data = agent.recv(100)
            assert data, heard
            heard += data
        assert heard == b'to the agent' and agent.recv(100) == b''
        agent.sendall(b'to the session')
        agent.close()  # the agent ends the session
        assert joined.stdout.read() == b'to the session'
        assert joined.wait(30) == 0
    finally:
        joined.kill()
        joined.wait()
        listener.close()


def test_a_supervisor_host_that_cannot_launch_says_why_at_once(tmp_path):
    # What runs on the supervisor's host (`supervisor start`, see `ssh.detach.start`).
    program = lp.Program('refused')
    program.add_node(lp.PyNode(print), label='a')
    options = LaunchOptions('ssh', resources={'a': 'nowhere.invalid'},
                            terminal='output_to_files')
    header, payload = detached.launch_file(program, options, 10.0, registry.new_id('refused'),
                                           str(tmp_path / 'logs'), [])

    def start(runtime: pathlib.Path) -> str:
        started = subprocess.run(
            [sys.executable, '-m', detached.SUPERVISOR_MODULE, 'start'],
            input=pickle.dumps((header, payload)), capture_output=True, timeout=60,
            env={**os.environ, registry.ENV: str(runtime), 'TMPDIR': str(tmp_path)})
        assert started.returncode != 0
        assert not glob.glob(str(tmp_path / f'{detached.RUN_PREFIX}*'))
        return started.stderr.decode()

    # Its registry's directory is too long for the supervisor's socket: it used to wait for a
    # registry entry that the supervisor could not make, up to the launch's timeout of minutes.
    too_long = start(tmp_path / ('r' * max(1, 100 - len(str(tmp_path)))))
    assert f'Set {registry.ENV}= to a shorter' in too_long, too_long
    # Its supervisor cannot reach a host: the preflight says so (an error in the cleanup after
    # it hid it).
    unreachable = start(tmp_path / 'runtime')
    assert 'nowhere.invalid: cannot connect with ssh' in unreachable, unreachable
    assert 'AttributeError' not in unreachable, unreachable


def _wait_until_dead(pids, timeout: float = 10.0) -> None:
    """Waits until each process of `pids` has ended (a zombie not yet reaped has)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            assert time.monotonic() < deadline, f'process {pid} outlived its SIGKILL'
            time.sleep(0.01)
