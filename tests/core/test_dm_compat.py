"""Code written for dm-launchpad, as its documentation shows it, runs here unchanged (issue 19).

Each test uses only what dm-launchpad's users write: `lp.launch(..., test_case=self)` and a handle
dereferenced from the test, `lp.context`, the controller's keywords, `PyNode.allocate_address`,
several programs in one `lp.launch`, functions of the script wrapped in `functools.lru_cache`.
"""
import os
import pickle
import re
import threading
import unittest

import pytest

import courier
import launchpad as lp

from tests.core.conftest import run_script
from tests.core.test_launch import fail_loudly

LAUNCH_TYPES = ['test_mt', 'test_mp']


class Producer:
    def work(self, context):
        return context

    def launch_type(self):
        return lp.get_context().launch_type


class Consumer:
    def __init__(self, producers):
        self._producers = producers

    def run(self):
        raise AssertionError('disable_run() was called: the test steps the consumer itself')

    def step(self):
        return [future.result() for future in
                [producer.futures.work(i) for i, producer in enumerate(self._producers)]]


def consumer_producers():
    program = lp.Program('consumer_producers')
    with program.group('producer'):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(2)]
    program.add_node(lp.CourierNode(Consumer, producers=producers), label='consumer')
    return program, producers


class TestCasePattern(unittest.TestCase):
    """dm-launchpad's documented integration test: launch with test_case=self, then talk to a
    node through its handle from the test."""

    def check_the_test_talks_to_nodes(self, launch_type):
        program, producers = consumer_producers()
        (consumer_node,) = program.groups['consumer']
        consumer_node.disable_run()
        lp.launch(program, launch_type=launch_type, test_case=self)
        consumer = consumer_node.create_handle().dereference()
        for _ in range(3):
            self.assertEqual(consumer.step(), [0, 1])
        producer = producers[0].dereference()
        self.assertIs(producer.launch_type(), lp.LaunchType(launch_type))
        self.assertEqual(producer.launch_type().value, launch_type)

    def test_threads(self):
        self.check_the_test_talks_to_nodes('test_mt')

    def test_processes(self):
        self.check_the_test_talks_to_nodes('test_mp')


def test_the_context_module():
    assert lp.context.LaunchType is lp.LaunchType
    assert lp.context.get_context is lp.get_context
    assert lp.context.is_local_launch(lp.context.LaunchType.LOCAL_MULTI_PROCESSING)
    assert lp.LaunchType.TEST_MULTI_PROCESSING == 'test_mp'
    assert {'test_mp': 1}[lp.LaunchType.TEST_MULTI_PROCESSING] == 1
    with pytest.raises(RuntimeError, match='No launchpad program is running here'):
        lp.context.get_context()


def return_quickly():
    pass


def block():
    lp.wait_for_stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_wait_takes_dm_launchpads_keywords(launch_type):
    program = lp.Program('waiting')
    program.add_node(lp.PyNode(return_quickly), label='quick')
    program.add_node(lp.PyNode(block), label='daemon')
    controller = lp.launch(program, launch_type=launch_type)
    try:
        assert controller.wait(labels_to_wait_for=['quick'])
        assert controller.wait(return_on_first_completed=True)
        assert not controller.status()['daemon/0'].state.ended
    finally:
        controller.stop_and_wait()
    assert controller.done
    assert controller.status()['daemon/0'].state is lp.NodeState.FINISHED


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_wait_can_leave_a_failure_unraised(launch_type):
    program = lp.Program('failing')
    program.add_node(lp.PyNode(fail_loudly), label='failing')
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(raise_error=False)
    with pytest.raises(lp.NodeFailedError, match='the answer is not 42'):
        controller.wait()
    controller.stop_and_wait()  # a failed program stops and waits without raising


def test_several_programs_in_one_launch(tmp_path):
    programs = []
    for name in ('first', 'second'):
        program = lp.Program(name)
        program.add_node(lp.PyNode(write_file, str(tmp_path / name)), label=name)
        programs.append(program)
    controllers = lp.launch(programs, launch_type='test_mp',
                            local_resources={'second': lp.PythonProcess(env={'WHICH': '2'})})
    assert controllers.wait(timeout=60)
    assert [controller.program_name for controller in controllers] == ['first', 'second']
    assert sorted(os.listdir(tmp_path)) == ['first', 'second']
    assert (tmp_path / 'second').read_text() == '2'
    with pytest.raises(TypeError, match='lp.Program or a sequence'):
        lp.launch('first', launch_type='test_mt')


def write_file(path):
    with open(path, 'w') as f:
        f.write(os.environ.get('WHICH', ''))


def test_add_node_after_launch_joins_the_running_program_and_is_refused_once_it_ended():
    program = lp.Program('running')
    program.add_node(lp.PyNode(block), label='daemon')
    controller = lp.launch(program, launch_type='test_mt')
    try:
        program.add_node(lp.PyNode(lp.wait_for_stop), label='late')
        assert controller.status()['late/0'].state in (lp.NodeState.PENDING,
                                                      lp.NodeState.RUNNING)
    finally:
        controller.stop()
    assert list(program.groups) == ['daemon', 'late']
    with pytest.raises(RuntimeError, match='no longer be added|stopping'):
        program.add_node(lp.PyNode(block), label='later')


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self):
        pass


def test_serialize_py_nodes_error_is_a_runtime_error():
    program = lp.Program('unpicklable')
    program.add_node(lp.PyNode(Unpicklable()), label='my_node')
    with pytest.raises(RuntimeError, match='my_node/0') as raised:
        lp.launch(program, launch_type='test_mt', serialize_py_nodes=True)
    assert isinstance(raised.value, lp.NodePicklingError)
    assert isinstance(raised.value, pickle.PicklingError)


def run_server(address, served):
    server = courier.Server(port=lp.get_port_from_address(address.resolve()))
    server.Bind('ping', lambda: 'pong')
    server.Start()
    served.ping_served()
    lp.wait_for_stop()
    server.Stop()


def run_client(address, served):
    client = courier.Client(address.resolve())
    assert client.ping() == 'pong'
    served.client_done()


class Served:
    def __init__(self):
        self.events = []

    def ping_served(self):
        self.events.append('server up')

    def client_done(self):
        self.events.append('client done')
        lp.stop()

    def seen(self):
        return self.events


@pytest.mark.parametrize('colocated', [True, False])
@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_node_serves_its_own_server_on_an_allocated_address(launch_type, colocated):
    program = lp.Program('own_server')
    served = program.add_node(lp.CourierNode(Served), label='served')
    address = lp.Address()
    server_node = lp.PyNode(run_server, address, served)
    server_node.allocate_address(address)
    client_node = lp.PyNode(run_client, address, served)
    if colocated:
        program.add_node(lp.MultiThreadingColocation([client_node, server_node]), label='both')
    else:
        program.add_node(server_node, label='server')
        program.add_node(client_node, label='client')
    controller = lp.launch(program, launch_type=launch_type, notice_period=5)
    assert controller.wait(timeout=60)
    assert all(s.state is lp.NodeState.FINISHED for s in controller.status().values())


def test_an_address_has_one_server_and_a_port():
    address = lp.Address()
    first, second = lp.PyNode(block), lp.PyNode(block)
    first.allocate_address(address)
    first.allocate_address(address)  # again on the same node: nothing changes
    assert first.addresses == [address]
    with pytest.raises(ValueError, match='already allocated'):
        second.allocate_address(address)
    assert lp.get_port_from_address('127.0.0.1:4321') == 4321
    assert lp.get_port_from_address('[::1]:80') == 80
    with pytest.raises(ValueError, match='Unix socket and has no port'):
        lp.get_port_from_address('unix:/tmp/x.sock')
    with pytest.raises(ValueError, match="not a 'host:port' address"):
        lp.get_port_from_address('no-port-here')


LRU_SCRIPT = '''
import functools
import launchpad as lp

@functools.lru_cache(maxsize=4)
def square(x):
    print('computing', x, flush=True)
    return x * x

def use(fn):
    print('results', fn(3), fn(3), flush=True)

if __name__ == '__main__':
    program = lp.Program('lru')
    program.add_node(lp.PyNode(use, square), label='user')
    lp.launch(program, launch_type='local_mp').wait()
'''


def test_lru_cached_functions_of_the_script_reach_node_processes():
    done = run_script(LRU_SCRIPT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('computing 3') == 1  # cached in the node
    assert 'results 9 9' in done.stdout


CAUSE_SCRIPT = '''
import os
import sys
import launchpad as lp

def explode():
    raise RuntimeError('cannot rebuild this here')

class BuiltOnlyHere:
    def __reduce__(self):
        return explode, ()

def die_quietly():
    print('the real cause of death', file=sys.stderr, flush=True)
    os._exit(3)

if __name__ == '__main__':
    which = sys.argv[1]
    program = lp.Program('dying')
    if which == 'unpickling':
        program.add_node(lp.PyNode(print, BuiltOnlyHere()), label='node')
    else:
        program.add_node(lp.PyNode(die_quietly), label='node')
    try:
        lp.launch(program, launch_type='local_mp').wait()
    except lp.NodeFailedError as e:
        print('WAIT RAISED:', e)
'''


@pytest.mark.parametrize('which, cause', [
    ('unpickling', 'cannot be unpickled where it runs.*cannot rebuild this here'),
    ('exit', r'exit code 3.*the last lines of its output:\n.*the real cause of death')])
def test_a_node_process_that_dies_before_reporting_names_the_cause(which, cause):
    done = run_script(CAUSE_SCRIPT, which)
    assert 'WAIT RAISED: Node node/0 failed' in done.stdout, done.stdout + done.stderr
    failure = done.stdout[done.stdout.index('WAIT RAISED'):]
    assert re.search(cause, failure, re.S), failure
