"""Long runs on Slurm (the test bed's clusters): a restarted node is a new job step in the job's
allocation; drops, hangs, fast stops, the time-limit warning, and the processes nodes
start (tests/failure_programs.py has the programs)."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

import launchpad as lp
from tests import failure_programs as programs
from tests.launch.test_slurm import assert_nothing_left, launch

pytestmark = pytest.mark.timeout(180)


def wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


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
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=90)
    assert failure.value.node_name == 'hung/0'
    (first, stacks), (second, _) = failure.value.failures
    assert first.startswith('hung: no progress') and 'in stuck_in_a_loop' in stacks
    assert second == 'RuntimeError: the second attempt fails too'
    status = controller.status()
    assert status['dropped/0'].state is lp.NodeState.DROPPED
    assert status['hung/0'].restarts == 1
    assert_nothing_left(controller, tmp_path)


def test_what_nodes_start_ends_with_them_even_when_they_are_killed(slurm_single, tmp_path):
    seconds = random.randint(60000, 69999)
    controller = launch(programs.spawning_program(seconds), tmp_path)
    assert wait_for(lambda: controller.status()['spawner/0'].exit_code is not None, 90)
    assert controller.status()['spawner/0'].state is lp.NodeState.DROPPED
    assert programs.sleepers(seconds) == []  # they ended before its step did
    assert wait_for(lambda: len(programs.sleepers(seconds + 1)) == 3, timeout=60)
    # Killed, spawner/1 cannot end its processes; its worker's supervising parent does (without
    # cgroups, Slurm would lose track of them, and they would hold the step open).
    os.kill(controller.status()['spawner/1'].pid, signal.SIGKILL)
    assert controller.wait(timeout=60)  # both dropped: the program is over
    assert controller.status()['spawner/1'].state is lp.NodeState.DROPPED
    assert programs.sleepers(seconds + 1) == []
    assert_nothing_left(controller, tmp_path)


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
    coordinator = controller._coordinator  # pylint: disable=protected-access
    assert controller.wait(timeout=90)
    took = time.monotonic() - coordinator.stop_time
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    assert took < notice_period / 4, f'{took:.1f} s from lp.stop() to the end'
    assert_nothing_left(controller, tmp_path)
