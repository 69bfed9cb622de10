"""What the failure tests of every launcher check about the programs of tests/failure_programs.py
once they ran (the programs themselves are there, importable by nodes)."""
from __future__ import annotations

import time

import pytest

import launchpad as lp


def failed_over_budget(controller, timeout: float = 90.0) -> lp.NodeFailedError:
    """Waits for `failure_program` to fail and checks how: dropped/0 was dropped and the program
    went on; hung/0 hung, was restarted, failed again and, over its budget, failed the program with
    both failures. Returns the error (platforms see the failures' details differently)."""
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=timeout)
    error = failure.value
    assert error.node_name == 'hung/0'
    assert 'failed 2 times: restarted 1 time, its policy allows 1 restart' in error.message
    assert len(error.failures) == 2
    status = controller.status()
    assert status['dropped/0'].state is lp.NodeState.DROPPED
    assert (status['hung/0'].state, status['hung/0'].restarts) == (lp.NodeState.FAILED, 1)
    assert status['steady/0'].state is lp.NodeState.FINISHED  # ended by the stop, not killed
    return error


def check_reported_hang(error: lp.NodeFailedError) -> None:
    """hung/0's failures as its nodes reported them: its stacks, then its second failure."""
    (first, stacks), (second, traceback_text) = error.failures
    assert first.startswith('hung: no progress for')
    assert 'in stuck_in_a_loop' in stacks and 'Thread ' in stacks
    assert second == 'RuntimeError: the second attempt fails too'
    assert 'in hang_then_fail' in traceback_text
    assert stacks in error.remote_traceback and traceback_text in error.remote_traceback


def stopped_promptly(controller, notice_period: float) -> None:
    """`stop_program` ended without a kill, well within its notice period after lp.stop()."""
    coordinator = controller._coordinator  # pylint: disable=protected-access
    assert controller.wait(timeout=90)
    took = time.monotonic() - coordinator.stop_time
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    assert took < notice_period / 4, f'{took:.1f} s from lp.stop() to the end'


def wait_for(predicate, timeout: float = 60.0) -> bool:
    """Whether `predicate()` became true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
