"""Colocation nodes: inner nodes run as threads or sub-processes of one executable."""
import os
import sys
import time

import psutil
import pytest

import launchpad as lp

from tests.core.conftest import wait_until
from tests.leftovers import temp_dirs
from tests.nodes.conftest import LAUNCH_TYPES, launch_and_wait

MODES = ['threads', 'processes']


class Counter:
    """Records who called it: (node name, pid) per call."""

    def __init__(self):
        self._calls = []

    def inc(self, name, pid):
        self._calls.append((name, pid))
        return len(self._calls)

    def calls(self):
        return list(self._calls)

    def pid(self):
        return os.getpid()


def call_from_inside(counter):
    context = lp.get_context()
    assert (context.node_name, context.label, context.index) == ('colo/0/1', 'colo/0', 1)
    counter.inc(context.node_name, os.getpid())


def call_from_outside(counter, mode):
    """Checks that the colocated counter and its colocated caller ran, then stops the program."""
    assert wait_until(lambda: [c for c in counter.calls() if c[0] == 'colo/0/1'], timeout=30)
    counter.inc(lp.get_context().node_name, os.getpid())
    (_, inside_pid), (_, outside_pid) = counter.calls()
    counter_pid = counter.pid()
    if mode == 'threads':
        assert inside_pid == counter_pid
    else:
        assert len({inside_pid, counter_pid, os.getpid()}) == 3
    if lp.get_context().launch_type == 'test_mp':
        assert outside_pid not in (inside_pid, counter_pid)
    lp.stop()


def colocated_program(mode, inner_function, outer_function=None, **colocation_kwargs):
    """A counter and a node calling it, colocated; optionally a node outside calling it too.

    The counter's handle is made before it is colocated, as Acme does.
    """
    program = lp.Program('colocation')
    counter_node = lp.CourierNode(Counter)
    counter = counter_node.create_handle()
    inner = lp.PyNode(inner_function, counter)
    program.add_node(lp.ColocationNode([counter_node, inner], mode=mode, **colocation_kwargs),
                     label='colo')
    if outer_function is not None:
        program.add_node(lp.PyNode(outer_function, counter, mode), label='outside')
    return program


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
@pytest.mark.parametrize('mode', MODES)
def test_handles_of_colocated_nodes_work_inside_and_outside(mode, launch_type):
    program = colocated_program(mode, call_from_inside, call_from_outside)
    controller = launch_and_wait(program, launch_type)
    assert {name: status.state for name, status in controller.status().items()} == {
        'colo/0': lp.NodeState.FINISHED, 'outside/0': lp.NodeState.FINISHED}


def fail_inside(counter):
    del counter
    raise ValueError('inner node gave up')


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
@pytest.mark.parametrize('mode', MODES)
def test_an_inner_failure_fails_the_colocation_naming_the_inner_node(mode, launch_type):
    with pytest.raises(lp.NodeFailedError) as failure:
        launch_and_wait(colocated_program(mode, fail_inside), launch_type)
    assert failure.value.node_name == 'colo/0'
    assert 'colo/0/1' in failure.value.message
    assert 'ValueError: inner node gave up' in str(failure.value)


def exit_cleanly(counter):
    del counter
    sys.exit()


def exit_with_code(counter):
    del counter
    sys.exit(3)


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_an_inner_thread_that_exits_ends_as_a_process_that_exits(launch_type):
    """SystemExit with no code (or 0) in an inner thread finishes it, as it finishes a node's
    process (Acme's stop handlers raise SystemExit in the node's thread); another code fails it."""
    program = colocated_program('threads', exit_cleanly, return_on_first_completed=True)
    controller = launch_and_wait(program, launch_type)
    assert controller.status()['colo/0'].state is lp.NodeState.FINISHED
    with pytest.raises(lp.NodeFailedError) as failure:
        launch_and_wait(colocated_program('threads', exit_with_code,
                                          return_on_first_completed=True), launch_type)
    assert 'colo/0/1' in failure.value.message
    assert 'SystemExit: 3' in str(failure.value)


def fail_twice(counter, attempts_file):
    del counter
    with open(attempts_file, 'a') as f:
        f.write('attempt\n')
    with open(attempts_file) as f:
        attempts = len(f.readlines())
    if attempts <= 2:
        raise RuntimeError(f'attempt {attempts} failed')


def retrying_program(attempts_file, retries):
    program = lp.Program('retries')
    program.add_node(lp.MultiProcessingColocation(
        [lp.PyNode(fail_twice, None, attempts_file)], num_retries_on_failure=retries), label='colo')
    return program


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_failed_sub_processes_are_restarted(launch_type, tmp_path):
    attempts = str(tmp_path / 'attempts')
    launch_and_wait(retrying_program(attempts, retries=2), launch_type)
    with open(attempts) as f:
        assert len(f.readlines()) == 3


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_node_that_keeps_failing_fails_after_its_retries(launch_type, tmp_path):
    with pytest.raises(lp.NodeFailedError, match=r'colo/0/0 .* failed after 1 restarts: '
                                                 r'RuntimeError: attempt 2 failed'):
        launch_and_wait(retrying_program(str(tmp_path / 'attempts'), retries=1), launch_type)


def test_inner_nodes_are_named_after_the_colocation():
    program = lp.Program('names')
    first, second = lp.PyNode(print), lp.CourierNode(Counter)
    colocation = lp.MultiThreadingColocation([first, second])
    program.add_node(lp.PyNode(print), label='group')
    program.add_node(colocation, label='group')
    assert (colocation.name, first.name, second.name) == ('group/1', 'group/1/0', 'group/1/1')
    assert colocation.inner_nodes == [first, second]
    assert colocation.addresses == second.addresses


def test_edges_reach_inner_nodes():
    program = lp.Program('edges')
    server = lp.CourierNode(Counter)
    handle = server.create_handle()
    user = lp.PyNode(call_from_inside, handle)
    program.add_node(lp.MultiProcessingColocation([server, user]), label='colo')
    outside = lp.PyNode(call_from_inside, handle)
    program.add_node(outside, label='outside')
    program.validate()
    assert set(program.edges) == {(server, user), (server, outside)}
    assert '"colo/0/0" -> "outside/0"' in program.to_dot()


def test_inner_nodes_cannot_be_added_to_the_program():
    program = lp.Program('inner')
    inner = lp.PyNode(print)
    program.add_node(lp.MultiThreadingColocation([inner]), label='colo')
    with pytest.raises(lp.ProgramError, match='add only the colocation node'):
        program.add_node(inner, label='again')
    added = lp.PyNode(print)
    program.add_node(added, label='added')
    with pytest.raises(ValueError, match='already added to a program'):
        lp.MultiThreadingColocation([added])


@pytest.mark.parametrize('arguments, error, message', [
    (([],), ValueError, 'non-empty list'),
    ((['not a node'],), TypeError, 'takes launchpad nodes'),
    (([lp.PyNode(print)], 'fibers'), ValueError, 'Unknown colocation mode'),
    (([lp.PyNode(print)], 'threads', 1), ValueError, "use mode='processes'"),
    (([lp.PyNode(print)], 'processes', -1), ValueError, 'num_retries_on_failure'),
])
def test_bad_colocations_are_clear_errors(arguments, error, message):
    with pytest.raises(error, match=message):
        lp.ColocationNode(*arguments)


def test_a_node_is_colocated_once():
    node = lp.PyNode(print)
    with pytest.raises(ValueError, match='appears twice'):
        lp.MultiThreadingColocation([node, node])
    lp.MultiThreadingColocation([node])
    with pytest.raises(ValueError, match='one colocation only'):
        lp.MultiProcessingColocation([node])


def test_the_colocation_handle_explains_itself():
    program = lp.Program('handle')
    handle = program.add_node(lp.MultiThreadingColocation([lp.PyNode(print)]), label='colo')
    with pytest.raises(TypeError, match='inner_node.create_handle'):
        handle.dereference()


def serve_forever(counter):
    del counter
    lp.wait_for_stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_stopping_the_program_ends_the_sub_processes(launch_type):
    controller = lp.launch(colocated_program('processes', serve_forever),
                           launch_type=launch_type, notice_period=30)
    try:
        assert wait_until(lambda: controller.status()['colo/0'].state is lp.NodeState.RUNNING,
                          timeout=60)
        time.sleep(1.0)  # the sub-processes are up
    finally:
        started = time.monotonic()
        controller.stop()
    # They ended on the stop signal, not by the kill at the end of the notice period (a long
    # one, so that a busy machine does not read as a kill).
    assert time.monotonic() - started < 30
    assert controller.status()['colo/0'].state is lp.NodeState.FINISHED


def return_at_once(counter):
    del counter


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
@pytest.mark.parametrize('mode', MODES)
def test_return_on_first_completed(mode, launch_type):
    program = lp.Program('first')
    program.add_node(lp.ColocationNode(
        [lp.PyNode(serve_forever, None), lp.PyNode(return_at_once, None)], mode=mode,
        return_on_first_completed=True), label='colo')
    controller = launch_and_wait(program, launch_type)
    assert controller.status()['colo/0'].state is lp.NodeState.FINISHED


def test_a_killed_process_colocation_leaves_no_directory():
    """SIGKILL of a process colocation's executable: its inner node ends (its parent is gone),
    and the colocation's directory (the inner nodes' specs and coordinator socket) goes too."""
    before = temp_dirs()
    program = lp.Program('killed')
    program.add_node(lp.ColocationNode([lp.PyNode(serve_forever, None)], mode='processes'),
                     label='colo')
    controller = lp.launch(program, launch_type='test_mp')
    try:
        assert wait_until(lambda: controller.status()['colo/0'].state is lp.NodeState.RUNNING,
                          timeout=60)
        colocation = psutil.Process(controller.status()['colo/0'].pid)
        assert wait_until(colocation.children, timeout=30)  # its inner node runs
        inner = colocation.children()
        colocation.kill()
        psutil.wait_procs(inner, timeout=30)
        assert not any(process.is_running() for process in inner)
        assert controller.wait(timeout=30, raise_error=False)  # (a failure ends the program)
    finally:
        controller.stop()
    assert 'killed by signal 9' in controller.status()['colo/0'].error
    assert not temp_dirs() - before
