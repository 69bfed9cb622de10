"""Elastic programs on threads and local processes: groups that grow and shrink while the program
runs, from the launcher and from inside a node, group handles, scaling policies (the program is
tests/elastic_program.py; tests/launch runs it on the other platforms)."""
import logging
import pickle
import threading
import time

import pytest

import launchpad as lp
from launchpad import scaling
from tests import elastic_program as elastic
from tests.core.conftest import wait_until

LAUNCH_TYPES = ['test_mt', 'test_mp']


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_node_resizes_its_group_and_the_learner_follows(launch_type, capfd):
    controller = lp.launch(elastic.build(), launch_type=launch_type)
    assert controller.wait(timeout=120)  # the driver fails the program if the learner did not
    status = controller.status()
    assert {name: s.state for name, s in status.items() if name.startswith('actor/')} == {
        'actor/0': lp.NodeState.FINISHED,
        **{f'actor/{i}': lp.NodeState.REMOVED for i in range(1, 6)}}
    out = capfd.readouterr().out
    assert 'ELASTIC grew to 6' in out and 'ELASTIC shrank to 1' in out


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_the_launcher_adds_and_removes_nodes(launch_type):
    program = elastic.build(driver=False)
    controller = lp.launch(program, launch_type=launch_type)
    learner = program.groups['learner'][0].create_handle().dereference()
    actors = [f'actor/{i}' for i in range(6)]
    elastic.wait_for_actors(learner, actors[:2])
    elastic.wait_for_actors(learner, actors[:6], lambda: controller.resize('actor', 6))
    assert controller.group_size('actor') == 6
    # add_node with any node of the group, and program.add_node once it runs, do the same
    learner_handle = program.groups['learner'][0].create_handle()
    handle = program.add_node(elastic.make_actor(learner_handle), label='actor')
    assert isinstance(handle, lp.CourierHandle)
    elastic.wait_for_actors(learner, actors + ['actor/6'])
    assert handle.dereference().set_params(7) == 'actor/6'  # its handle works here too
    controller.remove_node('actor/6')
    elastic.wait_for_actors(learner, actors[:1], lambda: controller.resize('actor', 1))
    with pytest.raises(lp.NodeLeftError, match='actor/6 was removed'):
        handle.dereference().set_params(8)  # a member that left fails clearly, at once
    assert controller.status()['actor/6'].state is lp.NodeState.REMOVED
    assert len(controller.scale_up_times) == 5 and max(controller.scale_up_times) < 30
    controller.stop()
    assert controller.wait(timeout=30)


def test_a_removed_node_gets_the_normal_stop(capfd, tmp_path):
    """Its stop handler runs and it gets the notice period; one ignoring it is killed after."""
    def cooperating(ready):
        lp.register_stop_handler(lambda: print('HANDLER ran', flush=True))
        open(ready, 'w').close()  # (a removal before its handler would end it at once)
        lp.wait_for_stop()

    def stubborn(ready):
        lp.register_stop_handler(lambda: None)  # cooperates, then never ends
        open(ready, 'w').close()
        while True:
            time.sleep(0.05)

    program = lp.Program('remove')
    program.add_node(lp.PyNode(cooperating, str(tmp_path / 'nice')), label='nice')
    program.add_node(lp.PyNode(stubborn, str(tmp_path / 'stubborn')), label='stubborn')
    program.add_node(lp.PyNode(lp.wait_for_stop), label='stays')
    controller = lp.launch(program, launch_type='test_mp', notice_period=1.0)
    assert wait_until(lambda: all(s.state is lp.NodeState.RUNNING
                                  for s in controller.status().values()), timeout=60)
    assert wait_until(lambda: all((tmp_path / name).exists() for name in ('nice', 'stubborn')),
                      timeout=60)
    started = time.monotonic()
    controller.remove_node('nice/0')
    controller.remove_node('stubborn/0')
    assert wait_until(lambda: all(controller.status()[n].state is lp.NodeState.REMOVED
                                  for n in ('nice/0', 'stubborn/0')), timeout=30)
    assert time.monotonic() - started >= 1.0  # the stubborn one had its notice period
    assert controller.status()['stays/0'].state is lp.NodeState.RUNNING
    assert 'HANDLER ran' in capfd.readouterr().out
    controller.stop()
    assert controller.wait(timeout=30)


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_scaling_policy_sizes_the_group_within_its_bounds(launch_type):
    program = elastic.build(driver=False)
    shrink = threading.Event()

    def policy(metrics, now, sizes):
        del metrics, now, sizes
        return {'actor': 0 if shrink.is_set() else 20}  # beyond both bounds (1..8)

    program.set_scaling_policy(policy, interval=0.2)
    controller = lp.launch(program, launch_type=launch_type)
    learner = program.groups['learner'][0].create_handle().dereference()
    elastic.wait_for_actors(learner, [f'actor/{i}' for i in range(8)])
    shrink.set()
    elastic.wait_for_actors(learner, ['actor/0'])
    log = controller.scaling_log
    assert [(d.size, d.wanted, d.target) for d in log[:2]] == [(2, 20, 8), (8, 0, 1)]
    assert 'within [1, 8]' in log[0].reason
    controller.stop()
    assert controller.wait(timeout=30)


def test_bad_requests_say_what_to_do():
    program = elastic.build(driver=False)
    with program.group('fixed'):
        program.add_node(lp.PyNode(lp.wait_for_stop))
    controller = lp.launch(program, launch_type='test_mt')
    with pytest.raises(ValueError, match='no node factory'):
        controller.resize('fixed', 3)
    with pytest.raises(ValueError, match='allows 1 to 8'):
        controller.resize('actor', 9)
    with pytest.raises(KeyError, match='no group'):
        controller.resize('nope', 3)
    with pytest.raises(KeyError, match='not a node of this program'):
        controller.remove_node('actor/99')
    with pytest.raises(lp.ProgramError, match='restart policy'):
        program.add_node(lp.PyNode(lp.wait_for_stop), label='fixed',
                         restart=lp.RestartPolicy())
    controller.stop()
    assert controller.wait(timeout=30)
    with pytest.raises(RuntimeError, match='stopping|ended'):
        controller.add_node(lp.PyNode(lp.wait_for_stop), label='fixed')


def test_a_group_handle_of_an_unknown_group_is_refused_at_launch():
    program = lp.Program('p')
    program.add_node(lp.PyNode(print, program.group_handle('missing')), label='a')
    with pytest.raises(lp.ProgramError, match="group 'missing'"):
        lp.launch(program, launch_type='test_mt')


def test_elastic_bounds_are_checked():
    with pytest.raises(ValueError, match='max_size'):
        lp.Elastic(min_size=3, max_size=2)
    with pytest.raises(ValueError, match='budget'):
        lp.Elastic(budget=0)
    with pytest.raises(TypeError, match='make_node'):
        lp.Elastic(make_node=3)


class Echo:
    def ping(self) -> str:
        return lp.get_context().node_name


class Caller:
    """Holds clients of actor/1, each of which has carried a call (`warm`), and says how each
    one's next call fails once actor/1 was removed (`after`)."""

    def __init__(self, actor, actors):
        self._actor = actor    # actor/1's handle, a courier client here
        self._actors = actors  # group 'actor', an lp.GroupClient
        self._clients = {}

    def warm(self) -> list:
        member = self._actors.members()['actor/1']
        self._clients = {'handle': self._actor, 'handle.futures': pickle.loads(
            pickle.dumps(self._actor)), 'group': member,
            'group.futures': pickle.loads(pickle.dumps(member))}
        return [self._ping(kind, client) for kind, client in self._clients.items()]

    def after(self) -> dict:
        errors = {}
        for kind, client in self._clients.items():
            try:
                self._ping(kind, client)
                errors[kind] = ('answered', '')
            except Exception as e:  # pylint: disable=broad-except
                errors[kind] = (type(e).__name__, str(e))
        return errors

    @staticmethod
    def _ping(kind: str, client) -> str:
        if kind.endswith('.futures'):
            return client.futures.ping().result(timeout=30)
        return client.ping()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_the_first_call_to_a_removed_node_says_it_left(launch_type):
    """A client that has called actor/1 before fails its next call with NodeLeftError, not
    with the unavailable server that a restart would also show (sync and futures calls,
    through a handle and through the group's client)."""
    program = lp.Program('left')
    with program.group('actor', elastic=lp.Elastic(min_size=1, max_size=2)):
        program.add_node(lp.CourierNode(Echo))
        second = program.add_node(lp.CourierNode(Echo))
    caller_handle = program.add_node(
        lp.CourierNode(Caller, second, program.group_handle('actor')), label='caller')
    controller = lp.launch(program, launch_type=launch_type)
    try:
        caller = caller_handle.dereference()
        assert wait_until(lambda: len(controller.coordinator.members('actor')) == 2, timeout=60)
        assert caller.warm() == ['actor/1'] * 4
        controller.remove_node('actor/1')
        assert wait_until(lambda: controller.status()['actor/1'].state is lp.NodeState.REMOVED,
                          timeout=30)
        errors = caller.after()
    finally:
        controller.stop()
    assert {kind: name for kind, (name, _) in errors.items()} == dict.fromkeys(
        ['handle', 'handle.futures', 'group', 'group.futures'], 'NodeLeftError'), errors
    assert all('actor/1 was removed' in message for _, message in errors.values())
    assert controller.wait(timeout=30)


class Resizer:
    def ask(self, label, size):
        """lp.resize(label, size) in this node: 'asked', or the error it raised."""
        try:
            lp.resize(label, size)
        except Exception as e:  # pylint: disable=broad-except
            return type(e).__name__, str(e)
        return 'asked'


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_node_asking_for_a_size_its_group_cannot_have_gets_the_error(launch_type):
    program = elastic.build(driver=False)
    with program.group('fixed'):
        program.add_node(lp.PyNode(lp.wait_for_stop))
    resizer_handle = program.add_node(lp.CourierNode(Resizer), label='resizer')
    controller = lp.launch(program, launch_type=launch_type)
    try:
        resizer = resizer_handle.dereference()
        assert resizer.ask('actor', 9) == (
            'ValueError', "Group 'actor' cannot have 9 nodes: its lp.Elastic allows 1 to 8.")
        assert resizer.ask('actor', 0)[1].endswith('allows 1 to 8.')
        kind, message = resizer.ask('nope', 3)
        assert kind == 'KeyError' and "no group 'nope'" in message and "'actor'" in message
        kind, message = resizer.ask('fixed', 2)
        assert kind == 'ValueError' and "'fixed' cannot grow to 2 nodes" in message
        assert resizer.ask('actor', 3) == 'asked'  # within the bounds: the group grows
        assert wait_until(lambda: controller.group_size('actor') == 3, timeout=60)
        assert resizer.ask('fixed', 0) == 'asked'  # a group without a factory may shrink
        assert wait_until(lambda: controller.status()['fixed/0'].state is lp.NodeState.REMOVED,
                          timeout=60)
    finally:
        controller.stop()
    assert controller.wait(timeout=30)


def report_loss() -> None:
    lp.report(loss=1.0)
    lp.wait_for_stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_a_policy_on_a_metric_no_node_reports_warns_once(launch_type, caplog, monkeypatch):
    monkeypatch.setattr(scaling, 'METRIC_GRACE', 2.0)  # the real one is a minute
    program = elastic.build(driver=False)
    program.add_node(lp.PyNode(report_loss), label='reporter')
    policy, asked = lp.QueueLengthPolicy('actor', 'backlog'), []

    def counted(metrics, now, sizes):
        asked.append(now)
        return policy(metrics, now, sizes)

    def warnings():
        return [record.getMessage() for record in caplog.records
                if record.levelno == logging.WARNING and 'backlog' in record.getMessage()]

    program.set_scaling_policy(counted, interval=0.1)
    controller = lp.launch(program, launch_type=launch_type)
    try:
        assert wait_until(lambda: warnings(), timeout=60)
        more = len(asked) + 5
        assert wait_until(lambda: len(asked) >= more, timeout=60)  # five more decisions
    finally:
        controller.stop()
    assert controller.wait(timeout=30)
    assert len(warnings()) == 1
    assert "no node has reported metric 'backlog'" in warnings()[0]
    assert 'reporter: loss' in warnings()[0]
