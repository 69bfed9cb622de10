"""Long runs on SSH hosts (the bed's lp-h1..3): restarts through the host agent, drops, hangs,
fast stops, and the processes nodes start (tests/failure_programs.py has the programs)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import launchpad as lp
from tests import failure_checks as checks
from tests import failure_programs as programs
from tests.failure_checks import wait_for
from tests.launch.test_ssh import host_options, hosts  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(120)


def test_a_node_killed_on_its_host_is_forked_again_at_a_new_port(hosts, capfd):
    controller = lp.launch(programs.restart_program(), launch_type='ssh', resources={
        'worker': hosts['lp-h1'], 'prober': hosts['lp-h2']})
    assert wait_for(lambda: 'PROBE first answer' in capfd.readouterr().out)
    os.kill(controller.status()['worker/0'].pid, signal.SIGKILL)  # the bed shares our pids
    assert controller.wait(timeout=60)
    status = controller.status()
    assert (status['worker/0'].state, status['worker/0'].restarts) == (lp.NodeState.FINISHED, 1)
    assert status['worker/0'].host == 'lp-h1'
    assert 'killed by signal 9' in status['worker/0'].error
    assert status['prober/0'].state is lp.NodeState.FINISHED  # it reached the new instance


def test_drop_hang_and_restart_budget_across_hosts(hosts):
    controller = lp.launch(programs.failure_program(deadline=1.5), launch_type='ssh', resources={
        'steady': hosts['lp-h1'], 'dropped': hosts['lp-h2'], 'hung': hosts['lp-h3']})
    checks.check_reported_hang(checks.failed_over_budget(controller))


def test_a_stop_ends_every_host_without_a_kill(hosts):
    notice_period = 20.0
    controller = lp.launch(programs.stop_program(), launch_type='ssh', resources={
        'learner': hosts['lp-h1'], 'actor': hosts['lp-h2'], 'counter': hosts['lp-h1'],
        'counting': lp.SshHosts([hosts['lp-h2'], hosts['lp-h3']])},
        notice_period=notice_period)
    checks.stopped_promptly(controller, notice_period)


def test_what_nodes_start_ends_on_crash_and_stop(hosts):
    seconds = random.randint(50000, 59999)
    controller = lp.launch(programs.spawning_program(seconds), launch_type='ssh', resources={
        'spawner': lp.SshHosts([hosts['lp-h1'], hosts['lp-h2']])})
    assert wait_for(lambda: controller.status()['spawner/0'].exit_code is not None)
    assert controller.status()['spawner/0'].state is lp.NodeState.DROPPED
    assert programs.sleepers(seconds) == []  # spawner/0 crashed: they ended before it did
    assert wait_for(lambda: len(programs.sleepers(seconds + 1)) == 3)
    controller.stop()
    assert programs.sleepers(seconds + 1) == []


LAUNCHER = '''
import json, sys, launchpad as lp
from tests import failure_checks as checks
from tests import failure_programs as programs
from tests.failure_checks import wait_for
hosts = {name: lp.SshHost(name, **options) for name, options in json.loads(sys.argv[2]).items()}
lp.launch(programs.spawning_program(int(sys.argv[1])), launch_type='ssh',
          resources={'spawner': lp.SshHosts([hosts['lp-h1'], hosts['lp-h2']])})
'''


def test_what_nodes_start_ends_on_crash_and_when_the_launcher_is_killed(ssh_testbed, hosts):
    seconds = random.randint(50000, 59999)
    options = {h.name: host_options(h) for h in ssh_testbed}
    env = dict(os.environ, PYTHONPATH=options['lp-h1']['env']['PYTHONPATH'])
    launcher = subprocess.Popen([sys.executable, '-c', LAUNCHER, str(seconds),
                                 json.dumps(options)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    output = []
    threading.Thread(target=lambda: output.extend(launcher.stdout), daemon=True).start()
    try:
        # spawner/0 crashed on lp-h1 (and was dropped): its sleeps went with it.
        assert wait_for(lambda: any('spawner/0 failed for good' in line for line in output)
                        and len(programs.sleepers(seconds + 1)) == 3, timeout=60), output
        assert wait_for(lambda: programs.sleepers(seconds) == [], timeout=10)
    finally:
        launcher.kill()
        launcher.wait()
    killed = time.monotonic()
    # spawner/1 on lp-h2 notices that its launcher is gone, and its sleeps end with it.
    assert wait_for(lambda: programs.sleepers(seconds + 1) == [], timeout=30)
    assert time.monotonic() - killed < 20


def test_a_preempted_nodes_checkpoint_is_restored_on_its_host(hosts, tmp_path):
    from launchpad.launch.ssh import protocol  # pylint: disable=import-outside-toplevel
    from tests import checkpoint_programs  # pylint: disable=import-outside-toplevel
    controller = lp.launch(checkpoint_programs.saver_program(str(tmp_path), 'sigterm'),
                           launch_type='ssh', resources={'saver': hosts['lp-h2']})
    assert controller.wait(timeout=60)
    found = checkpoint_programs.restored(str(tmp_path))
    for index in (0, 1):
        first, second = found['saver', index, 0], found['saver', index, 1]
        assert second['restored'] == {'steps': 1, 'saved_by': [0]}
        assert second['checkpoint_dir'] == first['checkpoint_dir']
        assert f'/{protocol.DIR_PREFIX}' in first['checkpoint_dir']  # the host's run directory
        assert not os.path.exists(first['checkpoint_dir'])
