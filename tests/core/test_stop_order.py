"""The stop in graph order: callers hear the stop before the nodes they call, so a stop handler
that flushes to a server still finds it serving (the program is in tests/stop_programs.py)."""
import ctypes
import queue
import threading
import time

import pytest

import launchpad as lp
from tests import stop_programs
from tests.core.conftest import wait_until


@pytest.mark.parametrize('launch_type, colocate', [
    ('test_mt', False), ('test_mt', True), ('test_mp', False), ('test_mp', True)])
def test_dqn_stops_in_graph_order_and_nothing_is_killed(launch_type, colocate, tmp_path):
    """Acme's distributed DQN shape: the actors' stop handlers flush to the replay, which keeps
    serving until they have ended and their writers were freed; the learner, told after the
    actors, writes to the replay and raises SystemExit in its own thread, which waits in a queue
    (in a thread of local_mt, or in a thread colocation with the replay), and ends; the replay
    (colocated or not) and the counter last, and no node is killed."""
    record = tmp_path / 'flushed.txt'
    controller = lp.launch(stop_programs.dqn_program(str(record), colocate=colocate),
                           launch_type=launch_type, notice_period=30)
    assert controller.wait(timeout=120)
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    flushed, open_streams = record.read_text().split('\n')
    # every actor's last flush, and the learner's, reached the replay before it stopped
    assert flushed.split() == ['0', '1', '2', 'learner']
    # and every writer was freed with its node, closing its stream, before the replay stopped
    # (Reverb's server waits seconds for open streams)
    assert open_streams.split() == []


def wait_raising_system_exit_at_stop(record: str) -> None:
    """Acme's `runtime_terminator`: a stop handler raises SystemExit in the node's own thread
    (PyThreadState_SetAsyncExc), here while that thread waits on a queue that nothing fills,
    as Acme's learner waits for batches from a replay that the stopped actors no longer feed."""
    node_thread = threading.get_ident()

    def raise_system_exit_there() -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(node_thread),
                                                   ctypes.py_object(SystemExit))

    lp.register_stop_handler(raise_system_exit_there)
    try:
        open(f'{record}.waiting', 'w').close()  # (a stop before its handler would end it at once)
        queue.Queue().get()
    except SystemExit:
        with open(record, 'w') as f:
            f.write('SystemExit')


def test_a_stop_handler_s_exception_reaches_a_process_node_waiting_in_a_lock(tmp_path):
    """A process node's main thread waiting in a lock is woken after the stop handlers ran, so
    that the exception they raised in it lands and the node ends with the stop, not killed."""
    record = tmp_path / 'ended.txt'
    program = lp.Program('waiting')
    program.add_node(lp.PyNode(wait_raising_system_exit_at_stop, str(record)), label='learner')
    controller = lp.launch(program, launch_type='test_mp', notice_period=30)
    assert wait_until(lambda: (tmp_path / 'ended.txt.waiting').exists(), timeout=60)
    controller.stop()
    assert controller.wait(timeout=60)
    assert controller.status()['learner/0'].state is lp.NodeState.FINISHED
    assert record.read_text() == 'SystemExit'


def stop_the_program_then_sleep(record: str) -> None:
    """Acme's StepsLimiter: under Acme's `runtime_terminator` (a stop handler that raises
    SystemExit in the node's thread), it calls lp.stop(), then sleeps, which no exception
    interrupts in a thread."""
    node_thread = threading.get_ident()

    def raise_system_exit_there() -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(node_thread),
                                                   ctypes.py_object(SystemExit))

    def write_a_checkpoint() -> None:
        with open(record, 'a') as f:
            f.write('checkpoint ')

    lp.register_stop_handler(raise_system_exit_there)
    lp.register_stop_handler(write_a_checkpoint)
    try:
        lp.stop()
        time.sleep(120)
    except SystemExit:
        with open(record, 'a') as f:
            f.write('SystemExit')


def test_a_thread_node_that_stops_the_program_hears_the_stop_in_its_own_thread(tmp_path):
    """On local_mt a node that calls lp.stop() in its own thread (told at once, as nothing calls
    it) runs its stop handlers there, as its main thread would on local_mp: their SystemExit
    ends it inside lp.stop(), once every handler ran, not after the sleep that follows, which
    would outlast the notice period and get it killed."""
    record = tmp_path / 'ended.txt'
    program = lp.Program('limiter')
    program.add_node(lp.PyNode(stop_the_program_then_sleep, str(record)), label='limiter')
    controller = lp.launch(program, launch_type='test_mt', notice_period=5)
    assert controller.wait(timeout=60)
    assert controller.status()['limiter/0'].state is lp.NodeState.FINISHED
    assert record.read_text() == 'checkpoint SystemExit'


class CheckpointingCounter:
    """Acme's counter as its checkpointing runner serves it: its run() sleeps between checkpoints
    (Acme's a second at a time, here an hour, so that a sleep nothing wakes outlasts the notice
    period), and its stop handler writes the last checkpoint, then raises SystemExit in the
    node's thread (`runtime_terminator`), where it lands only once the sleep is over."""

    def __init__(self, record: str):
        self._record = record
        self._count = 0

    def increment(self) -> int:
        self._count += 1
        return self._count

    def run(self) -> None:
        node_thread = threading.get_ident()

        def terminate() -> None:
            with open(self._record, 'a') as f:
                f.write('checkpoint ')
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(node_thread),
                                                       ctypes.py_object(SystemExit))

        lp.register_stop_handler(terminate)
        with open(self._record, 'a') as f:
            f.write('running ')
        try:
            while True:
                time.sleep(3600)
        except SystemExit:
            with open(self._record, 'a') as f:
                f.write('SystemExit')


def count_until_stopped(counter) -> None:
    """A caller of the counter (Acme's learner): it ends at the stop, before the counter is told."""
    counter.increment()
    lp.wait_for_stop()


@pytest.mark.parametrize('launch_type, colocate', [('test_mt', False), ('test_mp', True)])
def test_a_node_thread_sleeping_under_its_stop_handler_s_system_exit_ends_with_the_stop(
        launch_type, colocate, tmp_path):
    """Acme's counter in a thread (local_mt, or an inner thread of a thread colocation, next to
    a node that calls it) sleeps when its stop handler raises SystemExit there: the sleep is
    woken, so the counter ends with the stop rather than being killed at the end of the notice
    period, and after its caller (graph order)."""
    record = tmp_path / 'counter.txt'
    program = lp.Program('sleeping_counter')
    counter_node = lp.CourierNode(CheckpointingCounter, str(record))
    caller_node = lp.PyNode(count_until_stopped, counter_node.create_handle())
    if colocate:
        program.add_node(lp.MultiThreadingColocation([caller_node, counter_node]), label='learner')
    else:
        program.add_node(counter_node, label='counter')
        program.add_node(caller_node, label='learner')
    controller = lp.launch(program, launch_type=launch_type, notice_period=10)
    assert wait_until(lambda: record.exists() and record.read_text() == 'running ', timeout=60)
    controller.stop()
    assert controller.wait(timeout=60)
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    assert record.read_text() == 'running checkpoint SystemExit'


_ANSWER = threading.Event()  # the silent server's calls return once it is set


class SilentServer:
    """A server whose calls do not answer until it is told of the stop (after its callers
    have ended, in graph order); its stop handler records when that is."""

    def __init__(self, record: str):
        self._record = record
        lp.register_stop_handler(self._told)

    def _told(self) -> None:
        with open(self._record, 'a') as f:
            f.write('server told')
        _ANSWER.set()

    def never(self) -> None:
        open(f'{self._record}.called', 'w').close()
        _ANSWER.wait(120)


def wait_for_an_answer(server, record: str, how: str) -> None:
    """A caller that waits without a timeout for a call that does not answer (in
    `future.result()`, or in a blocking call) and does not cooperate with the stop: NodeStopped,
    raised in its thread, ends it."""
    try:
        if how == 'future':
            server.futures.never().result()
        else:
            server.never()
    except BaseException as error:
        with open(record, 'a') as f:
            f.write(f'{type(error).__name__} ')
        raise


@pytest.mark.parametrize('launch_type, how, colocate', [
    ('test_mt', 'future', False), ('test_mt', 'call', False), ('test_mp', 'future', True)])
def test_a_node_thread_waiting_for_a_call_ends_with_the_stop(launch_type, how, colocate,
                                                            tmp_path):
    """A thread node (local_mt, or an inner node of a thread colocation on a thread of its own)
    that waits for a call to a server of its process is woken at the stop, so that the NodeStopped
    raised in it lands there: it ends before the server is told of the stop, and is not killed
    (without the wake it ended only once the server, told after it was abandoned, answered)."""
    record = tmp_path / 'ended.txt'
    program = lp.Program('silent')
    server_node = lp.CourierNode(SilentServer, str(record))
    caller_node = lp.PyNode(wait_for_an_answer, server_node.create_handle(), str(record), how)
    if colocate:  # (the idle node runs on the colocation's thread, the caller on one of its own)
        program.add_node(lp.MultiThreadingColocation(
            [lp.PyNode(lp.wait_for_stop), caller_node, server_node]), label='colocated')
    else:
        program.add_node(server_node, label='server')
        program.add_node(caller_node, label='caller')
    _ANSWER.clear()
    controller = lp.launch(program, launch_type=launch_type, notice_period=30)
    try:
        assert wait_until(lambda: (tmp_path / 'ended.txt.called').exists(), timeout=60)
        controller.stop()
        assert controller.wait(timeout=60)
    finally:
        _ANSWER.set()
        controller.stop()  # (done already, unless the test failed before)
        controller.wait(timeout=60)
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    assert record.read_text() == 'NodeStopped server told'


def start_threads_until_stopped(ready: str) -> None:
    """A node thread that starts threads all the time, as one whose calls to a server of its
    process start the server's workers, and does not cooperate with the stop."""
    open(ready, 'w').close()
    while True:
        thread = threading.Thread(target=lambda: None, daemon=True)
        thread.start()
        thread.join()


@pytest.mark.parametrize('launch_type, colocate', [('test_mt', False), ('test_mp', True)])
def test_a_node_thread_stopped_while_it_starts_a_thread_ends_with_the_stop(
        launch_type, colocate, tmp_path):
    """NodeStopped, raised in a node's thread (local_mt's, or a thread colocation's process main
    thread) while it starts a thread, ends the node, and not the thread it starts: that one would
    end before it reported that it started, and the node, waiting for that in `Thread.start`,
    would be killed (before the fix, in most rounds)."""
    for round_ in range(3):
        ready = tmp_path / f'ready{round_}'
        program = lp.Program('starter')
        starter = lp.PyNode(start_threads_until_stopped, str(ready))
        if colocate:
            starter = lp.MultiThreadingColocation([starter, lp.PyNode(lp.wait_for_stop)])
        program.add_node(starter, label='starter')
        controller = lp.launch(program, launch_type=launch_type, notice_period=30)
        assert wait_until(ready.exists, timeout=60)
        controller.stop()
        assert controller.wait(timeout=60)
        assert controller.status()['starter/0'].state is lp.NodeState.FINISHED, round_
