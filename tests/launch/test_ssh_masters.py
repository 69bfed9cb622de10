"""A detached SSH program's master connections (`launchpad.launch.ssh.masters`): the new
supervisor that the keeper starts after a death opens its sessions over the masters of the one
before, with no new ssh connection; the masters end with the program."""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile

import psutil
import pytest

import launchpad as lp
from launchpad.launch import detached
from launchpad.launch.ssh import masters, protocol
from launchpad.observe import cli, registry, relay
from tests.core.conftest import wait_until
from tests.launch.detached_program import idle
from tests.launch.test_ssh import REPO, host_options, hosts  # pylint: disable=unused-import
from tests.launch.test_ssh_detach import (  # pylint: disable=unused-import
    LAUNCH_BRIEF, _assert_nothing_left, _cli, _new_supervisor, _wait_for_line, _wait_until_dead,
    master_pids, short_tmp_path)

pytestmark = pytest.mark.timeout(120)


def ssh_connections(pid: int) -> set:
    """The established TCP connections to an ssh server's port (22) in the network namespace of
    process `pid`: (local address, remote address), as the kernel lists them."""
    found = set()
    for table in ('tcp', 'tcp6'):
        with open(f'/proc/{pid}/net/{table}') as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == '01' and fields[2].endswith(':0016'):
                    found.add((fields[1], fields[2]))
    return found


def _launch_brief(ssh_testbed, remote) -> str:
    """Launches `LAUNCH_BRIEF` (two idle nodes on lp-h1 and lp-h3, supervised on lp-h1), whose
    hosts keep their registry, runs and logs in `remote`; returns its id."""
    options = {}
    for bed_host in ssh_testbed:
        options[bed_host.name] = host_options(bed_host)
        options[bed_host.name]['env'].update({
            'LAUNCHPAD_RUNTIME_DIR': str(remote / 'runtime'),
            'LAUNCHPAD_RUNS_DIR': str(remote / 'runs'),
            'LAUNCHPAD_LOGGING_DIR': str(remote / 'logs')})
    launched = subprocess.run([sys.executable, '-c', LAUNCH_BRIEF, json.dumps(options)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    assert launched.stdout.startswith('LAUNCHED'), launched.stderr
    return launched.stdout.split()[1]


@pytest.mark.timeout(120, func_only=True)  # (not the wait for a bed another process holds)
def test_a_new_supervisor_opens_its_sessions_over_the_masters_of_the_one_before(
        ssh_testbed, hosts, short_tmp_path, capsys):
    remote = short_tmp_path  # (the hosts' registry and logs, as in test_ssh_detach)
    program_id = _launch_brief(ssh_testbed, remote)
    try:
        there = remote / 'runtime' / f'{program_id}.json'
        entry = json.loads(there.read_text())
        run_dir, = glob.glob(os.path.join(tempfile.gettempdir(),
                                          f'{detached.RUN_PREFIX}{program_id}*'))
        sockets = os.path.join(run_dir, masters.NAME)
        assert stat.S_IMODE(os.stat(sockets).st_mode) == 0o700
        # One master per host, each with its connection to the host's sshd.
        before = master_pids(sockets)
        assert len(before) == 2, before
        connections = ssh_connections(entry['keeper_pid'])
        assert len(connections) >= 2, connections

        controller = lp.attach(program_id)  # (this process's tunnel reaches the supervisor)
        os.kill(entry['pid'], signal.SIGKILL)
        new_supervisor = _new_supervisor(there, entry['pid'])
        # A client made next through the open tunnel carries the new supervisor's token
        # (`status`, run in this process: it was refused).
        assert cli.main(['status', program_id, '--json']) == 0
        assert json.loads(capsys.readouterr().out)['controller']['pid'] == new_supervisor
        log = remote / 'logs' / program_id / 'supervisor.log'
        _wait_for_line(log, f'Supervisor pid {new_supervisor} re-adopted program')
        assert master_pids(sockets) == before
        assert ssh_connections(entry['keeper_pid']) == connections  # no new one
        assert '2 over master connections that ran already' in log.read_text()
        # ... through forwards to the agents' sockets (relays to them here), not sessions
        # (relays there to the agents' sockets).
        relays = {p.info['cmdline'][-1] for p in psutil.process_iter(['cmdline'])
                  if relay.PLAIN in (p.info['cmdline'] or [])}
        assert len({path for path in relays if os.path.dirname(path) == sockets}) == 2
        assert not [path for path in relays if path.endswith(protocol.SOCKET_NAME)]
        assert {s.restarts for s in controller.status().values()} == {0}

        # At the program's end its supervisor ends them.
        assert 'Stopped' in _cli('stop', program_id).stdout
        assert controller.wait(timeout=30)
        _wait_until_dead(list(before.values()), timeout=30)
        _wait_for_line(log, 'Ended 2 ssh master connections')
    finally:
        if program_id in [e.id for e in registry.entries()]:
            _cli('stop', program_id, check=False)
    _assert_nothing_left(program_id, [remote / 'runtime'])


def test_the_masters_directory_is_private_and_short_enough_for_their_sockets(
        tmp_path, short_tmp_path, monkeypatch):
    # (the system's temporary directory, where a bed test looks for what its programs left)
    monkeypatch.setattr(tempfile, 'tempdir', str(short_tmp_path))
    run_dir = tmp_path / 'run'
    run_dir.mkdir(mode=0o700)
    inside = masters.directory(str(run_dir))
    assert inside == str(run_dir / masters.NAME)
    assert stat.S_IMODE(os.stat(inside).st_mode) == 0o700
    assert masters.directory(str(run_dir)) == inside  # the next supervisor's is the same
    # A run directory too deep for a Unix socket's path: a short one of its own elsewhere,
    # the same for every supervisor, removed with the masters.
    deep = tmp_path / ('d' * 100)
    deep.mkdir()
    elsewhere = masters.directory(str(deep))
    assert elsewhere is not None and elsewhere.startswith(str(short_tmp_path))
    try:
        assert masters.directory(str(deep)) == elsewhere
        assert stat.S_IMODE(os.stat(elsewhere).st_mode) == 0o700
        path = masters.socket_path(elsewhere, lp.SshHost('a'), {'g': [lp.SshHost('a')]})
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(path + '.' + 'x' * 16)  # (where ssh binds it first)
    finally:
        masters.end_all(str(deep))
    assert not os.path.exists(elsewhere)
    # A directory there that is not private is not used.
    os.chmod(inside, 0o755)
    try:
        assert masters.directory(str(run_dir)) not in (inside, None)
    finally:
        masters.end_all(str(run_dir))


def test_every_supervisor_names_a_hosts_master_alike_and_a_stale_socket_goes(tmp_path):
    h1, h1_python, h2 = lp.SshHost('h1'), lp.SshHost('h1', python='/venv/bin/python'), \
        lp.SshHost('h2', port=2222)
    hosts = {'b': [h2, h1], 'a': [h1_python]}
    names = {masters.socket_path(str(tmp_path), host, hosts) for host in (h1, h1_python, h2)}
    assert len(names) == 2  # (the same server and user share a master)
    assert masters.socket_path(str(tmp_path), h1, {'a': [h1_python], 'b': [h1, h2]}) == \
        masters.socket_path(str(tmp_path), h1, hosts)
    assert masters.socket_path(str(tmp_path), lp.SshHost('elsewhere'), hosts) is None
    # A master that was killed leaves its socket: ending it removes the socket.
    stale = masters.socket_path(str(tmp_path), h1, hosts)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(stale)
    masters.end(stale)
    assert not os.path.exists(stale)


@pytest.mark.timeout(120, func_only=True)  # (not the wait for a bed another process holds)
def test_a_killed_master_is_replaced_by_a_new_connection_and_nothing_of_it_is_left(
        ssh_testbed, hosts, short_tmp_path):
    """The master connection to lp-h3 is SIGKILLed mid-run (its agent's session with it): the
    supervisor reaches lp-h3's agent again through a new connection, which takes the killed
    master's place at its socket, and the program's commands reach lp-h3 through it. The socket
    of lp-h1's master is removed meanwhile (its session goes on). At the stop no master, socket
    or ssh process is left (the masters end with the program)."""
    remote = short_tmp_path  # (the hosts' registry and logs, as in test_ssh_detach)
    program_id = _launch_brief(ssh_testbed, remote)
    try:
        run_dir, = glob.glob(os.path.join(tempfile.gettempdir(),
                                          f'{detached.RUN_PREFIX}{program_id}*'))
        sockets = os.path.join(run_dir, masters.NAME)
        h3 = os.path.basename(masters.socket_path(
            sockets, hosts['lp-h3'], {'idle': [hosts['lp-h1'], hosts['lp-h3']]}))
        before = master_pids(sockets)
        assert set(before) == {'h0', 'h1'} and h3 in before, before
        h1, = set(before) - {h3}
        os.unlink(os.path.join(sockets, h1))
        os.kill(before[h3], signal.SIGKILL)
        _wait_until_dead([before[h3]])

        log = remote / 'logs' / program_id / 'supervisor.log'
        _wait_for_line(log, 'Reached the agent on lp-h3 again')
        after = master_pids(sockets)
        assert list(after) == [h3] and after[h3] != before[h3]  # (a new connection)
        controller = lp.attach(program_id)
        assert {(s.host, s.state.value, s.restarts)
                for s in controller.status().values()} == {('lp-h1', 'running', 0),
                                                           ('lp-h3', 'running', 0)}
        # Nodes added now start on lp-h1, then lp-h3 (the group's hosts in turn).
        for _ in range(2):
            controller.add_node(lp.PyNode(idle), 'idle')
        assert wait_until(lambda: sorted((s.host or '', s.state.value) for s in
                                         controller.status().values()) == [
            ('lp-h1', 'running'), ('lp-h1', 'running'), ('lp-h3', 'running'),
            ('lp-h3', 'running')], timeout=30)

        assert 'Stopped' in _cli('stop', program_id).stdout
        assert controller.wait(timeout=30)
        _wait_until_dead([after[h3], before[h1]], timeout=10)  # (not idle for masters.IDLE s)
    finally:
        if program_id in [e.id for e in registry.entries()]:
            _cli('stop', program_id, check=False)
    _assert_nothing_left(program_id, [remote / 'runtime'])  # (its run dir, with the sockets)
