"""lp.report and lp.count: what nodes report, checked, and seen by the launching process."""
from __future__ import annotations

import re
import threading

import pytest

import launchpad as lp

pytestmark = pytest.mark.timeout(60)


def test_reporting_outside_a_node_says_where_it_works():
    with pytest.raises(RuntimeError, match='inside a node of a launched program'):
        lp.report(loss=1.0)


def _run_in_a_node(function, *args):
    """Runs `function(*args)` as the only node of a local_mt program; returns its observer."""
    program = lp.Program('reporting')
    program.add_node(lp.PyNode(function, *args), label='node')
    controller = lp.launch(program, launch_type='test_mt')
    try:
        controller.wait(timeout=30)
    finally:
        controller.stop()
    return controller


@pytest.mark.parametrize('call, error, message', [
    (lambda: lp.report(**{'bad name': 1}), ValueError, r"letters, digits and _.*'bad_name'"),
    (lambda: lp.report(courier_calls=1), ValueError, 'courier_'),
    (lambda: lp.report(loss='high'), TypeError, 'values are numbers, got str'),
    (lambda: lp.count(episodes=-1), ValueError, 'counters only grow'),
    (lambda: (lp.report(steps=1), lp.count(steps=1)), ValueError,
     'either a gauge .lp.report. or a counter'),
])
def test_bad_reports_say_what_is_wrong_and_what_to_do(runtime_dir, call, error, message):
    del runtime_dir
    raised = []

    def node():
        try:
            call()
        except Exception as e:  # pylint: disable=broad-except
            raised.append(e)

    _run_in_a_node(node)
    assert len(raised) == 1 and isinstance(raised[0], error)
    assert re.search(message, str(raised[0]))


def test_values_of_threads_reach_the_observer(runtime_dir):
    del runtime_dir
    import numpy as np  # pylint: disable=import-outside-toplevel
    ready, done = threading.Event(), threading.Event()

    def node():
        lp.report(loss=np.float32(0.5), accuracy=0.9)
        lp.report(loss=0.25)
        lp.count(episodes=2)
        lp.count(episodes=1)
        ready.set()
        done.wait(30)

    program = lp.Program('threads')
    program.add_node(lp.PyNode(node), label='learner')
    controller = lp.launch(program, launch_type='test_mt')
    try:
        assert ready.wait(30)
        controller.observer._refresh()  # pylint: disable=protected-access  (no waiting a second)
        values = controller.observer.sample()['values']['learner/0']
        assert {name: (kind, value) for name, (kind, value, _) in values.items()} == {
            'loss': ('gauge', 0.25), 'accuracy': ('gauge', 0.9), 'episodes': ('counter', 3.0)}
        with pytest.raises(LookupError, match='threads'):
            controller.observer.logs('learner/0')  # threads print to this process's output
        with pytest.raises(LookupError, match="no node 'nobody'"):
            controller.observer.logs('nobody')
    finally:
        done.set()
        controller.stop()
