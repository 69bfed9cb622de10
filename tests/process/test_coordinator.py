"""The coordinator's state machine, without any process: how reports move a node through its
states, which failure ends the program (or restarts or drops the node, as its policy says), and
how stop, exits and kills are recorded."""
import pickle
import threading
import time

import pytest

from launchpad import runtime
from launchpad.nodes.group import GroupClient
from launchpad.policy import NodePolicy, RestartBudget, RestartPolicy
from launchpad.process.coordinator import (Coordinator, NodeFailedError, NodeState,
                                           run_reporting)


def test_a_node_goes_from_pending_to_running_to_finished():
    coordinator = Coordinator(['a/0', 'b/0'])
    assert coordinator.status()['a/0'].state is NodeState.PENDING
    coordinator.node_started('a/0', 123, 'host-1')
    status = coordinator.status()['a/0']
    assert (status.state, status.pid, status.host) == (NodeState.RUNNING, 123, 'host-1')
    coordinator.node_finished('a/0')
    assert coordinator.status()['a/0'].state is NodeState.FINISHED
    assert coordinator.running() == ['b/0']
    assert not coordinator.stopping and coordinator.failure is None


def test_the_first_failure_stops_the_program_and_is_the_one_reported():
    coordinator = Coordinator(['a/0', 'b/0'])
    coordinator.node_failed('a/0', 'ValueError: bad', 'Traceback: a')
    coordinator.node_failed('b/0', 'KeyError: worse', 'Traceback: b')
    assert coordinator.stopping
    assert coordinator.stop_reason == 'node a/0 failed'
    assert isinstance(coordinator.failure, NodeFailedError)
    assert coordinator.failure.node_name == 'a/0'
    assert 'Traceback: a' in str(coordinator.failure)
    assert {name: s.state for name, s in coordinator.status().items()} == {
        'a/0': NodeState.FAILED, 'b/0': NodeState.FAILED}
    assert coordinator.status()['b/0'].error == 'KeyError: worse'


def test_a_failure_after_a_stop_is_recorded_but_does_not_fail_the_program():
    coordinator = Coordinator(['a/0'])
    coordinator.request_stop('user asked')
    coordinator.node_failed('a/0', 'RuntimeError: while stopping')
    assert coordinator.failure is None
    assert coordinator.status()['a/0'].state is NodeState.FAILED
    assert coordinator.stop_reason == 'user asked'


def test_the_stop_reason_and_time_are_set_once():
    coordinator = Coordinator(['a/0'])
    assert coordinator.stop_time is None
    coordinator.request_stop('first')
    first_time = coordinator.stop_time
    coordinator.request_stop('second')
    assert (coordinator.stop_reason, coordinator.stop_time) == ('first', first_time)


def test_wait_for_stop_returns_when_another_thread_stops_the_program():
    coordinator = Coordinator(['a/0'])
    assert coordinator.wait_for_stop(0.01) is False
    threading.Timer(0.05, coordinator.request_stop, ('later',)).start()
    assert coordinator.wait_for_stop(5.0) is True


@pytest.mark.parametrize('exit_code, stopping, state', [
    (0, False, NodeState.FINISHED),
    (1, False, NodeState.FAILED),
    (-9, False, NodeState.FAILED),
    (-9, True, NodeState.KILLED),
    (0, True, NodeState.FINISHED),
])
def test_an_exit_without_a_report_is_judged_by_its_code(exit_code, stopping, state):
    coordinator = Coordinator(['a/0'])
    coordinator.node_started('a/0', 1, 'h')
    if stopping:
        coordinator.request_stop('stop')
    coordinator.executable_exited('a/0', exit_code)
    status = coordinator.status()['a/0']
    assert (status.state, status.exit_code) == (state, exit_code)
    if state is NodeState.FAILED:
        detail = 'killed by signal 9' if exit_code < 0 else f'exit code {exit_code}'
        assert detail in coordinator.failure.message


def test_an_exit_after_a_report_keeps_the_reported_state():
    coordinator = Coordinator(['a/0'])
    coordinator.node_failed('a/0', 'ValueError: x')
    coordinator.executable_exited('a/0', 1)
    assert coordinator.status()['a/0'].state is NodeState.FAILED
    assert coordinator.failure.message == 'ValueError: x'


def test_mark_killed_only_touches_nodes_that_have_not_ended():
    coordinator = Coordinator(['a/0', 'b/0'])
    coordinator.node_finished('a/0')
    coordinator.mark_killed(['a/0', 'b/0'])
    states = {name: s.state for name, s in coordinator.status().items()}
    assert states == {'a/0': NodeState.FINISHED, 'b/0': NodeState.KILLED}


def test_published_addresses_are_found_and_missing_ones_time_out():
    coordinator = Coordinator(['a/0'])
    threading.Timer(0.05, coordinator.publish_address, ('id1', '10.0.0.2:4000')).start()
    assert coordinator.lookup_address('id1', 5.0) == '10.0.0.2:4000'
    started = time.monotonic()
    assert coordinator.lookup_address('id2', 0.05) is None
    assert time.monotonic() - started >= 0.05


def test_status_is_a_copy_and_unknown_nodes_are_refused():
    coordinator = Coordinator(['a/0'])
    coordinator.status()['a/0'].state = NodeState.FINISHED
    assert coordinator.status()['a/0'].state is NodeState.PENDING
    with pytest.raises(KeyError, match="'x/0' is not a node of this program"):
        coordinator.node_started('x/0', 1, 'h')


def test_run_reporting_reports_how_the_executable_ended():
    coordinator = Coordinator(['ok/0', 'raises/0', 'exit0/0', 'exit2/0'])

    def raises():
        raise ValueError('broken')

    def exits(code):
        raise SystemExit(code)

    assert run_reporting(lambda: None, 'ok/0', coordinator) == 0
    assert run_reporting(raises, 'raises/0', coordinator) == 1
    assert run_reporting(lambda: exits(0), 'exit0/0', coordinator) == 0
    assert run_reporting(lambda: exits(2), 'exit2/0', coordinator) == 1
    status = coordinator.status()
    assert status['ok/0'].state is NodeState.FINISHED
    assert status['exit0/0'].state is NodeState.FINISHED
    assert status['raises/0'].error == 'ValueError: broken'
    assert 'raise ValueError' in coordinator.failure.remote_traceback
    assert status['exit2/0'].error == 'SystemExit(2)'


# --- Restart policies -------------------------------------------------------------------------

def test_a_failure_within_the_budget_restarts_the_node_after_its_backoff():
    policy = RestartPolicy(max_restarts=2, backoff=0.5, max_backoff=0.8)
    coordinator = Coordinator(['a/0', 'b/0'], policies={'a/0': NodePolicy(policy)})
    assert coordinator.node_started('a/0', 1, 'h') == 0
    before = time.monotonic()  # the backoff counts from the failure, between before and after
    coordinator.node_failed('a/0', 'ValueError: once', 'tb 1')
    after = time.monotonic()
    coordinator.executable_exited('a/0', 1)  # reported already: not a second failure
    assert coordinator.status()['a/0'].state is NodeState.RESTARTING
    assert not coordinator.stopping and coordinator.restarts_pending
    assert coordinator.due_restarts(before + 0.49) == []  # the backoff
    assert coordinator.due_restarts(after + 0.5) == ['a/0']
    coordinator.node_restarted('a/0')
    status = coordinator.status()['a/0']
    assert (status.state, status.restarts, status.exit_code) == (NodeState.PENDING, 1, None)
    assert coordinator.node_started('a/0', 2, 'h') == 1  # the attempt the node sees
    before = time.monotonic()
    coordinator.node_failed('a/0', 'ValueError: twice', 'tb 2')
    after = time.monotonic()
    coordinator.executable_exited('a/0', 1)
    assert coordinator.due_restarts(before + 0.79) == []  # doubled, up to 0.8 s
    assert coordinator.due_restarts(after + 0.8) == ['a/0']
    coordinator.node_restarted('a/0')
    coordinator.node_started('a/0', 3, 'h')
    coordinator.executable_exited('a/0', -9)  # died without reporting: the third failure
    assert coordinator.stopping  # over the budget: the program fails, with all three failures
    failure = coordinator.failure
    assert failure.node_name == 'a/0'
    assert [message for message, _ in failure.failures] == [
        'ValueError: once', 'ValueError: twice', failure.failures[2][0]]
    assert 'killed by signal 9' in failure.message
    assert 'restarted 2 times, its policy allows 2 restarts within 600 s' in failure.message
    assert 'tb 1' in failure.remote_traceback and 'tb 2' in failure.remote_traceback


def test_restarts_are_counted_within_the_window():
    budget = RestartBudget(RestartPolicy(max_restarts=1, window=10.0, backoff=1.0))
    assert budget.next_delay(100.0) == 1.0
    assert budget.next_delay(105.0) is None  # one restart within 10 s already
    assert budget.next_delay(111.0) == 1.0  # the first has left the window
    assert RestartBudget(None).next_delay(0.0) is None


def test_the_backoff_doubles_only_for_failures_in_a_row():
    """A node that ran for `max_backoff` s or more before it failed is not in a crash loop: it
    starts again after `backoff`, however often it was restarted before (within its budget)."""
    budget = RestartBudget(RestartPolicy(max_restarts=10, window=None, backoff=0.1,
                                         max_backoff=0.5))
    assert budget.next_delay(0.0, ran=0.2) == 0.1
    assert budget.next_delay(1.0, ran=0.2) == 0.2  # failed soon after its restart: doubled
    assert budget.next_delay(2.0, ran=None) == 0.4  # failed before it ran
    assert budget.next_delay(3.0, ran=0.3) == 0.5
    assert budget.next_delay(30.0, ran=20.0) == 0.1  # it ran well: in a row no more
    assert budget.next_delay(31.0, ran=0.1) == 0.2
    assert budget.next_delay(90.0, ran=0.5) == 0.1


def test_a_node_that_ran_well_before_it_failed_restarts_after_the_first_backoff(monkeypatch):
    """The coordinator measures how long the failed instance ran, from its start."""
    clock = [1000.0]
    monkeypatch.setattr(time, 'monotonic', lambda: clock[0])
    policy = RestartPolicy(max_restarts=10, window=None, backoff=1.0, max_backoff=4.0)
    coordinator = Coordinator(['a/0'], policies={'a/0': NodePolicy(policy)})
    waits = []
    for ran in (0.5, 0.5, 10.0, 0.5):
        coordinator.node_started('a/0', 1, 'h')
        clock[0] += ran
        coordinator.node_failed('a/0', 'ValueError: again')
        coordinator.executable_exited('a/0', 1)
        failed_at = clock[0]
        while not coordinator.due_restarts(clock[0]):
            clock[0] += 0.25
        waits.append(clock[0] - failed_at)
        coordinator.node_restarted('a/0')
    assert waits == [1.0, 2.0, 1.0, 2.0]


def test_a_dropped_node_ends_and_the_program_goes_on():
    policy = NodePolicy(RestartPolicy(max_restarts=0, on_failure='drop'))
    coordinator = Coordinator(['a/0', 'b/0'], policies={'a/0': policy})
    coordinator.node_failed('a/0', 'ValueError: gone', 'tb')
    assert coordinator.status()['a/0'].state is NodeState.DROPPED
    assert not coordinator.stopping and coordinator.failure is None
    assert coordinator.running() == ['b/0']


def test_a_stop_ends_the_restarts_and_a_node_that_cannot_restart_fails():
    policy = NodePolicy(RestartPolicy(max_restarts=5, backoff=0.0))
    coordinator = Coordinator(['a/0', 'b/0'], policies={'a/0': policy, 'b/0': policy})
    coordinator.node_failed('a/0', 'ValueError: a', 'tb a')
    coordinator.node_finished('a/0')  # a failed instance cannot finish too
    assert coordinator.status()['a/0'].state is NodeState.RESTARTING
    coordinator.restart_failed('a/0', 'the job has ended')
    assert coordinator.failure.node_name == 'a/0'
    assert coordinator.failure.message == 'ValueError: a (and it could not be restarted: the job ' \
                                          'has ended)'
    coordinator.node_failed('b/0', 'ValueError: b')
    assert coordinator.status()['b/0'].state is NodeState.FAILED  # stopping: no restart
    assert not coordinator.restarts_pending


def test_a_stop_cancels_a_pending_restart_without_failing_the_program():
    policy = NodePolicy(RestartPolicy(max_restarts=5, backoff=60.0))
    coordinator = Coordinator(['a/0', 'b/0'], policies={'a/0': policy})
    coordinator.node_failed('a/0', 'ValueError: a', 'tb a')
    assert coordinator.status()['a/0'].state is NodeState.RESTARTING
    coordinator.request_stop('stopped by the launcher')
    status = coordinator.status()['a/0']
    assert (status.state, status.error) == (NodeState.KILLED, 'ValueError: a')
    assert coordinator.failure is None and not coordinator.restarts_pending


def test_nodes_join_and_leave_a_group_and_its_members_follow():
    coordinator = Coordinator(['actor/0', 'learner/0'])
    coordinator.set_node_addresses({'actor/0': ['a0'], 'learner/0': []})
    assert coordinator.members('actor') == []  # not running yet
    coordinator.node_started('actor/0', 1, 'h')
    assert coordinator.members('actor') == [('actor/0', ['a0'])]
    coordinator.add_nodes(['actor/1'])
    coordinator.set_node_addresses({'actor/1': ['a1']})
    changed = []
    waiter = threading.Thread(target=lambda: changed.append(coordinator.wait_for_members(
        'actor', [('actor/0', ['a0'])], 10.0)))
    waiter.start()
    coordinator.node_started('actor/1', 2, 'h')
    waiter.join()
    assert changed == [[('actor/0', ['a0']), ('actor/1', ['a1'])]]
    assert not coordinator.wait_for_stop(0.0, 'actor/1')
    coordinator.remove_node('actor/1')
    assert coordinator.wait_for_stop(0.0, 'actor/1') and not coordinator.wait_for_stop(0.0)
    assert coordinator.members('actor') == [('actor/0', ['a0'])]  # it leaves at once
    assert coordinator.has_left('actor/1') and not coordinator.has_left('actor/0')
    coordinator.node_failed('actor/1', 'ConnectionError: on its way out')
    assert coordinator.status()['actor/1'].state is NodeState.REMOVED  # not a failure
    assert not coordinator.stopping and coordinator.failure is None
    with pytest.raises(KeyError, match='already a node'):
        coordinator.add_nodes(['actor/1'])


def test_a_restored_coordinator_keeps_the_members_a_client_saw_until_they_report_again():
    """A detached program's new supervisor restores the coordinator from the state its
    predecessor persisted, which may predate a node's report that it runs (worker/1's): until
    the node tells it again, a client that saw it as a member keeps it (it did not leave); one
    that did not see it does not get it, and a member that really leaves meanwhile leaves."""
    coordinator = Coordinator(['worker/0', 'caller/0'])
    coordinator.set_node_addresses({'worker/0': ['w0'], 'caller/0': []})
    coordinator.node_started('worker/0', 1, 'h')
    coordinator.add_nodes(['worker/1', 'worker/2'], policies={
        'worker/2': NodePolicy(RestartPolicy(max_restarts=1, backoff=0.0))})
    coordinator.set_node_addresses({'worker/1': ['w1'], 'worker/2': ['w2']})
    persisted = pickle.dumps(coordinator)  # before the steps of worker/1 and worker/2 start
    coordinator.node_started('worker/1', 2, 'h')
    coordinator.node_started('worker/2', 3, 'h')
    seen = coordinator.members('worker')
    assert seen == [('worker/0', ['w0']), ('worker/1', ['w1']), ('worker/2', ['w2'])]

    restored = pickle.loads(persisted)  # worker/1 and worker/2 have not told it yet
    assert restored.wait_for_members('worker', seen, 0.0) == seen
    assert restored.wait_for_members('worker', seen[:1], 0.0) == seen[:1]  # (never saw them)
    restored.node_started('worker/1', 2, 'h')  # told again
    assert restored.wait_for_members('worker', seen, 0.0) == seen
    # worker/2 dies before it told the new supervisor: it left, and it is no member again
    # until its next start reports.
    restored.executable_exited('worker/2', 1)
    assert restored.wait_for_members('worker', seen, 0.0) == seen[:2]
    restored.node_restarted('worker/2')
    assert restored.status()['worker/2'].state is NodeState.PENDING
    assert restored.wait_for_members('worker', seen, 0.0) == seen[:2]
    restored.remove_node('worker/1')  # leaves at once
    assert restored.wait_for_members('worker', seen, 0.0) == seen[:1]


def test_a_group_client_keeps_the_members_it_saw_across_a_restore():
    """`lp.GroupClient.names()` asks with the members it saw: a restored coordinator that has
    not heard from worker/1 again keeps it for that client (and for its next wait)."""
    coordinator = Coordinator(['worker/0', 'worker/1'])
    coordinator.set_node_addresses({'worker/0': [], 'worker/1': []})  # (PyNodes: no clients)
    coordinator.node_started('worker/0', 1, 'h')
    persisted = pickle.dumps(coordinator)  # before worker/1 reports
    coordinator.node_started('worker/1', 2, 'h')
    context = runtime.NodeContext('local_mp', 'p', 'caller', 0, None,
                                  runtime.StopSignal(lambda reason: None), coordinator)
    runtime.set_thread_context(context)
    try:
        workers = GroupClient('worker')
        assert workers.names() == ['worker/0', 'worker/1']
        context.coordinator = pickle.loads(persisted)
        assert workers.names() == ['worker/0', 'worker/1']
        assert not workers.wait_for_change(timeout=0)
    finally:
        runtime.set_thread_context(None)


def test_size_requests_are_taken_once():
    coordinator = Coordinator(['actor/0'])
    coordinator.request_size('actor', 4)
    coordinator.request_size('actor', 6)
    assert coordinator.take_size_requests() == {'actor': 6}
    assert coordinator.take_size_requests() == {}
    with pytest.raises(ValueError, match='int >= 0'):
        coordinator.request_size('actor', -1)
    coordinator.request_stop()
    with pytest.raises(RuntimeError, match='stopping'):
        coordinator.add_nodes(['actor/1'])


def test_closed_probes_end_the_waits_in_flight_and_answer_later_ones_at_once():
    """Once no node runs, the launcher closes the probes: a gone node's long poll, which would
    hold the coordinator's server as it stops, returns; a probe gets what is known, unanswered."""
    coordinator = Coordinator(['a/0'])
    returned = []
    waiter = threading.Thread(target=lambda: returned.append(
        coordinator.wait_for_probe('a/0', {'stacks': 'main', 'taken': 1.0}, timeout=30.0)))
    waiter.start()
    time.sleep(0.2)  # the node's probe thread waits for a question
    coordinator.close_probes()
    waiter.join(10.0)
    assert not waiter.is_alive() and returned == [[]]
    assert coordinator.wait_for_probe('a/0', None, timeout=30.0) == []
    answer = coordinator.probe(['a/0'], ['stacks'], timeout=30.0)['a/0']
    assert (answer['live'], answer['stacks']) == (False, 'main')
