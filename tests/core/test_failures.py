"""Long runs on threads and local processes: restarts, drops, hangs, fast stops and process trees
(the programs are in tests/failure_programs.py; tests/launch runs them on the other platforms)."""
import functools
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import launchpad as lp
from launchpad.launch.runner import Runner
from tests import failure_checks as checks
from tests import failure_programs as programs
from tests.core.conftest import script_env, wait_until

LAUNCH_TYPES = ['test_mt', 'test_mp']


def wait_running(controller, *names, timeout=60):
    assert wait_until(lambda: all(controller.status()[name].state is lp.NodeState.RUNNING
                                  for name in names), timeout=timeout), controller.status()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_killed_node_is_restarted_and_its_clients_reach_the_new_one(launch_type, capfd):
    threads = launch_type == 'test_mt'  # a thread cannot be killed: there it crashes
    controller = lp.launch(programs.restart_program(crash=threads), launch_type=launch_type)
    if not threads:  # (with threads the program runs to its end by itself, maybe between polls)
        wait_running(controller, 'worker/0', 'prober/0')
        assert wait_until(lambda: 'PROBE first answer' in capfd.readouterr().out, timeout=30)
        os.kill(controller.status()['worker/0'].pid, signal.SIGKILL)
    assert controller.wait(timeout=60)
    status = controller.status()
    assert (status['worker/0'].state, status['worker/0'].restarts) == (lp.NodeState.FINISHED, 1)
    assert status['prober/0'].state is lp.NodeState.FINISHED  # it saw attempt 1 answer
    expected = 'RuntimeError: worker crashed' if threads else 'killed by signal 9'
    assert expected in status['worker/0'].error


def _cpu_cgroups():
    """(root where a throttled cgroup can be made, the cgroup this process is in), or Nones."""
    for root, controller in (('/sys/fs/cgroup/cpu', 'cpu'), ('/sys/fs/cgroup', '')):
        if not os.access(root, os.W_OK) or not os.path.exists(os.path.join(root, 'cgroup.procs')):
            continue
        with open('/proc/self/cgroup') as f:
            for line in f:
                _, controllers, path = line.rstrip('\n').split(':', 2)
                if controller in controllers.split(',') or (not controller and not controllers):
                    return root, os.path.join(root, path.lstrip('/'))
    return None, None


def test_waiting_for_a_cpu_or_a_call_is_not_a_hang():
    """Only time a node could have used counts toward its progress deadline: one waiting 4x its
    deadline for a slow peer's answer, and (as root, with cgroups) one whose heartbeats come ~1 s
    apart because its cgroup may use 20 ms of CPU a second, both finish; a node that stops beating
    is still found hung."""
    root, parent = _cpu_cgroups()
    if root is None and os.environ.get('LAUNCHPAD_TESTBEDS') == 'required':
        pytest.fail('no writable cpu cgroup to starve a node in (needs root)')
    cgroup = None if root is None else programs.throttled_cgroup(root)
    try:
        controller = lp.launch(programs.patience_program(0.5, cgroup, parent),
                               launch_type='test_mp')
        try:
            assert controller.wait(labels_to_wait_for=['caller'] + (['starved'] if cgroup else []),
                                   timeout=60)
            status = controller.status()
        finally:
            controller.stop()
            controller.wait(timeout=30, raise_error=False)
    finally:
        if cgroup is not None:
            programs.remove_cgroup(cgroup, parent)
    patient = ['caller/0'] + (['starved/0'] if cgroup else [])
    assert [(status[n].state, status[n].restarts) for n in patient] == \
        [(lp.NodeState.FINISHED, 0)] * len(patient), status
    assert status['hung/0'].state is lp.NodeState.DROPPED
    assert status['hung/0'].error.startswith('hung: no progress for')
    assert 'counted (its progress deadline is 0.5 s)' in status['hung/0'].error
    if cgroup is None:
        pytest.skip('checked a call only: no writable cpu cgroup to starve a node in (root)')


def test_sigterm_is_a_preemption_the_restart_policy_covers(capfd):
    controller = lp.launch(programs.restart_program(), launch_type='test_mp')
    wait_running(controller, 'worker/0', 'prober/0')
    assert wait_until(lambda: 'PROBE first answer' in capfd.readouterr().out, timeout=30)
    os.kill(controller.status()['worker/0'].pid, signal.SIGTERM)
    assert controller.wait(timeout=60)
    status = controller.status()['worker/0']
    assert (status.state, status.restarts) == (lp.NodeState.FINISHED, 1)
    assert status.error.startswith('SIGTERM: the platform (test_mp) ended this node')


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_drop_hang_and_restart_budget(launch_type):
    controller = lp.launch(programs.failure_program(deadline=1.5), launch_type=launch_type)
    error = checks.failed_over_budget(controller)
    checks.check_reported_hang(error)
    assert 'progress deadline is 1.5 s' in error.failures[0][0]
    assert controller.status()['dropped/0'].error == 'ValueError: dropped on purpose'


@pytest.mark.parametrize('launch_type, runs', [('test_mt', 2), ('test_mp', 3)])
def test_stop_ends_nodes_that_do_not_cooperate_at_once_and_kills_none(launch_type, runs):
    """Acme's DQN shape (a learner loop without a stop handler, actors calling it) and four
    actors with stop handlers loop-calling a counter, one of which calls lp.stop()."""
    for _ in range(runs):
        notice_period = 20.0
        controller = lp.launch(programs.stop_program(), launch_type=launch_type,
                               notice_period=notice_period)
        checks.stopped_promptly(controller, notice_period)


class Server:
    def ping(self):
        return 'pong'


class Broken:
    def __init__(self):
        raise ValueError('never serves')


def call_broken(broken, server, record: str) -> None:
    lp.register_stop_handler(lambda: None)  # it cooperates: the stop does not end it at once
    server.ping()
    open(f'{record}.calling', 'w').close()
    try:
        broken.ping()  # waits: broken/0 never serves
    except lp.NodeStoppedError as e:
        with open(record, 'w') as f:
            f.write(str(e))
        raise


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_call_waiting_for_a_node_that_is_gone_is_released_by_the_stop(launch_type, tmp_path):
    record = tmp_path / 'error.txt'
    program = lp.Program('released')
    server = program.add_node(lp.CourierNode(Server), label='server')
    broken = program.add_node(lp.CourierNode(Broken), label='broken',
                              restart=lp.RestartPolicy(max_restarts=0, on_failure='drop'))
    program.add_node(lp.PyNode(call_broken, broken, server, str(record)), label='caller')
    controller = lp.launch(program, launch_type=launch_type, notice_period=60)
    assert wait_until(lambda: controller.status()['broken/0'].state is lp.NodeState.DROPPED,
                      timeout=60)
    wait_running(controller, 'caller/0')
    assert wait_until(lambda: os.path.exists(f'{record}.calling'), timeout=60)  # it cooperates
    started = time.monotonic()
    controller.stop()
    assert time.monotonic() - started < 30  # released at once, not after the 60 s notice
    assert 'node broken/0 is not serving' in record.read_text()
    assert 'the program is stopping' in record.read_text()
    assert controller.status()['caller/0'].state is lp.NodeState.FINISHED  # ended with the stop


def test_processes_a_node_started_end_when_it_crashes_or_stops():
    seconds = random.randint(30000, 39999)
    controller = lp.launch(programs.spawning_program(seconds), launch_type='test_mp')
    # spawner/0 crashed: before its process ended, its three sleeps did.
    assert wait_until(lambda: controller.status()['spawner/0'].exit_code is not None, 60)
    assert controller.status()['spawner/0'].state is lp.NodeState.DROPPED
    assert programs.sleepers(seconds) == []
    assert wait_until(lambda: len(programs.sleepers(seconds + 1)) == 3, timeout=30)
    controller.stop()  # spawner/1 ends with the program, and so do its three sleeps
    assert programs.sleepers(seconds + 1) == []


LAUNCHER_DIES = '''
import sys, launchpad as lp
from tests import failure_checks as checks
from tests import failure_programs as programs
program = lp.Program('orphans')
program.add_node(lp.PyNode(programs.spawn, int(sys.argv[1]), False), label='spawner')  # sleeps
lp.launch(program, launch_type='local_mp')
'''


def test_processes_a_node_started_end_when_its_launcher_is_killed():
    seconds = random.randint(40000, 49999)
    launcher = subprocess.Popen([sys.executable, '-c', LAUNCHER_DIES, str(seconds)],
                                env=script_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: len(programs.sleepers(seconds)) == 3, timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    killed = time.monotonic()
    assert wait_until(lambda: programs.sleepers(seconds) == [], timeout=30)
    assert time.monotonic() - killed < 20


def test_a_launcher_that_cannot_restart_fails_the_node_saying_so():
    program = programs.restart_program(crash=True)
    controller = lp.launch(program, launch_type='test_mt')
    runner = controller._runner  # pylint: disable=protected-access
    runner.restart = functools.partial(Runner.restart, runner)  # a platform that cannot restart
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=60)
    assert failure.value.node_name == 'worker/0'
    assert 'could not be restarted: the test_mt launcher cannot restart nodes' in str(
        failure.value)


def test_policies_are_checked_with_the_fix_in_the_message():
    with pytest.raises(ValueError, match=r"on_failure=...\) must be 'fail'"):
        lp.RestartPolicy(on_failure='ignore')
    with pytest.raises(ValueError, match='max_restarts=...\\) must be an int >= 0'):
        lp.RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match='window=...\\) must be a number of seconds > 0, or None'):
        lp.RestartPolicy(window=0)
    program = lp.Program('p')
    with pytest.raises(TypeError, match=r'restart= takes an lp.RestartPolicy'):
        with program.group('a', restart=3):
            pass
    with pytest.raises(ValueError, match='progress_deadline must be a number of seconds > 0'):
        program.add_node(lp.PyNode(print), label='a', progress_deadline=-1)
    policy = lp.RestartPolicy(max_restarts=1)
    with program.group('a', restart=policy, progress_deadline=5):
        program.add_node(lp.PyNode(print))
        program.add_node(lp.PyNode(print), restart=lp.RestartPolicy(on_failure='drop'))
    with pytest.raises(lp.ProgramError, match="group 'a' already has restart="):
        with program.group('a', restart=lp.RestartPolicy(max_restarts=2)):
            pass
    assert program.policy_of('a/0').restart is policy
    assert program.policy_of('a/1').restart.on_failure == 'drop'
    assert program.policy_of('a/1').progress_deadline == 5


def fail_at_first_attempt() -> None:
    if lp.get_context().attempt == 0:
        raise RuntimeError('the first attempt fails')
    lp.wait_for_stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_program_whose_only_node_restarts_runs_on(launch_type):
    # The controller's poll saw no node running before the restart: the restarted one counts.
    program = lp.Program('alone')
    program.add_node(lp.PyNode(fail_at_first_attempt), label='alone',
                     restart=lp.RestartPolicy(max_restarts=1, backoff=0.1))
    controller = lp.launch(program, launch_type=launch_type)
    try:
        assert wait_until(lambda: controller.status()['alone/0'].restarts == 1, timeout=60)
        wait_running(controller, 'alone/0')
        assert not controller.done
    finally:
        controller.stop()
    assert controller.wait(timeout=60)
    assert controller.status()['alone/0'].state is lp.NodeState.FINISHED


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
@pytest.mark.parametrize('stopped_by', ['controller', 'node'])
def test_a_node_waiting_to_restart_when_the_program_stops_is_killed_not_failed(launch_type,
                                                                               stopped_by):
    """Its failure was within its policy and the stop was asked for: not a program failure, so
    wait() returns True and the node ends `killed` (its error still says why it had failed)."""
    program = lp.Program('pending_restart')
    program.add_node(lp.PyNode(fail_at_first_attempt), label='flaky',
                     restart=lp.RestartPolicy(max_restarts=3, backoff=600))
    program.add_node(lp.PyNode(lp.wait_for_stop), label='steady')
    controller = lp.launch(program, launch_type=launch_type)
    try:
        assert wait_until(lambda: controller.status()['flaky/0'].state is
                          lp.NodeState.RESTARTING, timeout=60), controller.status()
        if stopped_by == 'node':
            program.add_node(lp.PyNode(lp.stop), label='stopper')
        else:
            controller.stop()
        assert controller.wait(timeout=60) is True
    finally:
        controller.stop()
    flaky = controller.status()['flaky/0']
    assert (flaky.state, flaky.restarts) == (lp.NodeState.KILLED, 0)
    assert flaky.error == 'RuntimeError: the first attempt fails'
    assert controller.status()['steady/0'].state is lp.NodeState.FINISHED
