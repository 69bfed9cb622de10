"""The coordinator's two faces are declared, implemented by the coordinator and its proxies, and
only the node face is served to nodes."""
import inspect
import tempfile

import pytest

import courier
import launchpad as lp
from launchpad.launch import threads
from launchpad.launch.kubernetes import pod
from launchpad.nodes import colocation
from launchpad.process import faces, worker
from launchpad.process.coordinator import Coordinator, serve_coordinator


def _parameters(function):
    """Names, kinds and defaults of the parameters (a default function counts as any)."""
    return [(p.name, p.kind, 'a function' if callable(p.default) else p.default)
            for p in inspect.signature(function).parameters.values()]


def _differences(cls: type, face: type):
    """What `cls` lacks of `face`, or where its signatures differ ([] when it implements it)."""
    problems = []
    for name in sorted(faces.members_of(face)):
        declared = inspect.getattr_static(face, name)
        found = inspect.getattr_static(cls, name, None)
        if found is None:
            problems.append(f'{cls.__name__} lacks {name}')
        elif isinstance(declared, property) != isinstance(found, property):
            problems.append(f'{cls.__name__}.{name}: a property in one and not the other')
        elif not isinstance(declared, property) and _parameters(found) != _parameters(declared):
            problems.append(f'{cls.__name__}.{name}{inspect.signature(found)} differs from '
                            f'{face.__name__}.{name}{inspect.signature(declared)}')
    return problems


def test_the_faces_split_the_coordinator_between_nodes_and_the_controller():
    assert {'node_started', 'node_failed', 'wait_for_stop', 'lookup_address', 'members',
            'report_metrics', 'request_size', 'has_left'} <= faces.NODE_METHODS
    assert {'executable_exited', 'mark_killed', 'due_restarts', 'add_nodes', 'remove_node',
            'status'} <= faces.CONTROL_ONLY
    assert not faces.NODE_METHODS & faces.CONTROL_ONLY


@pytest.mark.parametrize('face', [faces.NodeFace, faces.ControlFace])
def test_the_coordinator_implements_both_faces(face):
    assert _differences(Coordinator, face) == []


@pytest.mark.parametrize('proxy', [faces.NodeFaceProxy, worker._CoordinatorClient,  # pylint: disable=protected-access
                                   threads._ThreadReports, colocation._CoordinatorRelay])  # pylint: disable=protected-access
def test_every_proxy_implements_the_node_face(proxy):
    assert _differences(proxy, faces.NodeFace) == []


def test_the_kubernetes_coordinator_implements_what_its_pods_call():
    assert _differences(pod.PodCoordinator, pod.PodFace) == []


def test_a_proxy_has_the_node_face_and_nothing_else():
    coordinator = Coordinator(['a/0'])
    proxy = faces.NodeFaceProxy(coordinator)
    assert proxy.node_started('a/0', 1, 'here') == 0
    assert coordinator.status()['a/0'].state is lp.NodeState.RUNNING
    public = {name for name in dir(proxy) if not name.startswith('_')}
    assert public == set(faces.NODE_METHODS)


def test_the_server_serves_the_node_face_and_refuses_the_control_face():
    coordinator = Coordinator(['a/0'])
    with tempfile.TemporaryDirectory() as workdir:
        server = serve_coordinator(coordinator, f'unix:{workdir}/c.sock', auth_token='t')
        try:
            client = courier.Client(server.address, auth_token='t', call_timeout=10)
            assert client.node_started('a/0', 1, 'here') == 0
            assert client.members('a') == []
            with pytest.raises(PermissionError, match=r'mark_killed belongs to the coordinator'
                                                      r"'s control face.*nodes may call"):
                client.mark_killed(['a/0'])
            assert coordinator.status()['a/0'].state is lp.NodeState.RUNNING
            served = set(courier.list_methods(client))
            assert served == faces.NODE_METHODS | faces.CONTROL_ONLY  # the refusals are bound
        finally:
            server.Stop()


def call_a_control_method():
    """In a node: the controller-only methods are not on the node's coordinator, and the
    served coordinator refuses them."""
    coordinator = lp.get_context().coordinator
    assert not hasattr(coordinator, 'executable_exited')
    client = coordinator._target  # pylint: disable=protected-access  (the worker's courier client)
    try:
        client.executable_exited('call_a_control_method/0', 0)
    except PermissionError as e:
        assert 'executable_exited belongs to the coordinator\'s control face' in str(e)
    else:
        raise AssertionError('a node called a controller-only method of the coordinator')


def test_a_node_that_calls_a_control_method_gets_a_clear_error():
    program = lp.make_program(lp.PyNode(call_a_control_method))
    controller = lp.launch(program, launch_type='test_mp')
    assert controller.wait(timeout=60)
    assert controller.status()['call_a_control_method/0'].state is lp.NodeState.FINISHED
