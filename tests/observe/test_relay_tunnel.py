"""A relay tunnel (`launchpad.observe.tunnel.RelayTunnel`, `launchpad.observe.relay`) reaches a
supervisor's observer through a command's stdin and stdout, as a detached Slurm program's login
node does through a step of its job; here the command runs the relay on this machine, against a
detached local_mp program whose registry is another directory, so no test bed is needed."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile

import pytest

import launchpad as lp
from launchpad.observe import cli, registry, relay, tunnel
from tests.failure_checks import wait_for
from tests.launch.detached_program import make_program


@pytest.fixture
def two_registries(monkeypatch):
    """(the supervisor's registry, this side's), both private and in short paths."""
    paths = [tempfile.mkdtemp(prefix='lp-rt-') for _ in range(2)]
    yield paths
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def supervised_there(tmp_path, monkeypatch, two_registries):
    """A detached local_mp program, registered in the supervisor's registry, and its entry
    there; the test runs with this side's registry. Stopped at the end if it still runs."""
    there, here = two_registries
    monkeypatch.setenv('LAUNCHPAD_LOGGING_DIR', str(tmp_path / 'logs'))
    monkeypatch.setenv(registry.ENV, there)
    launched = lp.launch(make_program(str(tmp_path / 'counter.json')), launch_type='local_mp',
                         detach=True, supervisor_grace=60)
    try:
        entry = registry.find(launched.id)
        monkeypatch.setenv(registry.ENV, here)
        yield launched, entry
    finally:
        monkeypatch.setenv(registry.ENV, there)
        if not launched.done:
            launched.stop()


@pytest.mark.timeout(120)
def test_a_relay_tunnel_reaches_the_supervisor_and_follows_a_new_one(
        tmp_path, capsys, two_registries, supervised_there):
    """lp.attach reaches the program through the relay, whose command is run again when it
    ended without a word (its way in failed); when its supervisor is SIGKILLed, the relay
    waits for the new one, whose pid and token this side's entry then takes, and a client made
    next through the open tunnel (`status`, run in this process) carries the new token at
    once; the stop leaves neither entry nor tunnel socket here."""
    launched, entry = supervised_there
    socket_path = entry.address.split(':', 1)[1]
    failed = tmp_path / 'failed'  # the relay command's first run fails without a word
    registry.register(dataclasses.replace(entry, relay=[
        'sh', '-c', 'test -e "$0" || { touch "$0"; echo "task launch failed" >&2; exit 1; }; '
        'exec "$@"', str(failed), sys.executable, relay.__file__, socket_path]))
    [listed] = registry.entries()
    assert registry.is_remote(listed)

    controller = lp.attach(launched.id)  # (the tunnel runs the relay command again)
    assert failed.exists()
    assert {s.state.value for s in controller.status().values()} == {'running'}
    killed = controller.supervisor['pid']
    os.kill(killed, signal.SIGKILL)  # its keeper starts a new one
    assert cli.main(['status', launched.id, '--json']) == 0  # (it was refused once)
    assert json.loads(capsys.readouterr().out)['controller']['pid'] != killed
    assert {s.restarts for s in controller.status().values()} == {0}
    assert controller.supervisor['pid'] != killed
    [listed] = registry.entries()
    assert (listed.pid, listed.token) != (killed, entry.token)
    controller.resize('worker', 2)
    assert controller.group_size('worker') == 2
    controller.stop()
    assert controller.done
    assert os.listdir(two_registries[1]) == []


@pytest.mark.timeout(120)
def test_a_controller_reaches_a_new_supervisor_through_two_relays(
        tmp_path, two_registries, supervised_there):
    """A controller whose supervisor was replaced calls the new one after two runs of the
    relay command (a `kubectl exec` each, on Kubernetes): the one its client's new connection
    runs, whose up line names the new supervisor (its token refuses the call), and the one of
    the connection of a client that carries the new token; not a third for a new tunnel."""
    launched, entry = supervised_there
    runs = tmp_path / 'runs'  # a line for each run of the relay command
    registry.register(dataclasses.replace(entry, relay=[
        'sh', '-c', 'echo run >> "$0"; exec "$@"', str(runs), sys.executable, relay.__file__,
        entry.address.split(':', 1)[1]]))
    controller = lp.attach(launched.id)
    assert {s.restarts for s in controller.status().values()} == {0}
    os.kill(entry.pid, signal.SIGKILL)  # its keeper starts a new one
    assert wait_for(lambda: _registered_anew(two_registries[0], entry))
    # The relay of the client's connection has ended with the supervisor it reached.
    relays = tunnel._tunnels[entry.id]._processes  # pylint: disable=protected-access
    assert wait_for(lambda: not relays)
    before = len(runs.read_text().splitlines())
    assert {s.restarts for s in controller.status().values()} == {0}
    assert len(runs.read_text().splitlines()) - before == 2
    assert controller.supervisor['pid'] != entry.pid
    controller.stop()


def _registered_anew(directory: str, entry: registry.Entry) -> bool:
    """Whether a supervisor other than `entry`'s is registered in `directory` and listens."""
    try:
        with open(os.path.join(directory, f'{entry.id}.json')) as f:
            pid = json.load(f)['pid']
    except (OSError, ValueError, KeyError):
        return False
    return pid != entry.pid and os.path.exists(entry.address.split(':', 1)[1])
