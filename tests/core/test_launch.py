"""Programs launched as threads and as processes (test_mt, test_mp) behave the same."""
import functools
import os
import tempfile
import threading
import time
import unittest

import pytest

import launchpad as lp

from tests.core.conftest import wait_until

LAUNCH_TYPES = ['test_mt', 'test_mp']


class Adder:
    def __init__(self, offset=0):
        self.offset = offset

    def add(self, x, y):
        return x + y + self.offset

    def whoami(self):
        context = lp.get_context()
        return context.launch_type, context.label, context.index, os.getpid()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_nodes_call_each_other_sync_and_with_futures(launch_type):
    program = lp.Program('calls')
    adder = program.add_node(lp.CourierNode(Adder, offset=10), label='adder')
    reports = program.add_node(lp.CourierNode(Reporter), label='reporter')
    program.add_node(lp.PyNode(call_and_report, adder, reports), label='caller')
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(timeout=60)
    status = controller.status()
    assert {name: s.state for name, s in status.items()} == {
        'adder/0': lp.NodeState.FINISHED, 'reporter/0': lp.NodeState.FINISHED,
        'caller/0': lp.NodeState.FINISHED}


class Reporter:
    """Checks what it is told and stops the program; a wrong value fails the program."""

    def report(self, sync_value, future_value, context):
        assert (sync_value, future_value) == (15, 19), (sync_value, future_value)
        assert context[1:3] == ('adder', 0), context
        lp.stop()


def call_and_report(adder, reporter):
    reporter.report(adder.add(2, 3), adder.futures.add(4, 5).result(), adder.whoami())


def fail_loudly():
    raise ValueError('the answer is not 42')


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_failing_node_ends_the_program_and_wait_names_it(launch_type):
    program = lp.Program('failing')
    program.add_node(lp.CourierNode(Adder), label='adder')
    with program.group('worker'):
        program.add_node(lp.PyNode(time.sleep, 0.01))
        program.add_node(lp.PyNode(fail_loudly))
    controller = lp.launch(program, launch_type=launch_type)
    with pytest.raises(lp.NodeFailedError) as caught:
        controller.wait(timeout=60)
    error = caught.value
    assert error.node_name == 'worker/1'
    assert 'ValueError: the answer is not 42' in str(error)
    assert 'fail_loudly' in error.remote_traceback
    assert controller.status()['adder/0'].state.ended


def stop_after(seconds, ready_dir=None, ready=()):
    """Stops the program after `seconds`, once the files `ready` are in `ready_dir` (the nodes
    that cooperate with the stop are ready for it: a node that has not yet registered its stop
    handler or waited for the stop when the stop comes ends at once)."""
    time.sleep(seconds)
    while ready_dir is not None and not all(os.path.exists(os.path.join(ready_dir, name))
                                            for name in ready):
        time.sleep(0.02)
    lp.stop()


class StopWatcher:
    """Serves until the program stops; its stop handler leaves a file behind."""

    def __init__(self, report_dir):
        self._report_dir = report_dir
        lp.register_stop_handler(self._on_stop)
        unregistered = functools.partial(report, report_dir, 'unregistered handler ran')
        lp.register_stop_handler(unregistered)
        lp.unregister_stop_handler(unregistered)
        report(os.path.join(report_dir, 'ready'), 'watcher')

    def _on_stop(self):
        assert lp.stop_event().is_set()
        report(self._report_dir, 'stop handler ran', lp.get_context().node_name)


def report(report_dir, what, detail=''):
    with open(os.path.join(report_dir, what), 'w') as f:
        f.write(detail)


def wait_then_report(report_dir):
    assert lp.wait_for_stop(timeout=0.01) is False
    report(os.path.join(report_dir, 'ready'), 'waiter')
    assert lp.wait_for_stop(timeout=30) is True
    report(report_dir, 'wait_for_stop returned')


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_lp_stop_from_a_node_stops_every_node_and_runs_handlers(launch_type, tmp_path):
    program = lp.Program('stopping')
    program.add_node(lp.CourierNode(StopWatcher, str(tmp_path)), label='watcher')
    program.add_node(lp.PyNode(wait_then_report, str(tmp_path)), label='waiter')
    (tmp_path / 'ready').mkdir()
    program.add_node(lp.PyNode(stop_after, 0.3, str(tmp_path / 'ready'), ['watcher', 'waiter']),
                     label='stopper')
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(timeout=60)
    assert all(s.state is lp.NodeState.FINISHED for s in controller.status().values())
    assert sorted(os.listdir(tmp_path)) == ['ready', 'stop handler ran', 'wait_for_stop returned']
    assert (tmp_path / 'stop handler ran').read_text() == 'watcher/0'


def ignore_stop(cooperates: str):
    lp.register_stop_handler(lambda: None)  # it cooperates, so it gets the notice period...
    open(cooperates, 'w').close()  # (a stop before this line would end it at once)
    while True:  # ...but never ends
        time.sleep(0.05)


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_stop_kills_nodes_that_ignore_it_after_the_notice_period(launch_type, tmp_path):
    program = lp.Program('stubborn')
    cooperates = tmp_path / 'cooperates'
    program.add_node(lp.PyNode(ignore_stop, str(cooperates)), label='stubborn')
    program.add_node(lp.CourierNode(Adder), label='server')
    controller = lp.launch(program, launch_type=launch_type, notice_period=0.5)
    assert wait_until(lambda: all(s.state is lp.NodeState.RUNNING
                                  for s in controller.status().values()), timeout=30)
    assert wait_until(cooperates.exists, timeout=30)
    started = time.monotonic()
    controller.stop()
    assert controller.done
    assert time.monotonic() - started < 30  # killed after the notice: the stop ended
    status = controller.status()
    assert status['server/0'].state is lp.NodeState.FINISHED
    assert status['stubborn/0'].state is lp.NodeState.KILLED


def exit_abruptly():
    os._exit(7)  # pylint: disable=protected-access


def test_a_process_that_dies_without_reporting_is_a_failure():
    program = lp.make_program(lp.PyNode(exit_abruptly), lp.CourierNode(Adder), name='abrupt')
    controller = lp.launch(program, launch_type='test_mp')
    with pytest.raises(lp.NodeFailedError, match='exit code 7'):
        controller.wait(timeout=60)


def test_unpicklable_arguments_fail_at_launch_naming_the_node():
    program = lp.Program('unpicklable')
    program.add_node(lp.PyNode(print, threading.Lock()), label='holder')
    with pytest.raises(lp.NodePicklingError, match=r'holder/0.*cannot be pickled.*lock'):
        lp.launch(program, launch_type='test_mp')
    # (no_leftovers checks that the failed launch left no process behind)


def mutate(shared):
    shared.append('changed by the node')


def test_serialize_py_nodes_gives_threads_copies():
    shared = []
    program = lp.make_program(lp.PyNode(mutate, shared))
    lp.launch(program, launch_type='test_mt', serialize_py_nodes=True).wait(timeout=30)
    assert shared == []
    lp.launch(lp.make_program(lp.PyNode(mutate, shared)), launch_type='test_mt').wait(timeout=30)
    assert shared == ['changed by the node']


class Ping:
    def __init__(self, peer=None):
        self._peer = peer

    def ping(self):
        return 'pong'

    def ping_peer(self):
        return self._peer.ping()


def ping_both(a, b):
    assert (a.ping_peer(), b.ping_peer()) == ('pong', 'pong')


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_configure_builds_cycles(launch_type):
    program = lp.Program('cycle')
    node_a, node_b = lp.CourierNode(Ping), lp.CourierNode(Ping)
    a = program.add_node(node_a, label='a')
    b = program.add_node(node_b, label='b')
    node_a.configure(peer=b)
    node_b.configure(peer=a)
    program.add_node(lp.PyNode(ping_both, a, b), label='main')
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(labels=['main'], timeout=60)
    assert controller.status()['main/0'].state is lp.NodeState.FINISHED
    controller.stop()


class Runs:
    def __init__(self):
        self.calls = 0

    def run(self):
        time.sleep(0.2)


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_courier_node_with_run_ends_when_run_returns(launch_type):
    program = lp.make_program(lp.CourierNode(Runs))
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(timeout=60)
    assert controller.status()['Runs/0'].state is lp.NodeState.FINISHED


class TestCaseIntegration(unittest.TestCase):

    def test_test_launch_registers_stop_as_cleanup(self):
        marks = tempfile.TemporaryDirectory()  # pylint: disable=consider-using-with
        self.addCleanup(marks.cleanup)  # (cleanups run last in, first out: after the stop)
        cooperates = os.path.join(marks.name, 'cooperates')
        program = lp.make_program(lp.PyNode(ignore_stop, cooperates))
        controller = lp.launch(program, launch_type='test_mp', test_case=self,
                               notice_period=0.2)
        self.assertFalse(controller.wait(timeout=0.2))
        self.assertTrue(wait_until(lambda: os.path.exists(cooperates), timeout=30))
        self.doCleanups()
        self.assertTrue(controller.done)
        self.assertIs(controller.status()['ignore_stop/0'].state, lp.NodeState.KILLED)


def test_python_process_env_reaches_the_group():
    program = lp.Program('env')
    program.add_node(lp.PyNode(check_env), label='worker')
    controller = lp.launch(program, launch_type='test_mp', local_resources={
        'worker': lp.PythonProcess(env={'LP_TEST_VALUE': 'from-resources'})})
    assert controller.wait(timeout=60)


def check_env():
    assert os.environ['LP_TEST_VALUE'] == 'from-resources'
    assert 'COURIER_AUTH_TOKEN' in os.environ


def test_get_context_outside_a_program_explains_itself():
    with pytest.raises(RuntimeError, match='only available inside a node'):
        lp.get_context()


def draw_random(report_dir):
    import numpy as np  # pylint: disable=import-outside-toplevel
    report(report_dir, f'draw_{lp.get_context().index}', repr(np.random.random_sample(4).tolist()))


def test_node_processes_do_not_share_random_state(tmp_path):
    program = lp.Program('random')
    with program.group('drawer'):
        for _ in range(3):
            program.add_node(lp.PyNode(draw_random, str(tmp_path)))
    assert lp.launch(program, launch_type='test_mp').wait(timeout=60)
    draws = {path.read_text() for path in tmp_path.iterdir()}
    assert len(draws) == 3


def warn_once():
    import warnings  # pylint: disable=import-outside-toplevel
    warnings.warn('this is an error under PYTHONWARNINGS=error')


def test_interpreter_environment_takes_effect():
    program = lp.Program('interpreter_env')
    program.add_node(lp.PyNode(warn_once), label='strict')
    program.add_node(lp.PyNode(warn_once), label='lenient')
    controller = lp.launch(program, launch_type='test_mp', local_resources={
        'strict': lp.PythonProcess(env={'PYTHONWARNINGS': 'error'})})
    with pytest.raises(lp.NodeFailedError, match='strict/0.*UserWarning'):
        controller.wait(timeout=60)
    assert controller.status()['lenient/0'].state is not lp.NodeState.FAILED


class WhoServes:
    def name(self):
        return lp.get_context().node_name


def ask_names(servers):
    assert [server.name() for server in servers] == ['server/0', 'server/1', 'server/2']


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_served_methods_see_their_own_node_context(launch_type):
    program = lp.Program('contexts')
    with program.group('server'):
        servers = [program.add_node(lp.CourierNode(WhoServes)) for _ in range(3)]
    program.add_node(lp.PyNode(ask_names, servers), label='asker')
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(labels=['asker'], timeout=60)
    controller.stop()


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp', 'test_mt', 'test_mp'])
def test_unknown_launch_options_are_refused_with_the_valid_ones(launch_type):
    program = lp.Program('options')
    program.add_node(lp.PyNode(print, 'never runs'), label='node')
    with pytest.raises(TypeError) as error:
        lp.launch(program, launch_type=launch_type, bogus_option=True)
    message = str(error.value)
    assert f"Unknown option(s) ['bogus_option'] for launch type {launch_type}" in message
    assert ('takes detach, supervisor_grace' if launch_type.endswith('_mp')
            else 'takes no options of its own') in message
    assert 'local_resources' in message and 'notice_period' in message  # lp.launch's own
    assert not program.launched


@pytest.mark.parametrize('launch_type', ['local_mt', 'test_mp'])
def test_detach_is_refused_where_the_program_ends_with_this_process(launch_type):
    program = lp.Program('detached')
    program.add_node(lp.PyNode(print, 'never runs'), label='node')
    with pytest.raises(ValueError, match=f'detach=True is not supported by the {launch_type} '
                                         'launcher: .*launch on local_mp'):
        lp.launch(program, launch_type=launch_type, detach=True)
    assert not program.launched


@pytest.mark.parametrize('options, error', [
    ({'supervisor_grace': 30}, 'supervisor_grace=30 applies to detached programs only'),
    ({'detach': True, 'supervisor_grace': -1}, 'supervisor_grace=-1 must be a positive number'),
])
def test_a_bad_supervisor_grace_is_refused_naming_it(options, error):
    program = lp.Program('grace')
    program.add_node(lp.PyNode(print, 'never runs'), label='node')
    with pytest.raises(ValueError, match=error):
        lp.launch(program, launch_type='local_mp', **options)
    assert not program.launched


def test_a_dashboard_of_a_detached_program_is_refused_saying_where_to_serve_it():
    program = lp.Program('dashboard')
    program.add_node(lp.PyNode(print, 'never runs'), label='node')
    with pytest.raises(ValueError, match='launchpad.launch dashboard PROGRAM'):
        lp.launch(program, launch_type='local_mp', detach=True, dashboard=True)
    assert not program.launched
