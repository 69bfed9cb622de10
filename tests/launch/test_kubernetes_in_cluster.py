"""A Kubernetes program that no launcher follows restarts its nodes from its coordinator pod:
the manifests and RBAC a detached launch creates for that, the coordinator pod's controller and
`InClusterRunner` against a fake API, and the detached launcher following the pods it recreates.
(tests/launch/test_kubernetes_podman.py runs it for real.)"""
from __future__ import annotations

import base64
import json
import logging
import zlib

import pytest

import launchpad as lp
from launchpad.launch import kubernetes
from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import in_cluster, names, pod
from launchpad.launch.launcher import LaunchOptions
from launchpad.policy import NodePolicy
from tests.launch.test_kubernetes_manifests import _validate
from tests.launch.test_kubernetes_launcher import (FakeApi, _idle, _until, exited, fake,  # noqa: F401
                                                   launch, running)

pytestmark = pytest.mark.timeout(60)


def _program(max_restarts: int = 1) -> lp.Program:
    program = lp.Program('p')
    with program.group('worker', restart=lp.RestartPolicy(max_restarts=max_restarts,
                                                          backoff=0.0)):
        program.add_node(lp.PyNode(_idle))
    program.add_node(lp.PyNode(_idle), label='other')
    return program


def _plan(program: lp.Program, attached: bool = False, **options) -> kubernetes.LaunchPlan:
    options = LaunchOptions('kubernetes', {}, notice_period=0.5,
                            extra={'image': 'i', 'name': 't1', **options})
    kubernetes.KubernetesLauncher().check(program, options)
    return kubernetes.plan_launch(program, options, attached=attached)


def _settings(plan) -> names.CoordinatorSettings:
    command = plan.pod_document(plan.coordinator_pod)['spec']['containers'][0]['command']
    return names.CoordinatorSettings.from_json(command[-1])


def _manifests(plan):
    configmap = next(d for d in plan.documents if d['metadata']['name'] == 't1-pods')
    data = base64.b64decode(configmap['binaryData'][in_cluster.POD_MANIFESTS_KEY])
    return json.loads(zlib.decompress(data))


class SelectingApi(FakeApi):
    """The fake API, answering `list_pods` with the pods its label selector matches (or failing,
    `unreachable` times)."""

    unreachable = 0

    def list_pods(self, selector):
        if self.unreachable:
            self.unreachable -= 1
            raise kubernetes.KubernetesError('Cannot reach the Kubernetes API server')
        wanted = dict(term.split('=') for term in selector.split(','))
        return [p for p in super().list_pods(selector)
                if wanted.items() <= p['metadata']['labels'].items()]


def test_a_detached_launch_lets_its_coordinator_pod_recreate_node_pods_and_nothing_more():
    plan = _plan(_program(), create_rbac=True)
    _validate(plan.documents)
    settings = _settings(plan)
    assert settings.recreates_pods
    assert settings.policies['worker/0']['restart']['max_restarts'] == 1
    role = next(d for d in plan.documents if d['kind'] == 'Role')
    assert role['rules'] == [
        {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'list']},
        {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['create']},
        {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['delete'],
         'resourceNames': ['t1-worker-0', 't1-other-0']}]
    assert _manifests(plan) == {name: plan.pod_document(name)
                                for name in ('t1-worker-0', 't1-other-0')}
    coordinator = plan.pod_document(plan.coordinator_pod)
    assert coordinator['spec']['volumes'] == [{'name': 'pods', 'configMap': {'name': 't1-pods'}}]
    assert coordinator['spec']['containers'][0]['volumeMounts'][0]['mountPath'] == \
        names.PODS_DIR
    names_in_order = [d['metadata']['name'] for d in plan.documents]
    assert names_in_order.index('t1-pods') < names_in_order.index('t1-coordinator')

    attached = _plan(_program(), attached=True, create_rbac=True)
    assert not _settings(attached).recreates_pods
    assert 't1-pods' not in [d['metadata']['name'] for d in attached.documents]
    assert next(d for d in attached.documents if d['kind'] == 'Role')['rules'] == [
        {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'list']}]


def test_without_a_service_account_a_detached_launch_says_its_nodes_will_not_restart(caplog):
    with caplog.at_level(logging.WARNING):
        plan = _plan(_program())
    assert 'worker/0 will not be restarted when it fails' in caplog.text
    assert 'create_rbac=True' in caplog.text
    settings = _settings(plan)
    assert not settings.recreates_pods
    assert settings.policies['worker/0']['restart']['max_restarts'] == 0
    assert 't1-pods' not in [d['metadata']['name'] for d in plan.documents]


def test_the_coordinator_pod_restarts_a_node_pod_and_fails_the_program_past_its_budget(
        monkeypatch, capsys):
    """worker/0's pod is OOM-killed (no report): the controller in the coordinator pod creates
    it again from its manifest, owned as the coordinator pod is; then it is deleted, which is
    one failure too many. Pods the launcher has not created yet are no failures."""
    monkeypatch.setattr(in_cluster.InClusterRunner, 'POLL_SECONDS', 0.0)
    plan = _plan(_program(), create_rbac=True)
    settings = _settings(plan)
    api = SelectingApi()
    owner = [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 't1', 'uid': 'root-uid'}]
    coordinator_pod = plan.pod_document(plan.coordinator_pod)
    coordinator_pod['metadata']['ownerReferences'] = owner
    api.create(coordinator_pod)
    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods)
    coordinator = pod.PodCoordinator(settings.nodes, followed=False, policies={
        name: NodePolicy.from_json(policy) for name, policy in settings.policies.items()})
    coordinator.request_size('worker', 3)  # nothing here creates pods for it (yet)
    assert ('a node asked for group worker to have 3 nodes: ignored, no launcher follows'
            in capsys.readouterr().out)
    controller = Controller('t1', coordinator, runner, launch_type='kubernetes',
                            notice_period=0.5, poll_interval=0.01)
    api.unreachable = 2  # a listing that fails is tried again
    _until(lambda: sum(call[0] == 'list_pods' for call in api.calls) >= 3, 'no listing')
    assert coordinator.failure is None  # the node pods do not exist yet
    assert api.unreachable == 0 and not controller.done
    api.statuses['t1-worker-0'] = [running(), exited(137, 'OOMKilled'), running()]
    for name in ('t1-worker-0', 't1-other-0'):
        api.create(plan.pod_document(name))
    _until(lambda: controller.status()['worker/0'].restarts == 1, 'not restarted')
    assert [c for c in api.calls if c[:3] == ('create', 'Pod', 't1-worker-0')] == [
        ('create', 'Pod', 't1-worker-0')] * 2
    assert ('delete', 'Pod', 't1-worker-0', 0) in api.calls  # the old one, before
    assert api.objects[('Pod', 't1-worker-0')]['metadata']['ownerReferences'] == owner
    _until(lambda: api.calls[-1][0] == 'list_pods', 'not listed again')
    del api.objects[('Pod', 't1-worker-0')]  # deleted behind the program's back
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=20)
    assert failure.value.node_name == 'worker/0'
    assert 'its pod t1-worker-0 was deleted' in failure.value.message
    assert 'failed 2 times: restarted 1 time' in failure.value.message
    assert 'OOMKilled, exit code 137' in str(failure.value.failures[0])
    # other/0 got the stop and the notice period, then its pod was deleted.
    assert ('delete', 'Pod', 't1-other-0', 0) in api.calls
    assert controller.status()['other/0'].state is lp.NodeState.KILLED


def test_a_detached_launcher_follows_the_pod_its_coordinator_pod_creates_again(fake):
    fake.statuses['t1-worker-0'] = [running(), exited(1, 'Error')]
    controller = launch(_program(), detach=True, create_rbac=True)
    _until(lambda: controller.status()['worker/0'].state is lp.NodeState.PENDING
           and controller.status()['worker/0'].restarts == 1, 'not marked restarted')
    assert [c for c in fake.calls if c[:3] == ('create', 'Pod', 't1-worker-0')] == [
        ('create', 'Pod', 't1-worker-0')]  # the launcher leaves it to the coordinator pod
    assert controller.status()['worker/0'].state is lp.NodeState.PENDING  # the old pod ended
    with fake.lock:  # what the coordinator pod does
        fake.objects[('Pod', 't1-worker-0')]['metadata']['uid'] = 'uid-new'
        fake.statuses['t1-worker-0'] = [running()]
    _until(lambda: controller.status()['worker/0'].state is lp.NodeState.RUNNING, 'not seen')
    assert controller.status()['worker/0'].restarts == 1
    assert not [c for c in fake.calls if c[0] == 'delete']

