"""The program graph: groups, handles, edges and validation."""
import collections
import dataclasses
import pathlib
import shutil

import pytest

import launchpad as lp
from tests.testbeds import require_testbed


class Service:
    def ping(self):
        return 'pong'


def noop(*args, **kwargs):
    del args, kwargs


def test_groups_name_nodes_in_insertion_order():
    program = lp.Program('p')
    with program.group('actor'):
        a0 = lp.PyNode(noop)
        program.add_node(a0)
        program.add_node(lp.PyNode(noop))
    program.add_node(lp.CourierNode(Service), label='learner')
    assert list(program.groups) == ['actor', 'learner']
    assert [n.name for n in program.get_all_nodes()] == ['actor/0', 'actor/1', 'learner/0']
    assert program.groups['actor'][0] is a0


def test_a_label_is_required_outside_groups():
    with pytest.raises(lp.ProgramError, match='needs a group'):
        lp.Program('p').add_node(lp.PyNode(noop))


def test_label_disagreeing_with_the_group_is_an_error():
    program = lp.Program('p')
    with program.group('a'), pytest.raises(lp.ProgramError, match='use one or the other'):
        program.add_node(lp.PyNode(noop), label='b')


def test_groups_do_not_nest():
    program = lp.Program('p')
    with program.group('a'), pytest.raises(lp.ProgramError, match='cannot be nested'):
        with program.group('b'):
            pass


@pytest.mark.parametrize('label', ['', 'a/b', 3])
def test_bad_labels_are_rejected(label):
    with pytest.raises(lp.ProgramError, match='labels'):
        lp.Program('p').add_node(lp.PyNode(noop), label=label)


def test_a_node_cannot_be_added_twice():
    program = lp.Program('p')
    node = lp.PyNode(noop)
    program.add_node(node, label='a')
    with pytest.raises(lp.ProgramError, match='already added'):
        program.add_node(node, label='a')


def test_add_node_rejects_what_is_not_a_node():
    with pytest.raises(lp.ProgramError, match='launchpad node'):
        lp.Program('p').add_node(noop, label='a')


def test_handle_used_before_dereference_explains_itself():
    handle = lp.Program('p').add_node(lp.CourierNode(Service), label='s')
    with pytest.raises(AttributeError, match=r'dereference\(\)'):
        handle.ping()


@dataclasses.dataclass
class Config:
    servers: list
    name: str = 'x'


Pair = collections.namedtuple('Pair', 'left right')


def test_edges_come_from_handles_anywhere_in_arguments():
    program = lp.Program('p')
    with program.group('server'):
        s0 = program.add_node(lp.CourierNode(Service))
        s1 = program.add_node(lp.CourierNode(Service))
        s2 = program.add_node(lp.CourierNode(Service))
    user = lp.PyNode(noop, [{'a': (s0,)}], config=Config([s1]), pair=Pair(1, {s2}))
    program.add_node(user, label='user')
    assert [(src.name, dst.name) for src, dst in program.edges] == [
        ('server/0', 'user/0'), ('server/1', 'user/0'), ('server/2', 'user/0')]
    dot = program.to_dot()
    assert dot.startswith('digraph "p" {')
    assert '"server/1" -> "user/0";' in dot
    assert 'label="server";' in dot


def test_handle_of_a_node_outside_the_program_fails_validation():
    stray = lp.CourierNode(Service).create_handle()
    program = lp.Program('p')
    program.add_node(lp.PyNode(noop, stray), label='user')
    with pytest.raises(lp.ProgramError, match='not in program'):
        program.validate()
    with pytest.raises(lp.ProgramError, match=r'program.add_node'):
        lp.launch(program, launch_type='test_mt')


@pytest.mark.parametrize('other_name', ['learner', 'actors'])
def test_a_handle_of_another_program_names_its_node_and_program_and_what_to_do(other_name):
    learner = lp.Program('learner')
    server = learner.add_node(lp.CourierNode(Service), label='server')
    actors = lp.Program(other_name)
    actors.add_node(lp.PyNode(noop, server), label='actor')
    with pytest.raises(lp.ProgramError) as error:
        actors.validate()
    message = str(error.value)
    assert 'CourierNode-' not in message  # an internal id means nothing to the user
    other = "another program also named 'learner'" if other_name == 'learner' else \
        "program 'learner'"
    assert (f"Node 'actor/0' (PyNode(noop)) of program {other_name!r} received a handle of "
            f"node 'server/0' of {other}") in message
    assert 'one program' in message and 'courier.Client' in message


def test_empty_program_cannot_launch():
    with pytest.raises(lp.ProgramError, match='no nodes'):
        lp.launch(lp.Program('empty'), launch_type='test_mt')


def test_unknown_launch_type_lists_the_known_ones():
    program = lp.make_program(lp.PyNode(noop))
    with pytest.raises(ValueError, match=r'local_mp.*local_mt'):
        lp.launch(program, launch_type='nowhere')


def test_resources_for_unknown_groups_are_an_error():
    program = lp.make_program(lp.PyNode(noop))
    with pytest.raises(ValueError, match="groups.*'typo'"):
        lp.launch(program, launch_type='test_mp', local_resources={'typo': lp.PythonProcess()})


def test_make_program_groups_nodes_by_what_they_run():
    program = lp.make_program(lp.PyNode(noop), lp.CourierNode(Service), name='m')
    assert program.name == 'm'
    assert list(program.groups) == ['noop', 'Service']


def test_launch_type_helpers():
    assert lp.is_local_launch(lp.LaunchType.LOCAL_MULTI_PROCESSING)
    assert not lp.is_local_launch('test_mt')
    assert lp.is_local_launch_or_test('test_mt')
    assert not lp.is_local_launch_or_test('ssh')
    assert lp.LAUNCH_TYPE.value == 'local_mt'  # flags were never parsed here


def _server_and_user() -> lp.Program:
    program = lp.Program('drawn')
    server = program.add_node(lp.CourierNode(Service), label='server')
    program.add_node(lp.PyNode(noop, server), label='user')
    return program


@pytest.mark.parametrize('suffix, start', [('svg', b'<?xml'), ('png', b'\x89PNG')])
def test_draw_renders_the_graph_with_graphviz(tmp_path, suffix, start):
    if shutil.which('dot') is None:
        require_testbed('Graphviz is not installed: tests/testbeds/install_packages.sh (as root)')
    path = _server_and_user().draw(str(tmp_path / f'graph.{suffix}'))
    data = pathlib.Path(path).read_bytes()
    assert data.startswith(start)
    if suffix == 'svg':
        assert b'server/0' in data and b'user/0' in data


def test_draw_says_what_to_install_without_graphviz(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, 'which', lambda name: None)
    with pytest.raises(FileNotFoundError, match='install Graphviz .*apt-get install graphviz'):
        _server_and_user().draw(str(tmp_path / 'graph.svg'))


def test_draw_needs_a_format(tmp_path):
    with pytest.raises(ValueError, match="suffix such as .svg"):
        _server_and_user().draw(str(tmp_path / 'graph'))
