"""Supervision: a group's `lp.GroupClient` says why each member left, and a node that supervises
the group takes over its members' failures (replaces a member, resizes, or fails the program)."""
import json
import os

import pytest

import launchpad as lp

LAUNCH_TYPES = ['test_mt', 'test_mp']


def member(index: int, supervised: str) -> None:
    """worker/0 fails in each run (its owner replaces it once, then fails the program, once
    worker/1 has left); worker/1 runs until removed; worker/2 fails and is dropped by its
    policy; worker/3 returns."""
    context = lp.get_context()
    if index == 0:
        while not os.path.exists(supervised):  # the owner has taken over
            lp.wait_for_stop(0.05)
        if context.attempt == 1:
            while not context.coordinator.has_left('worker/1'):
                lp.wait_for_stop(0.05)
        raise ValueError(f'worker 0 failed in run {context.attempt}')
    if index == 1:
        lp.wait_for_stop()
    elif index == 2:
        raise KeyError('dropped on purpose')


def owner(workers, record: str, supervised: str) -> None:
    """Takes over the workers' failures: replaces worker/0 at its first failure, shrinks the
    group once worker/2 and worker/3 ended too, and fails the program at worker/0's second."""
    workers.supervise()
    open(supervised, 'w').close()
    seen = []
    while True:
        for event in workers.events(timeout=None):
            seen.append([event.name, event.reason, event.error, event.attempt,
                         'Traceback' in event.traceback])
            with open(record, 'w') as f:
                json.dump(seen, f)
            if event.reason == 'failed' and event.attempt == 0:
                workers.replace(event.name)
        reasons = sorted(reason for _, reason, *_ in seen)
        if reasons == ['dropped', 'failed', 'finished']:  # worker/0 and /1 run: the newest,
            lp.resize('worker', 1)  # worker/1, leaves
        elif reasons == ['dropped', 'failed', 'failed', 'finished', 'removed']:
            workers.fail('worker/0')
            return


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_an_owner_hears_why_members_left_and_decides_on_their_failures(launch_type, tmp_path):
    record, supervised = tmp_path / 'events.json', str(tmp_path / 'supervised')
    program = lp.Program('supervised')
    with program.group('worker'):
        program.add_node(lp.PyNode(member, 0, supervised))
        program.add_node(lp.PyNode(member, 1, supervised))
        program.add_node(lp.PyNode(member, 2, supervised),
                         restart=lp.RestartPolicy(max_restarts=0, on_failure='drop'))
        program.add_node(lp.PyNode(member, 3, supervised))
    program.add_node(lp.PyNode(owner, program.group_handle('worker'), str(record),
                               supervised),
                     label='owner')
    controller = lp.launch(program, launch_type=launch_type)
    with pytest.raises(lp.NodeFailedError) as failure:  # the owner failed it, with worker 0's
        controller.wait(timeout=120)
    assert failure.value.node_name == 'worker/0'
    assert 'ValueError: worker 0 failed in run 1' in failure.value.message
    assert len(failure.value.failures) == 2  # both runs' failures, with their tracebacks
    events = sorted(json.loads(record.read_text()))
    assert events == [
        ['worker/0', 'failed', 'ValueError: worker 0 failed in run 0', 0, True],
        ['worker/0', 'failed', 'ValueError: worker 0 failed in run 1', 1, True],
        ['worker/1', 'removed', None, 0, False],
        ['worker/2', 'dropped', "KeyError: 'dropped on purpose'", 0, True],
        ['worker/3', 'finished', None, 0, False]]
    status = controller.status()
    assert status['worker/0'].restarts == 1 and status['owner/0'].state is lp.NodeState.FINISHED


def test_settling_a_failure_that_was_not_taken_over_is_refused():
    from launchpad.process.coordinator import Coordinator  # pylint: disable=import-outside-toplevel
    coordinator = Coordinator(['worker/0', 'owner/0'])
    with pytest.raises(ValueError, match='worker/0 is pending: only a member whose failure'):
        coordinator.settle_failure('worker/0', 'replace')
    with pytest.raises(ValueError, match="'replace' or 'fail', not 'retry'"):
        coordinator.settle_failure('worker/0', 'retry')
