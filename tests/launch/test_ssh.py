"""The ssh launcher against real sshd servers: hosts lp-h1..3 of the SSH test bed.

Every test checks afterwards that no process of the program is left on any host or here, and
that no private directory of the launch remains. Everything started through a host's sshd
shares that sshd's UTS namespace (the host's own hostname), which is how a host's processes are
told apart from those of other beds sharing its network namespace.
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

import courier
import launchpad as lp
from launchpad.launch.ssh import SshPreflightError
from launchpad.launch.ssh.protocol import AGENT_MODULE
from tests.core.conftest import wait_until
from tests.leftovers import SYSTEM_TMP, no_new_temp_dirs
from tests.pki import Pki

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(90)


def host_options(bed_host) -> dict:
    """SshHost keyword arguments that reach a bed host with the bed's own client config."""
    pythonpath = os.pathsep.join(filter(None, [os.environ.get('PYTHONPATH'), str(REPO)]))
    return dict(ssh_options=['-F', bed_host.ssh_config], python=bed_host.python,
                env={'PYTHONPATH': pythonpath})


@pytest.fixture
def hosts(ssh_testbed):
    """lp.SshHost for each bed host, by name; checks that the test leaves nothing behind."""
    started = time.time() - 1.0
    # Every directory the hosts made (ssh sessions make theirs in /tmp), and the launcher's.
    with no_new_temp_dirs(SYSTEM_TMP, made_on=[h.name for h in ssh_testbed], kinds=['ssh']):
        yield {h.name: lp.SshHost(h.name, **host_options(h)) for h in ssh_testbed}
        deadline = time.monotonic() + 15
        while program_processes(ssh_testbed, started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert program_processes(ssh_testbed, started) == []


def program_processes(ssh_testbed, since: float = 0.0) -> list:
    """Live processes started since `since` on the bed's hosts, or here by the launcher."""
    state = os.path.dirname(ssh_testbed[0].ssh_config)
    processes = list(psutil.process_iter(['cmdline', 'create_time', 'status']))
    listeners = {p.pid: _uts(p.pid) for p in processes
                 if any(state in arg for arg in p.info['cmdline'] or [])
                 and 'sshd' in (p.info['cmdline'] or [''])[0]}
    found = []
    for process in processes:
        if (process.pid in listeners or process.info['status'] == psutil.STATUS_ZOMBIE
                or process.info['create_time'] < since):
            continue
        command = ' '.join(process.info['cmdline'] or [])
        uts = _uts(process.pid)
        if uts is not None and uts in listeners.values():
            found.append(f'{process.pid} on the bed: {command}')
        elif 'launchpad-ssh-' in command or AGENT_MODULE in command:
            found.append(f'{process.pid} here: {command}')
    return found


def _uts(pid: int):
    try:
        return os.readlink(f'/proc/{pid}/ns/uts')
    except OSError:
        return None


# --- The actor/learner program across three hosts --------------------------------------------

class Learner:
    """Collects steps from actors; its run() reports where everyone ran once all are in."""

    def __init__(self, actors: int, steps: int):
        self._actors, self._steps = actors, steps
        self._lock = threading.Lock()
        self._seen = {}
        self._protocols = {}

    def step(self, actor: int, hostname: str, protocol=None) -> int:
        """``protocol``: what carried the actor's previous call (None before the first)."""
        with self._lock:
            hostnames = self._seen.setdefault(actor, [])
            hostnames.append(hostname)
            if protocol is not None:
                self._protocols.setdefault(actor, set()).add(protocol)
            return len(hostnames)

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self._lock:
                if (len(self._seen) == self._actors
                        and all(len(h) == self._steps for h in self._seen.values())):
                    report = {'learner': socket.gethostname(),
                              'actors': {str(a): sorted(set(h)) for a, h in self._seen.items()},
                              'protocols': {str(a): sorted(p)
                                            for a, p in self._protocols.items()}}
                    print('REPORT ' + json.dumps(report), flush=True)
                    return
            time.sleep(0.05)
        raise TimeoutError(f'actors reported only {self._seen}')


def actor(index: int, learner, steps: int) -> None:
    for _ in range(steps):
        learner.step(index, socket.gethostname(), learner.protocol)


def test_actor_learner_runs_on_three_hosts(hosts, tmp_path, monkeypatch):
    monkeypatch.setenv('LAUNCHPAD_LOGGING_DIR', str(tmp_path))
    program = lp.Program('actor_learner')
    learner = program.add_node(lp.CourierNode(Learner, actors=2, steps=3), label='learner')
    with program.group('actor'):
        for i in range(2):
            program.add_node(lp.PyNode(actor, i, learner, steps=3))
    controller = lp.launch(program, launch_type='ssh', terminal='output_to_files', resources={
        'learner': hosts['lp-h1'], 'actor': lp.SshHosts([hosts['lp-h2'], hosts['lp-h3']])})
    assert controller.wait(timeout=60)
    status = controller.status()
    assert {name: (s.state, s.host, s.exit_code) for name, s in status.items()} == {
        'learner/0': (lp.NodeState.FINISHED, 'lp-h1', 0),
        'actor/0': (lp.NodeState.FINISHED, 'lp-h2', 0),
        'actor/1': (lp.NodeState.FINISHED, 'lp-h3', 0)}
    logs = list(tmp_path.glob('actor_learner-*/learner_0.log'))
    assert len(logs) == 1, list(tmp_path.rglob('*'))
    reports = [line for line in logs[0].read_text().splitlines() if line.startswith('REPORT ')]
    report = json.loads(reports[0][len('REPORT '):])
    # Between hosts, a node's plain client of another node speaks courier's framed protocol.
    assert report == {'learner': 'lp-h1', 'actors': {'0': ['lp-h2'], '1': ['lp-h3']},
                      'protocols': {'0': ['framed'], '1': ['framed']}}
    assert (tmp_path / logs[0].parent.name / 'actor_0.log').exists()


# --- Stop and failure -------------------------------------------------------------------------

class Echo:
    def echo(self, value):
        return value, socket.gethostname()


def call_then_stop(first, second, checks: str) -> None:
    answers = [first.echo(1), second.echo(2)]
    for path in glob.glob(os.path.join(tempfile.gettempdir(), 'launchpad-ssh-*')):
        if os.path.isdir(path) and os.stat(path).st_mode & 0o777 != 0o700:
            answers.append(f'{path} has mode {os.stat(path).st_mode & 0o777:o}')
        for spec in glob.glob(os.path.join(path, '*.spec')):
            if os.stat(spec).st_mode & 0o777 != 0o600:
                answers.append(f'{spec} has mode {os.stat(spec).st_mode & 0o777:o}')
    with open(checks, 'w') as f:
        json.dump(answers, f)
    lp.stop()


def test_stop_from_a_remote_node_stops_every_host(hosts, tmp_path):
    program = lp.Program('remote_stop')
    first = program.add_node(lp.CourierNode(Echo), label='first')
    second = program.add_node(lp.CourierNode(Echo), label='second')
    checks = tmp_path / 'checks.json'  # the bed's hosts share this file system
    program.add_node(lp.PyNode(call_then_stop, first, second, str(checks)), label='stopper')
    controller = lp.launch(program, launch_type='ssh', notice_period=30, resources={
        'first': hosts['lp-h1'], 'second': hosts['lp-h2'], 'stopper': hosts['lp-h3']})
    assert controller.wait(timeout=60)
    # Every node ended by itself on the stop signal; none had to be killed after the notice.
    assert {name: s.state for name, s in controller.status().items()} == {
        'first/0': lp.NodeState.FINISHED, 'second/0': lp.NodeState.FINISHED,
        'stopper/0': lp.NodeState.FINISHED}
    assert json.loads(checks.read_text()) == [[1, 'lp-h1'], [2, 'lp-h2']]


def crash(server) -> None:
    server.echo(0)
    raise ValueError(f'boom on {socket.gethostname()}')


def test_remote_crash_fails_the_program_with_its_traceback(hosts):
    program = lp.Program('remote_crash')
    server = program.add_node(lp.CourierNode(Echo), label='server')
    program.add_node(lp.PyNode(crash, server), label='crasher')
    controller = lp.launch(program, launch_type='ssh', resources={
        'server': hosts['lp-h1'], 'crasher': hosts['lp-h2']})
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=60)
    assert failure.value.node_name == 'crasher/0'
    assert 'ValueError: boom on lp-h2' in failure.value.remote_traceback
    assert 'in crash' in failure.value.remote_traceback
    status = controller.status()
    assert status['crasher/0'].state is lp.NodeState.FAILED
    assert status['server/0'].state is lp.NodeState.FINISHED


def ignore_stop() -> None:
    lp.register_stop_handler(lambda: None)
    while True:  # never looks at the stop signal
        time.sleep(0.1)


def test_nodes_that_ignore_stop_are_killed_on_their_host_after_the_notice(hosts):
    program = lp.Program('stubborn')
    program.add_node(lp.PyNode(ignore_stop), label='stubborn')
    program.add_node(lp.CourierNode(Echo), label='server')
    controller = lp.launch(program, launch_type='ssh', notice_period=1, resources={
        'stubborn': hosts['lp-h2'], 'server': hosts['lp-h3']})
    deadline = time.monotonic() + 30
    while controller.status()['stubborn/0'].state is not lp.NodeState.RUNNING:
        assert time.monotonic() < deadline and not controller.done
        time.sleep(0.05)
    controller.stop(timeout=30)
    assert controller.done
    status = controller.status()
    assert status['stubborn/0'].state is lp.NodeState.KILLED
    assert status['server/0'].state is lp.NodeState.FINISHED


def test_a_killed_agent_leaves_no_directory_on_its_host(hosts):
    """SIGKILL of a host's agent: the program fails, and its node there, ending on the stop,
    is the last owner of the agent's directory (the specs) out, and removes it."""
    before = set(glob.glob(os.path.join(SYSTEM_TMP, 'launchpad-ssh-*')))
    program = lp.Program('agent_killed')
    program.add_node(lp.CourierNode(Echo), label='orphan')
    program.add_node(lp.CourierNode(Echo), label='server')
    controller = lp.launch(program, launch_type='ssh', resources={
        'orphan': hosts['lp-h2'], 'server': hosts['lp-h3']})
    deadline = time.monotonic() + 30
    while any(s.state is not lp.NodeState.RUNNING for s in controller.status().values()):
        assert time.monotonic() < deadline and not controller.done
        time.sleep(0.05)
    node = psutil.Process(controller.status()['orphan/0'].pid)
    agent = node.parent()
    assert AGENT_MODULE in ' '.join(agent.cmdline())
    directories = set(glob.glob(os.path.join(SYSTEM_TMP, 'launchpad-ssh-*'))) - before
    assert len(directories) == 3  # each agent's, and the launcher's
    agent.kill()
    assert controller.wait(timeout=60, raise_error=False)
    assert not psutil.wait_procs([node], timeout=30)[1]
    assert wait_until(lambda: not any(map(os.path.exists, directories)))


# --- The launching process is interrupted or dies ---------------------------------------------

LAUNCHER_SCRIPT = '''
import json, socket, sys
import launchpad as lp

class Service:  # defined in __main__: travels to the hosts by value
    def hello(self):
        return socket.gethostname()

def worker(service):
    print('ready', service.hello(), flush=True)
    lp.wait_for_stop()
    print('stopping', flush=True)

hosts = {name: lp.SshHost(name, **options) for name, options in json.loads(sys.argv[1]).items()}
program = lp.Program('interrupted')
service = program.add_node(lp.CourierNode(Service), label='service')
with program.group('worker'):
    program.add_node(lp.PyNode(worker, service))
    program.add_node(lp.PyNode(worker, service))
lp.launch(program, launch_type='ssh', resources={
    'service': hosts['lp-h1'], 'worker': lp.SshHosts([hosts['lp-h2'], hosts['lp-h3']])})
'''


def start_launcher(ssh_testbed, tmp_path) -> subprocess.Popen:
    """Runs LAUNCHER_SCRIPT and returns once both workers said they are ready."""
    script = tmp_path / 'launcher.py'
    script.write_text(LAUNCHER_SCRIPT)
    options = {h.name: host_options(h) for h in ssh_testbed}
    env = dict(os.environ, PYTHONPATH=options['lp-h1']['env']['PYTHONPATH'])
    process = subprocess.Popen([sys.executable, str(script), json.dumps(options)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    expected = {'[lp-h2 worker/0] ready lp-h1', '[lp-h3 worker/1] ready lp-h1'}
    seen = []
    timer = threading.Timer(60, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            seen.append(line.rstrip())
            if expected <= set(seen):
                return process
    finally:
        timer.cancel()
    process.wait()
    pytest.fail('the launcher script ended before its workers were ready:\n' + '\n'.join(seen))


def test_ctrl_c_on_the_launcher_stops_every_host(ssh_testbed, hosts, tmp_path):
    process = start_launcher(ssh_testbed, tmp_path)
    commands = program_processes(ssh_testbed)
    remote = [psutil.Process(int(command.split()[0])) for command in commands
              if ' on the bed: ' in command]
    forked = [p for p in remote if AGENT_MODULE in ' '.join(p.parent().cmdline())]
    assert len(forked) == 3, commands  # every node was forked by its host's agent
    assert not any('COURIER_AUTH_TOKEN' in command for command in commands)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0, rest
    assert '[lp-h2 worker/0] stopping' in rest and '[lp-h3 worker/1] stopping' in rest


def test_sigkill_of_the_launcher_ends_the_nodes_on_every_host(ssh_testbed, hosts, tmp_path):
    process = start_launcher(ssh_testbed, tmp_path)
    since = psutil.Process(process.pid).create_time() - 1.0
    process.kill()
    process.communicate()
    killed = time.monotonic()
    while program_processes(ssh_testbed, since) and time.monotonic() - killed < 20:
        time.sleep(0.1)
    # Each agent sees its ssh connection end and hangs up its nodes; nothing waits for more.
    assert program_processes(ssh_testbed, since) == []
    assert time.monotonic() - killed < 12


# --- Bad hosts and resources ------------------------------------------------------------------

def test_hosts_that_cannot_run_nodes_are_reported_together(ssh_testbed, hosts):
    program = lp.Program('preflight')
    for label in ('a', 'b', 'c'):
        program.add_node(lp.PyNode(print, label), label=label)
    options = host_options(ssh_testbed[0])
    down = lp.SshHost('10.200.0.250', connect_timeout=2, **options)  # on the bed's network
    no_python = lp.SshHost('lp-h2', **dict(options, python='/nonexistent/python3'))
    with pytest.raises(SshPreflightError) as error:
        lp.launch(program, launch_type='ssh', resources={
            'a': down, 'b': no_python, 'c': hosts['lp-h3']})
    assert sorted(error.value.problems) == ['10.200.0.250', 'lp-h2']
    assert 'cannot connect with ssh' in error.value.problems['10.200.0.250'][0]
    assert "'/nonexistent/python3' was not found" in error.value.problems['lp-h2'][0]
    assert 'python=' in error.value.problems['lp-h2'][1]
    assert 'lp-h3' not in str(error.value)


def test_bad_resources_are_named():
    program = lp.Program('unplaced')
    program.add_node(lp.PyNode(print), label='learner')
    program.add_node(lp.PyNode(print), label='actor')
    with pytest.raises(ValueError, match=r"\['actor'\] have no hosts"):
        lp.launch(program, launch_type='ssh', resources={'learner': lp.SshHost('lp-h1')})
    with pytest.raises(TypeError, match="group 'actor' got 42"):
        lp.launch(program, launch_type='ssh', resources={'learner': 'lp-h1', 'actor': 42})
    with pytest.raises(ValueError, match="Group 'actor' has an empty list of hosts"):
        lp.launch(program, launch_type='ssh', resources={'learner': 'lp-h1', 'actor': []})
    with pytest.raises(ValueError, match='at least one host'):
        lp.SshHosts([])
    with pytest.raises(ValueError, match='port must be an int'):
        lp.SshHost('lp-h1', port=0)
    with pytest.raises(ValueError, match='env must map variable names'):
        lp.SshHost('lp-h1', env={'NOT A NAME': 'x'})
    with pytest.raises(TypeError, match=r"\['-o', 'ProxyJump=gw'\]"):
        lp.SshHost('lp-h1', ssh_options='-o ProxyJump=gw')


def say_where(i: int) -> None:
    print('node', i, 'on', socket.gethostname())


def test_many_nodes_on_one_host_stay_within_sshd_session_limit(hosts, capfd):
    program = lp.Program('crowded')
    with program.group('node'):
        for i in range(10):  # sshd's default MaxSessions is 10, the agent's session included
            program.add_node(lp.PyNode(say_where, i))
    controller = lp.launch(program, launch_type='ssh', resources={'node': hosts['lp-h1']})
    assert controller.wait(timeout=60)
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}
    out, err = capfd.readouterr()
    assert 'refused' not in out + err
    for i in range(10):
        assert f'[lp-h1 node/{i}] node {i} on lp-h1' in out


def chatter(lines: int) -> None:
    for i in range(lines):
        print(f'line {i} ' + 'x' * 100)
    sys.stdout.write('no newline at the end')
    sys.stdout.flush()
    os._exit(7)  # pylint: disable=protected-access


def test_all_output_of_a_node_arrives_before_its_exit_code(hosts, capfd):
    program = lp.Program('chatty')
    program.add_node(lp.PyNode(chatter, 3000), label='chatter')
    controller = lp.launch(program, launch_type='ssh', resources={'chatter': hosts['lp-h2']})
    with pytest.raises(lp.NodeFailedError, match='exit code 7'):
        controller.wait(timeout=60)
    out, _ = capfd.readouterr()
    lines = [line for line in out.splitlines() if line.startswith('[lp-h2 chatter/0] ')]
    assert lines == [f'[lp-h2 chatter/0] line {i} ' + 'x' * 100 for i in range(3000)] + [
        '[lp-h2 chatter/0] no newline at the end']


# --- TLS between hosts ------------------------------------------------------------------------

class Vault:
    def reveal(self) -> str:
        return 'treasure'


def check_tls(vault, address) -> None:
    assert vault.reveal() == 'treasure'
    assert vault.protocol == 'framed', vault.protocol  # TLS over the framed lane, not gRPC.
    plaintext = courier.Client(address.resolve(), call_timeout=5, wait_for_ready=False)
    try:
        plaintext.reveal()
    except courier.CourierError:
        return
    raise AssertionError('a plaintext client was served by a TLS server')


def test_tls_between_hosts(ssh_testbed, hosts):
    pki = Pki(ips=['10.200.0.1'] + [h.ip for h in ssh_testbed])
    tls = courier.TLSConfig(certificate_chain=pki.server_pem, private_key=pki.server_key,
                            root_certificates=pki.ca_pem)  # mutual: nodes present it too
    program = lp.Program('tls')
    vault_node = lp.CourierNode(Vault)
    vault = program.add_node(vault_node, label='vault')
    program.add_node(lp.PyNode(check_tls, vault, vault.address), label='visitor')
    controller = lp.launch(program, launch_type='ssh', tls=tls,
                           resources={'vault': hosts['lp-h1'], 'visitor': hosts['lp-h2']})
    assert controller.wait(labels=['visitor'], timeout=60)
    controller.stop()
    assert controller.status()['visitor/0'].state is lp.NodeState.FINISHED


@pytest.mark.timeout(170)
def test_an_elastic_group_grows_and_shrinks_across_hosts(hosts, capfd):
    """tests/elastic_program.py: a node grows the actors 2 -> 6 -> 1 (forked by the hosts'
    agents) while the learner receives from, and broadcasts to, whoever is alive."""
    from tests import elastic_program  # pylint: disable=import-outside-toplevel
    controller = lp.launch(elastic_program.build(), launch_type='ssh', resources={
        'learner': hosts['lp-h1'], 'driver': hosts['lp-h1'],
        'actor': lp.SshHosts([hosts['lp-h2'], hosts['lp-h3']])})
    assert controller.wait(timeout=150)
    status = controller.status()
    assert {name: s.state for name, s in status.items() if name.startswith('actor/')} == {
        'actor/0': lp.NodeState.FINISHED,
        **{f'actor/{i}': lp.NodeState.REMOVED for i in range(1, 6)}}
    assert {status[f'actor/{i}'].host for i in range(6)} == {'lp-h2', 'lp-h3'}
    assert 'ELASTIC shrank to 1' in capfd.readouterr().out


def test_a_forked_nodes_exit_is_passed_on_when_its_code_arrives():
    """The launcher's runner wakes its controller then (`on_end`), instead of seeing the exit
    at its next poll; a later end (a kill) changes nothing."""
    from launchpad.launch.ssh.connection import ForkedNode  # pylint: disable=import-outside-toplevel
    read_end, write_end = os.pipe()
    ended = []
    node = ForkedNode(write_end, None, on_end=lambda: ended.append(node.poll()))
    node.end(-9)
    node.end(0)
    assert ended == [-9] and node.poll() == -9
    os.close(read_end)
