"""Who hears a program's stop when (`launchpad.process.stop_order`), and the coordinator's
`wait_for_stop(name)` that workers watch."""
import threading

import pytest

from launchpad.process.coordinator import Coordinator
from launchpad.process.stop_order import StopOrder

# actors -> learner -> replay, actors -> replay, actors and learner -> counter; a and b call
# each other and c.
CALLS = {'actor/0': {'learner/0', 'replay/0', 'counter/0'}, 'actor/1': {'learner/0', 'replay/0'},
         'learner/0': {'replay/0', 'counter/0'}, 'a/0': {'b/0', 'c/0'}, 'b/0': {'a/0'}}
NAMES = ['actor/0', 'actor/1', 'learner/0', 'replay/0', 'counter/0', 'a/0', 'b/0', 'c/0']


def test_callers_are_told_first_and_cycles_together():
    order = StopOrder(CALLS, fallback=5.0)
    ended = set()

    def told():
        return order.told(NAMES, ended.__contains__, since_stop=1.0)

    assert told() == {'actor/0', 'actor/1', 'a/0', 'b/0'}
    ended.update({'actor/0', 'a/0'})
    assert told() == {'actor/0', 'actor/1', 'a/0', 'b/0', 'c/0'}  # actor/1 still runs
    ended.update({'actor/1', 'b/0'})
    assert told() == {'actor/0', 'actor/1', 'a/0', 'b/0', 'learner/0', 'c/0'}
    ended.add('learner/0')
    assert told() == set(NAMES)
    assert order.told(NAMES, lambda name: False, since_stop=5.0) == set(NAMES)  # the fallback


def test_an_outside_caller_holds_back_the_whole_cycle():
    order = StopOrder({'x/0': {'a/0'}, 'a/0': {'b/0'}, 'b/0': {'a/0'}}, fallback=5.0)
    assert order.told(['x/0', 'a/0', 'b/0'], lambda name: False, 0.0) == {'x/0'}
    assert order.told(['x/0', 'a/0', 'b/0'], lambda name: name == 'x/0', 0.0) == {
        'x/0', 'a/0', 'b/0'}


def test_group_calls_cover_members_added_later():
    order = StopOrder({}, fallback=5.0, group_calls={'learner/0': {'actor'}})
    order.add({'actor/3': {'replay/0'}})
    names = ['learner/0', 'actor/0', 'actor/3', 'replay/0']
    assert order.told(names, lambda name: False, 0.0) == {'learner/0'}
    assert order.told(names, {'learner/0'}.__contains__, 0.0) == {'learner/0', 'actor/0',
                                                                    'actor/3'}


def test_bad_fallback_is_refused():
    with pytest.raises(ValueError, match='fallback'):
        StopOrder({}, fallback=-1)


def test_a_worker_waiting_for_its_turn_hears_the_stop_once_its_callers_ended():
    coordinator = Coordinator(['actor/0', 'replay/0'],
                              stop_order=StopOrder({'actor/0': {'replay/0'}}, fallback=60.0))
    assert not coordinator.wait_for_stop(0.0, 'replay/0')
    coordinator.request_stop('test')
    assert coordinator.wait_for_stop(0.0)  # the program stops
    assert coordinator.wait_for_stop(0.0, 'actor/0')
    assert not coordinator.wait_for_stop(0.05, 'replay/0')  # its caller still runs
    heard = threading.Event()
    waiter = threading.Thread(target=lambda: coordinator.wait_for_stop(None, 'replay/0')
                              and heard.set())
    waiter.start()
    coordinator.node_finished('actor/0')
    waiter.join(10)
    assert heard.is_set()
    assert coordinator.told_to_stop() == ['actor/0', 'replay/0']


def test_the_fallback_tells_a_node_whose_caller_hangs():
    coordinator = Coordinator(['actor/0', 'replay/0'],
                              stop_order=StopOrder({'actor/0': {'replay/0'}}, fallback=0.2))
    coordinator.request_stop('test')
    assert coordinator.wait_for_stop(10.0, 'replay/0')  # woken by the fallback, not a change
    assert coordinator.status()['actor/0'].state.ended is False


def _serve():
    pass


def test_the_program_says_who_calls_whom_by_executable():
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    program = lp.Program('calls')
    replay_node = lp.CourierNode(dict)
    replay = replay_node.create_handle()
    learner_node = lp.CourierNode(dict, replay=replay)
    program.add_node(lp.MultiThreadingColocation([learner_node, replay_node]), label='learner')
    learner = learner_node.create_handle()
    with program.group('actor'):
        for _ in range(2):
            program.add_node(lp.PyNode(_serve, learner, replay))
    program.add_node(lp.PyNode(_serve, program.group_handle('actor')), label='driver')
    calls, group_calls = program.calls(['learner/0', 'actor/0', 'actor/1', 'driver/0'])
    assert calls == {'actor/0': {'learner/0'}, 'actor/1': {'learner/0'}}  # not itself
    assert group_calls == {'driver/0': {'actor'}}
