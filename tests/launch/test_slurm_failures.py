"""Long runs on Slurm (the test bed's clusters): a restarted node is a new job step in the job's
allocation; drops, hangs, fast stops, the time-limit warning, and the processes nodes
start (tests/failure_programs.py has the programs)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import launchpad as lp
from tests import failure_checks as checks
from tests import failure_programs as programs
from tests.failure_checks import wait_for
from tests.launch.test_slurm import assert_nothing_left, env_for, launch, queue

pytestmark = pytest.mark.timeout(180)


def test_a_killed_node_runs_again_as_a_new_job_step(slurm_single, tmp_path, capfd):
    controller = launch(programs.restart_program(), tmp_path)
    assert wait_for(lambda: 'PROBE first answer' in capfd.readouterr().out)
    os.kill(controller.status()['worker/0'].pid, signal.SIGKILL)
    assert controller.wait(timeout=90)
    status = controller.status()
    assert (status['worker/0'].state, status['worker/0'].restarts) == (lp.NodeState.FINISHED, 1)
    assert status['prober/0'].state is lp.NodeState.FINISHED  # it reached the new instance
    assert_nothing_left(controller, tmp_path)


def test_drop_hang_and_restart_budget_in_a_job(slurm_single, tmp_path):
    controller = launch(programs.failure_program(deadline=2.0), tmp_path)
    checks.check_reported_hang(checks.failed_over_budget(controller))
    assert_nothing_left(controller, tmp_path)


def test_what_nodes_start_ends_on_crash_kill_and_stop(slurm_single, tmp_path):
    seconds = random.randint(60000, 69999)
    program = programs.spawning_program(seconds)
    program.add_node(lp.PyNode(programs.spawn, seconds + 2, False), label='spawner')
    controller = launch(program, tmp_path)
    assert wait_for(lambda: controller.status()['spawner/0'].exit_code is not None, 90)
    assert controller.status()['spawner/0'].state is lp.NodeState.DROPPED
    assert programs.sleepers(seconds) == []  # they ended before its step did
    assert wait_for(lambda: len(programs.sleepers(seconds + 1)) == 3, timeout=60)
    # Killed, spawner/1 cannot end its processes; its worker's supervising parent does (without
    # cgroups, Slurm would lose track of them, and they would hold the step open).
    os.kill(controller.status()['spawner/1'].pid, signal.SIGKILL)
    assert wait_for(lambda: controller.status()['spawner/1'].state is lp.NodeState.DROPPED)
    assert programs.sleepers(seconds + 1) == []
    assert wait_for(lambda: len(programs.sleepers(seconds + 2)) == 3, timeout=60)
    controller.stop()  # spawner/2's processes end with it
    assert programs.sleepers(seconds + 2) == []
    assert_nothing_left(controller, tmp_path)


LAUNCHER = '''
import sys, launchpad as lp
from tests import failure_programs as programs
program = lp.Program('orphans')
program.add_node(lp.PyNode(programs.spawn, int(sys.argv[1]), False), label='spawner')
lp.launch(program, launch_type='slurm')
'''


def test_what_nodes_start_ends_when_the_launcher_is_killed(slurm_single, tmp_path):
    seconds = random.randint(60000, 69999)
    launcher = subprocess.Popen([sys.executable, '-c', LAUNCHER, str(seconds)],
                                env=env_for(tmp_path), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(programs.sleepers(seconds)) == 3, timeout=90)
    finally:
        launcher.kill()
        launcher.wait()
    killed = time.monotonic()
    # The node notices its coordinator is gone (5 s), stops, and ends its processes on the way out.
    assert wait_for(lambda: programs.sleepers(seconds) == [], timeout=30)
    assert time.monotonic() - killed < 20
    assert wait_for(lambda: queue() == '', timeout=30)


def wait_for_the_warning() -> None:
    lp.register_stop_handler(lambda: print('STOP HANDLER RAN', flush=True))
    lp.wait_for_stop()


def test_slurm_warns_before_the_time_limit_and_the_program_stops(slurm_single, tmp_path, capfd):
    program = lp.Program('time_limited')
    program.add_node(lp.PyNode(wait_for_the_warning), label='patient')
    controller = launch(program, tmp_path, resources={
        'patient': lp.SlurmResources(time='1')}, stop_before_time_limit=55)
    assert controller.wait(timeout=120)  # long before the minute is over
    assert controller.status()['patient/0'].state is lp.NodeState.FINISHED
    assert 'patient/0 received SIGUSR1' in controller._coordinator.stop_reason  # pylint: disable=protected-access
    assert '[patient/0] STOP HANDLER RAN' in capfd.readouterr().out
    assert_nothing_left(controller, tmp_path)


def test_a_stop_ends_every_step_without_a_kill(slurm_multi, tmp_path):
    """On the three-node cluster (last: switching clusters takes seconds): 8 steps."""
    notice_period = 20.0
    controller = launch(programs.stop_program(), tmp_path, notice_period=notice_period)
    checks.stopped_promptly(controller, notice_period)
    assert_nothing_left(controller, tmp_path)
