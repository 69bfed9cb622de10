"""The CLI from another process: list, status, logs, stop, metrics and dashboard of programs
running locally (local_mp) and across SSH hosts; another user gets nothing."""
from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.observe.programs import (cli, cli_json, end, environment, launch, launched, observer_of,
                                    running, wait_until)

pytestmark = pytest.mark.timeout(120)


def _busy(observer):
    """The status rows once every node runs and the counter serves calls."""
    rows = {row['name']: row for row in observer.view()['nodes']}
    if all(row['state'] == 'running' for row in rows.values()) and \
            rows['counter/0']['calls_per_s'] > 0:
        return rows
    return None


def _look_then_stop(process: subprocess.Popen, launch_type: str) -> dict:
    """Runs every command against the running program 'observed', stops it, and returns its
    status rows as they were while it ran."""
    entry = wait_until(lambda: running('observed'), what='the program in the registry')
    observer = observer_of(entry)
    wait_until(lambda: _busy(observer), what='every node running, calls served')
    wait_until(lambda: len(observer.logs()['lines']) >= 2, what='lines from both producers')

    # Every node answers live probes (`stacks`, `waits`), on every launcher (within 10 s: on a
    # busy machine a node may take longer than the 0.5 s the CLI waits).
    probed = observer.probe(['stacks', 'process'], timeout=10)
    assert all(answer['live'] for answer in probed['nodes'].values()), probed['nodes']
    producing = [[frame[2] for frame in thread['frames']]
                 for thread in probed['nodes']['producer/0']['stacks']]
    assert any('producer' in functions for functions in producing)
    assert probed['nodes']['counter/0']['process']['rss'] > 0
    assert observer.waits(timeout=10)['silent'] == []

    listed = cli_json('list')
    assert [(e['id'], e['name'], e['launch_type'], e['nodes']) for e in listed] == [
        (entry.id, 'observed', launch_type, 3)]
    assert 'token' not in listed[0] and 'node_token' not in listed[0]
    rows = {row['name']: row for row in cli_json('status', entry.id)['nodes']}
    assert rows['counter/0']['calls_per_s'] > 0 and rows['counter/0']['calls'] > 0
    for row in rows.values():
        assert row['state'] == 'running' and row['pid'] > 0 and row['uptime'] > 0
        assert row['restarts'] == 0 and row['error'] is None
    text = cli('status', 'observed').stdout  # by name, as a table
    assert 'NODE' in text and 'RESTARTS' in text and 'producer/1' in text

    token = cli('token', 'observed')  # What a client of a node must send.
    assert token.returncode == 0, token.stderr
    if launch_type == 'local_mp':  # (Nodes on SSH hosts listen in the hosts' own namespaces.)
        import courier  # pylint: disable=import-outside-toplevel
        servers = {row['node']: row['address'] for row in observer.sample()['servers']}
        with courier.Client(servers['counter/0'], auth_token=token.stdout.strip(),
                            call_timeout=30) as counter:
            assert counter.add(0) > 0
        with pytest.raises(courier.PermissionDeniedError):
            courier.Client(servers['counter/0'], auth_token='not-it', call_timeout=30).add(0)

    one = cli('logs', entry.id[:-2], 'producer/0').stdout  # an id's start is enough
    assert one.startswith('producer 0 made ')
    assert '[producer/1] producer 1 made' in cli('logs', 'observed').stdout
    follow = subprocess.Popen([sys.executable, '-m', 'launchpad.launch', 'logs', 'observed',
                               'producer/1', '--follow'], env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout.readline().startswith('producer 1 made ')

        samples = cli('metrics', 'observed')
        assert samples.returncode == 0, samples.stderr
        assert 'courier_server_calls_total{method="add",node="counter/0"' in samples.stdout

        dashboard = subprocess.Popen([sys.executable, '-m', 'launchpad.launch', 'dashboard',
                                      entry.id], env=environment(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        url = dashboard.stdout.readline().split(': ', 1)[1].strip()
        base, token = url.split('/?token=')
        request = urllib.request.Request(base + '/api/view',
                                         headers={'X-Launchpad-Token': token})
        with urllib.request.urlopen(request, timeout=30) as response:
            view = json.loads(response.read())
        assert {row['name'] for row in view['nodes']} == set(rows)

        stopped = cli('stop', 'observed')
        assert stopped.returncode == 0, stopped.stderr
        assert f'Stopped observed ({entry.id})' in stopped.stdout
        assert dashboard.wait(timeout=30) == 0
        assert 'ended' in dashboard.stdout.read()
        # It sees the end at its next poll, which may come after the dashboard's.
        _, follow_err = follow.communicate(timeout=30)
        assert follow.returncode == 0, follow_err
        assert 'ended' in follow_err
    finally:
        for child in (follow, locals().get('dashboard')):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert running('observed') is None
    assert cli('status', 'observed').returncode == 1
    return rows


def test_cli_sees_and_stops_a_local_program(runtime_dir, tmp_path):
    process = launch(tmp_path, 'local_mp')
    try:
        rows = _look_then_stop(process, 'local_mp')
    finally:
        end(process)
    assert {row['host'] for row in rows.values()} == {os.uname().nodename}


def test_token_says_when_launchpad_made_none(runtime_dir, tmp_path):
    with launched(tmp_path, 'local_mt') as process:  # Its nodes take COURIER_AUTH_TOKEN, if set.
        entry = wait_until(lambda: running('observed'), what='the program in the registry')
        token = cli('token', entry.id)
        assert token.returncode == 1 and not token.stdout
        assert 'made no auth token' in token.stderr and 'local_mt' in token.stderr
        assert cli('stop', entry.id).returncode == 0
        assert process.wait(timeout=60) == 0


def test_cli_sees_and_stops_a_program_on_ssh_hosts(runtime_dir, tmp_path, ssh_testbed):
    from tests.launch.test_ssh import host_options  # pylint: disable=import-outside-toplevel
    options = {host.name: host_options(host) for host in ssh_testbed}
    process = launch(tmp_path, 'ssh', json.dumps(options))
    try:
        rows = _look_then_stop(process, 'ssh')
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 2)
            process.wait(timeout=60)
    assert {name: row['host'] for name, row in rows.items()} == {
        'counter/0': 'lp-h1', 'producer/0': 'lp-h2', 'producer/1': 'lp-h3'}


# What another user tries, in a process that loaded what it needs and then dropped root (also
# what argparse loads late on Python 3.9: another user may not read this Python's library).
AS_NOBODY = '''
import json, os, sys, io, contextlib, gettext, locale
import psutil
import courier
from courier.transport import framed_client
from launchpad.observe import cli, dashboard, registry
dashboard.require()  # (aiohttp, loaded as root)
NOBODY = 65534
os.setgroups([])
os.setgid(NOBODY)
os.setuid(NOBODY)
entry_path, socket_path = sys.argv[1], sys.argv[2]
tried = {}
for command in (['list'], ['status', 'observed'], ['stop', 'observed'], ['logs', 'observed'],
                ['token', 'observed'], ['dashboard', 'observed']):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(command)
    tried[command[0]] = [code, err.getvalue()]
try:
    open(entry_path).read()
    tried['read'] = 'read it'
except OSError as e:
    tried['read'] = type(e).__name__
try:
    courier.Client('unix:' + socket_path, wait_for_ready=False, call_timeout=10).stop()
    tried['call'] = 'called stop'
except Exception as e:
    tried['call'] = str(e)
print(json.dumps(tried))
'''


@pytest.mark.skipif(os.geteuid() != 0, reason='dropping to another user needs root')
def test_another_user_can_neither_see_nor_stop_the_program(runtime_dir, tmp_path):
    import courier  # pylint: disable=import-outside-toplevel
    with launched(tmp_path, 'local_mp') as process:
        entry = wait_until(lambda: running('observed'), what='the program in the registry')
        entry_path = os.path.join(runtime_dir, f'{entry.id}.json')
        socket_path = os.path.join(runtime_dir, f'{entry.id}.sock')
        done = subprocess.run([sys.executable, '-c', AS_NOBODY, entry_path, socket_path],
                              env=environment(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        tried = json.loads(done.stdout)
        for command in ('list', 'status', 'stop', 'logs', 'token', 'dashboard'):
            code, message = tried[command]
            assert code == 1 and 'belongs to another user' in message, tried
        assert tried['read'] == 'PermissionError'
        assert 'ermission denied' in tried['call'], tried
        # Without the entry's token, not even this user's processes get an answer.
        for token in (None, 'not-the-token'):
            with pytest.raises(courier.PermissionDeniedError):
                courier.Client('unix:' + socket_path, auth_token=token,
                               wait_for_ready=False).stop()
        assert wait_until(lambda: _busy(observer_of(entry)))  # untouched
        assert cli('stop', entry.id).returncode == 0
        assert process.wait(timeout=60) == 0


def _cli_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """The command with its output going to a pipe nobody reads any more (`... | head`)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, '-m', 'launchpad.launch', *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=environment(), timeout=60)
    finally:
        os.close(write)


def test_commands_whose_reader_is_gone_end_quietly(runtime_dir, tmp_path):
    with launched(tmp_path, 'local_mp') as process:
        entry = wait_until(lambda: running('observed'), what='the program in the registry')
        observer = observer_of(entry)
        wait_until(lambda: observer.logs()['lines'], what='a line in the logs')
        for command in (['list'], ['list', '--json'], ['status', entry.id],
                        ['status', entry.id, '--json'], ['logs', entry.id],
                        ['metrics', entry.id]):
            done = _cli_into_a_closed_pipe(*command)
            assert (done.returncode, done.stderr) == (141, ''), command  # as `cat` would
        assert cli('stop', entry.id).returncode == 0
        assert process.wait(timeout=60) == 0


def test_the_launcher_says_who_stopped_its_program_and_how_its_nodes_ended(runtime_dir,
                                                                            tmp_path):
    with launched(tmp_path, 'local_mp') as process:
        entry = wait_until(lambda: running('observed'), what='the program in the registry')
        wait_until(lambda: _busy(observer_of(entry)), what='every node running')
        stopper = subprocess.Popen([sys.executable, '-m', 'launchpad.launch', 'stop', entry.id],
                                   env=environment(), stdout=subprocess.PIPE, text=True)
        assert stopper.wait(timeout=60) == 0
        stopper.stdout.close()
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    user = pwd.getpwuid(os.getuid()).pw_name
    who = (f'`python -m launchpad.launch stop` (user {user}, pid {stopper.pid}, parent pid '
           f'{os.getpid()}, host {socket.gethostname()})')
    assert f"Stopping program 'observed': asked by {who}." in err, err
    assert f"Program 'observed' has stopped; its 3 nodes ended: 3 finished.\n" in err, err
