"""A Kubernetes program that no launcher follows restarts its nodes from its coordinator pod:
the manifests and RBAC a detached launch creates for that, the coordinator pod's controller and
`InClusterRunner` against a fake API, and the detached launcher following the pods it recreates.
(tests/launch/test_kubernetes_podman.py runs it for real.)"""
from __future__ import annotations

import base64
import copy
import dataclasses
import functools
import json
import logging
import threading
import time
import zlib

import pytest

import launchpad as lp
from launchpad.launch import detached, kubernetes
from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import coordinator_job, in_cluster, names, pod, readopt
from launchpad.launch.kubernetes import launcher as kubernetes_launcher
from launchpad.launch.kubernetes.api import AlreadyExists
from launchpad.launch.launcher import LaunchOptions
from launchpad.policy import NodePolicy
from tests.launch.kubernetes_api_server import PodmanApiServer
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


def _plan(program: lp.Program, attached: bool = False, notice_period: float = 0.5,
          **options) -> kubernetes.LaunchPlan:
    options = LaunchOptions('kubernetes', {}, notice_period=notice_period,
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
         'resourceNames': ['t1-worker-0', 't1-other-0']},
        {'apiGroups': [''], 'resources': ['pods/log'], 'verbs': ['get'],  # (`logs`, `attach`)
         'resourceNames': ['t1-worker-0', 't1-other-0']},
        {'apiGroups': [''], 'resources': ['secrets'], 'verbs': ['get', 'patch'],  # its state
         'resourceNames': ['t1-state']},
        {'apiGroups': ['batch'], 'resources': ['jobs'], 'verbs': ['get'],  # pod lost, or all?
         'resourceNames': ['t1-coordinator']}]
    # The coordinator pod is a Job's, whose next pod re-adopts the nodes if the pod is lost,
    # from the state kept in the Secret t1-state (`coordinator_job`).
    job = next(d for d in plan.documents if d['metadata']['name'] == 't1-coordinator')
    assert job['kind'] == 'Job' and job['spec']['backoffLimit'] == 6
    assert job['spec']['template']['spec']['hostname'] == 't1-coordinator'  # its DNS name
    assert job['spec']['template']['metadata']['labels'][names.ROLE_LABEL] == 'coordinator'
    assert next(d for d in plan.documents if d['metadata']['name'] == 't1-state') == {
        'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque', 'data': {},
        'metadata': {'name': 't1-state', 'namespace': 'default', 'labels': {
            names.PROGRAM_LABEL: 't1', names.ROLE_LABEL: 'state', **names.MANAGED_BY}}}
    assert settings.job == 't1-coordinator'
    assert _manifests(plan) == {name: plan.pod_document(name)
                                for name in ('t1-worker-0', 't1-other-0')}
    coordinator = plan.pod_document(plan.coordinator_pod)
    # Its container is restarted when the coordinator dies, and re-adopts the nodes from the
    # state kept in the pod; the nodes wait for it the supervisor grace.
    assert coordinator['spec']['restartPolicy'] == 'OnFailure'
    assert coordinator['spec']['volumes'] == [{'name': 'pods', 'configMap': {'name': 't1-pods'}},
                                              {'name': 'state', 'emptyDir': {}}]
    assert [m['mountPath'] for m in coordinator['spec']['containers'][0]['volumeMounts']] == [
        names.PODS_DIR, names.STATE_DIR]
    assert settings.state_dir == names.STATE_DIR
    assert plan.growth.packer.coordinator_grace == detached.SUPERVISOR_GRACE
    assert _plan(_program(), create_rbac=True, detach=True,
                 supervisor_grace=30).growth.packer.coordinator_grace == 30
    with pytest.raises(ValueError, match="supervisor_grace=30 applies to detached programs only"):
        _plan(_program(), create_rbac=True, supervisor_grace=30)
    assert plan.pod_document('t1-worker-0')['spec']['restartPolicy'] == 'Never'
    names_in_order = [d['metadata']['name'] for d in plan.documents]
    assert names_in_order.index('t1-pods') < names_in_order.index('t1-coordinator')

    attached = _plan(_program(), attached=True, create_rbac=True)
    assert not _settings(attached).recreates_pods
    assert _settings(attached).state_dir is None and _settings(attached).job is None
    assert 'Job' not in [d['kind'] for d in attached.documents]
    assert attached.pod_document(attached.coordinator_pod)['spec']['restartPolicy'] == 'Never'
    assert attached.growth.packer.coordinator_grace is None
    assert 't1-pods' not in [d['metadata']['name'] for d in attached.documents]
    assert next(d for d in attached.documents if d['kind'] == 'Role')['rules'] == [
        {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'list']}]


def test_a_detached_elastic_group_needs_a_max_size_for_the_coordinator_pods_role():
    program = lp.Program('p')
    with program.group('worker', elastic=lp.Elastic(make_node=lambda: lp.PyNode(_idle))):
        program.add_node(lp.PyNode(_idle))
    with pytest.raises(ValueError, match=r'Give it lp.Elastic\(max_size=...\)'):
        _plan(program, create_rbac=True)
    assert _plan(program, attached=True, create_rbac=True).added_pods == {}


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
    it again from its manifest, owned by the coordinator pod; then it is deleted, which is
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
    # A listing that fails is tried again. (Set before the polling starts: on a busy machine
    # three listings could come before this line, and the failures after the check.)
    api.unreachable = 2
    controller = Controller('t1', coordinator, runner, launch_type='kubernetes',
                            notice_period=0.5, poll_interval=0.01)
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
    coordinator_uid = api.objects[('Pod', 't1-coordinator')]['metadata']['uid']
    assert api.objects[('Pod', 't1-worker-0')]['metadata']['ownerReferences'] == [
        {'apiVersion': 'v1', 'kind': 'Pod', 'name': 't1-coordinator', 'uid': coordinator_uid}]
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


def test_a_restarted_coordinator_readopts_the_node_pods_with_their_restart_budgets(
        monkeypatch, tmp_path):
    """The coordinator pod's controller keeps the program's state (`readopt`) while worker/0
    is restarted once (its budget: 1). Its process dies (here: its monitor stops for good); a
    new coordinator, as in the restarted container, re-adopts the running node pods from that
    state: it creates no pod again, worker/0 keeps its restart, so its next failure is one too
    many. (The podman bed's test kills a real coordinator container.)"""
    monkeypatch.setattr(in_cluster.InClusterRunner, 'POLL_SECONDS', 0.0)
    plan = _plan(_program(), create_rbac=True)
    settings = dataclasses.replace(_settings(plan), state_dir=str(tmp_path))
    api = SelectingApi()
    api.create(plan.pod_document(plan.coordinator_pod))
    api.statuses['t1-worker-0'] = [running(), exited(137, 'OOMKilled'), running()]
    for name in ('t1-worker-0', 't1-other-0'):
        api.create(plan.pod_document(name))
    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods)
    assert readopt.read_state(settings.state_dir) is None
    coordinator, controller = pod.supervise(settings, runner)
    readopt.keep_state(settings.state_dir, controller, runner)
    _until(lambda: controller.status()['worker/0'].restarts == 1, 'not restarted')
    for name in settings.nodes:
        coordinator.node_started(name, 10, 'pod', 'first')

    def kept():
        state = readopt.read_state(settings.state_dir)
        return state is not None and {
            name: (status.state, status.restarts)
            for name, status in state['coordinator'].status().items()} == {
                'worker/0': (lp.NodeState.RUNNING, 1), 'other/0': (lp.NodeState.RUNNING, 0)}
    _until(kept, 'the state was not kept')
    dead = threading.Event()
    runner.poll = lambda: dead.wait() and {}  # the old coordinator's monitor is gone
    created = len(api.calls)

    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods)
    state = readopt.read_state(settings.state_dir)
    readopted, controller = pod.supervise(settings, runner, readopt.resume(runner, state))
    readopt.keep_state(settings.state_dir, controller, runner, state.get('scaler'))
    try:
        assert readopted is not coordinator
        assert controller.status()['worker/0'].restarts == 1
        readopted.node_started('worker/0', 10, 'pod', 'first')  # the node, reconnecting
        assert controller.status()['worker/0'].restarts == 1  # the same process: no restart
        _until(lambda: sum(c[0] == 'list_pods' for c in api.calls[created:]) >= 3, 'no look')
        assert not [c for c in api.calls[created:] if c[0] in ('create', 'delete')]
        api.statuses['t1-worker-0'] = [exited(137, 'OOMKilled')]
        with pytest.raises(lp.NodeFailedError) as failure:
            controller.wait(timeout=20)
        assert 'failed 2 times: restarted 1 time' in failure.value.message
    finally:
        dead.set()  # the old monitor ends
        controller.stop()
    (tmp_path / 'state.pkl').write_bytes(b'cut short')  # a new start beats a crash loop
    assert readopt.read_state(str(tmp_path)) is None


def test_a_new_coordinator_pod_readopts_the_node_pods_from_the_state_kept_in_a_secret(
        monkeypatch, tmp_path):
    """The coordinator pod is lost (deleted, evicted): its Job makes a new pod, whose emptyDir
    is empty. Its coordinator reads the state the old one kept in the Secret t1-state and
    re-adopts the node pods: it creates and deletes none, worker/0 keeps its restart. The old
    pod's SIGTERM stopped nothing while the Job lives on; once the Job is gone or being deleted
    (the program is deleted), a SIGTERM stops the program."""
    monkeypatch.setattr(in_cluster.InClusterRunner, 'POLL_SECONDS', 0.0)
    plan = _plan(_program(), create_rbac=True)
    settings = _settings(plan)
    api = SelectingApi()
    for document in plan.documents:
        if document['metadata']['name'] in ('t1-state', 't1-coordinator', 't1-worker-0',
                                            't1-other-0'):
            api.create(document)
    api.statuses['t1-worker-0'] = [running(), exited(137, 'OOMKilled'), running()]
    old_pod, new_pod = tmp_path / 'old', tmp_path / 'new'  # each pod's emptyDir
    old_pod.mkdir()
    new_pod.mkdir()
    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods,
                                        job=settings.job)
    assert readopt.read_state(str(old_pod), api, 't1') is None  # the program's first
    coordinator, controller = pod.supervise(settings, runner)
    readopt.keep_state(str(old_pod), controller, runner, secret=functools.partial(
        coordinator_job.write_state, api, 't1'))
    _until(lambda: controller.status()['worker/0'].restarts == 1, 'not restarted')
    assert api.objects['Pod', 't1-worker-0']['metadata']['ownerReferences'] == [{
        'apiVersion': 'batch/v1', 'kind': 'Job', 'name': 't1-coordinator',
        'uid': api.objects['Job', 't1-coordinator']['metadata']['uid']}]  # not the pod's
    for name in settings.nodes:
        coordinator.node_started(name, 10, 'pod', 'first')

    def kept():
        state = readopt.read_state(str(new_pod), api, 't1')
        return state is not None and {
            name: (status.state, status.restarts)
            for name, status in state['coordinator'].status().items()} == {
                'worker/0': (lp.NodeState.RUNNING, 1), 'other/0': (lp.NodeState.RUNNING, 0)}
    _until(kept, 'the state was not kept in the Secret')
    assert coordinator_job.pod_lost_only(api, 't1-coordinator')  # its SIGTERM stops nothing
    dead = threading.Event()
    runner.poll = lambda: dead.wait() and {}  # the old pod is gone
    created = len(api.calls)

    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods,
                                        job=settings.job)
    state = readopt.read_state(str(new_pod), api, 't1')
    readopted, controller = pod.supervise(settings, runner, readopt.resume(runner, state))
    try:
        assert controller.status()['worker/0'].restarts == 1
        readopted.node_started('worker/0', 10, 'pod', 'first')  # the node, reconnecting
        _until(lambda: sum(c[0] == 'list_pods' for c in api.calls[created:]) >= 3, 'no look')
        assert not [c for c in api.calls[created:] if c[0] in ('create', 'delete')]
        assert controller.status()['worker/0'].restarts == 1  # the same process: no restart
    finally:
        dead.set()
        controller.stop()
    api.objects['Job', 't1-coordinator']['metadata']['deletionTimestamp'] = 'now'
    assert not coordinator_job.pod_lost_only(api, 't1-coordinator')  # the program's deletion
    api.delete('Job', 't1-coordinator')
    assert not coordinator_job.pod_lost_only(api, 't1-coordinator')


def test_attach_recover_says_what_the_coordinator_job_did():
    """Kubernetes makes a detached program's coordinator pods (its Job): `attach --recover`
    starts nothing, it says how the Job stands."""
    api = SelectingApi()
    said = coordinator_job.recovery(api, 't1-coordinator')
    assert 'Job t1-coordinator is gone (the program was deleted)' in said
    plan = _plan(_program(), create_rbac=True)
    api.create(next(d for d in plan.documents if d['kind'] == 'Job'))
    said = coordinator_job.recovery(api, 't1-coordinator')
    assert 'was never lost; no pod of it runs right now' in said, said
    api.objects['Job', 't1-coordinator']['status'] = {'failed': 2}
    api.create({**plan.pod_document('t1-coordinator'), 'metadata': {
        **plan.pod_document('t1-coordinator')['metadata'], 'name': 't1-coordinator-x2b4q'}})
    said = coordinator_job.recovery(api, 't1-coordinator')
    assert 'lost its pod 2 times (back-off limit 6); its pod t1-coordinator-x2b4q runs' in said
    api.objects['Job', 't1-coordinator']['status'] = {'failed': 7, 'conditions': [
        {'type': 'Failed', 'status': 'True', 'reason': 'BackoffLimitExceeded'}]}
    said = coordinator_job.recovery(api, 't1-coordinator')
    assert 'failed (BackoffLimitExceeded): its coordinator failed 7 times' in said, said
    assert 'The nodes stop after the supervisor grace' in said


def _node_pod(name: str, node: str):
    return {'kind': 'Pod', 'metadata': {
        'name': name, 'labels': {names.PROGRAM_LABEL: 't1', names.ROLE_LABEL: 'node'},
        'annotations': {names.NODE_NAME_ANNOTATION: node}}, 'spec': {}}


def test_a_deletion_for_a_removed_node_never_hits_the_newer_node_that_took_its_pod_name():
    """Removed node worker/2's pod t1-worker-2 ended and was deleted; added node worker/4 got
    the free name t1-worker-2. A late kill of worker/2 (its removal's notice passed, say) must
    not delete worker/4's pod, and worker/2 must not read worker/4's pod as its own: every
    deletion for a node names its pod's uid (a precondition). Without it, the kill deleted
    worker/4's pod (the in-cluster flake of the grow-and-shrink test below)."""
    api = SelectingApi()
    first = api.create(_node_pod('t1-worker-2', 'worker/2'))
    runner = in_cluster.InClusterRunner(api, 't1', {'t1-worker-2': first},
                                        {'worker/2': 't1-worker-2'})
    assert runner.poll() == {'worker/2': None}  # (its uid is known from now on)
    api.delete('Pod', 't1-worker-2')
    newer = api.create(_node_pod('t1-worker-2', 'worker/4'))  # as `add_executable` makes it
    assert newer['metadata']['uid'] != first['metadata']['uid']
    runner._listed_at = None  # pylint: disable=protected-access  (list again now)
    assert runner.poll() == {'worker/2': -9}  # its own pod is gone
    runner.kill(['worker/2'])
    assert ('Pod', 't1-worker-2') in api.objects, api.calls
    assert api.objects['Pod', 't1-worker-2']['metadata']['uid'] == newer['metadata']['uid']


def test_a_detached_launcher_follows_the_pod_its_coordinator_pod_creates_again(fake):
    """...and leaves resizing to the coordinator pod, whose Job owns the node pods."""
    fake.statuses['t1-worker-0'] = [running(), exited(1, 'Error')]
    program = _program()
    asked = []
    program.set_scaling_policy(lambda *args: asked.append(args), interval=0.01)
    controller = launch(program, detach=True, create_rbac=True)
    for change in (lambda: controller.resize('worker', 2),
                   lambda: controller.remove_node('other/0')):
        with pytest.raises(RuntimeError, match='runs detached, supervised by its coordinator pod'):
            change()
    coordinator = fake.objects[('Job', 't1-coordinator')]['metadata']  # (here, it makes no pod)
    assert fake.objects[('Pod', 't1-other-0')]['metadata']['ownerReferences'] == [
        {'apiVersion': 'batch/v1', 'kind': 'Job', 'name': 't1-coordinator',
         'uid': coordinator['uid']}]
    assert coordinator['ownerReferences'][0]['kind'] == 'ConfigMap'  # the root
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
    assert asked == []  # many looks at the pods later: the coordinator pod runs the policy



class Counter:
    """What the workers of `_elastic_program` call."""

    def __init__(self):
        self.calls = 0

    def add(self) -> int:
        self.calls += 1
        return self.calls


def _work(counter) -> None:
    del counter
    lp.stop_event().wait()


def _size_in_file(path: str, metrics, now, sizes):
    """A scaling policy: the size of group worker written in file `path`, if any."""
    del metrics, now, sizes
    try:
        with open(path) as f:
            return {'worker': int(f.read())}
    except FileNotFoundError:
        return {}


def _elastic_program(size_file: str) -> lp.Program:
    """server/0, called by worker/0 and worker/1, an elastic group of at most 4 nodes whose
    size a scaling policy reads from `size_file`."""
    program = lp.Program('grow')
    server = program.add_node(lp.CourierNode(Counter), label='server')
    with program.group('worker', elastic=lp.Elastic(
            make_node=lambda: lp.PyNode(_work, server), max_size=4)):
        for _ in range(2):
            program.add_node(lp.PyNode(_work, server))
    program.set_scaling_policy(functools.partial(_size_in_file, size_file), interval=0.1)
    return program


class SimulatedKubelet:
    """Stands in for podman behind `PodmanApiServer`: each node pod it is given runs as a thread
    doing what a node's worker does with the coordinator (a joining node joins; it starts, waits
    until told to stop, takes `stop_seconds` of its group to stop, finishes, and its pod ends
    with exit code 0); deleting the coordinator pod stops the program as its SIGTERM does,
    waiting for it up to the grace period."""

    def __init__(self, stop_seconds):
        self.pods = {}
        self.stop_seconds = stop_seconds  # group -> seconds its nodes take to stop
        self.events = []   # ('told' or 'ended', node) in order
        self.deleted = []  # (pod, whether its node still ran) in the order of deletion
        self.coordinator = self.controller = None
        self._killed = {}
        self._lock = threading.Lock()
        self._threads = []

    def create(self, document):
        document = copy.deepcopy(document)
        kind, name = document['kind'], document['metadata']['name']
        with self._lock:
            document['metadata']['uid'] = f'uid-{kind}-{name}-{len(self._threads)}'
            if kind != 'Pod':
                return document
            if name in self.pods:
                raise AlreadyExists(f'Pod {name} is terminating')
            self.pods[name] = {**document, 'status': running()}
            if document['metadata']['labels'][names.ROLE_LABEL] == 'node':
                self._killed[name] = threading.Event()
                thread = threading.Thread(target=self._run_node, args=(document,), daemon=True)
                self._threads.append(thread)
                thread.start()
        return document

    def _run_node(self, document) -> None:
        name = document['metadata']['name']
        node = document['metadata']['annotations'][names.NODE_NAME_ANNOTATION]
        command = document['spec']['initContainers'][0]['command']
        if '--join' in command:
            joining = names.Joining.from_json(command[command.index('--join') + 1])
            self.coordinator.join(joining.node, joining.policy, joining.endpoints)
        self.coordinator.node_started(node, 1, name)
        while not self.coordinator.wait_for_stop(0.05, node):
            if self._killed[name].is_set():
                return
        self.events.append(('told', node))
        time.sleep(self.stop_seconds.get(node.split('/')[0], 0.0))
        self.events.append(('ended', node))
        self.coordinator.node_finished(node)
        with self._lock:
            if name in self.pods:
                self.pods[name]['status'] = exited(0)

    def delete(self, kind, name, grace_period_seconds=None):
        if kind != 'Pod':
            return
        if self.pods[name]['metadata']['labels'][names.ROLE_LABEL] == 'coordinator':
            self.coordinator.request_stop('the coordinator pod was deleted')
            self.controller.wait(timeout=grace_period_seconds, raise_error=False)
        with self._lock:
            pod = self.pods.pop(name)
            ran = 'running' in pod['status']['containerStatuses'][0]['state']
            self.deleted.append((name, ran))
            if name in self._killed:
                self._killed[name].set()

    def list_pods(self, selector):
        del selector
        with self._lock:
            return copy.deepcopy(list(self.pods.values()))

    def close(self):
        for killed in self._killed.values():
            killed.set()
        for thread in self._threads:
            thread.join(5)


def test_a_detached_program_grows_shrinks_and_stops_in_graph_order_from_its_coordinator_pod(
        tmp_path, monkeypatch, capsys):
    """A detached launch with create_rbac=True, through the real client against the stand-in
    API server: the controller in the coordinator pod grows group worker 2 -> 4 and back to 2 as
    its scaling policy says (creating and deleting pods, named as the Role allows), then to 3 as
    a node's lp.resize asks (reusing a pod name); deleting the program stops it in graph order:
    the workers first, the server they call once they have ended, and no pod of a running node
    is deleted."""
    monkeypatch.setattr(in_cluster.InClusterRunner, 'POLL_SECONDS', 0.05)
    size_file = tmp_path / 'size'
    plan = _plan(_elastic_program(str(size_file)), create_rbac=True, notice_period=2.0)
    role = next(d for d in plan.documents if d['kind'] == 'Role')
    added = [f't1-worker-{k}' for k in range(2, 6)]
    assert role['rules'][2:] == [
        {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['delete'], 'resourceNames': [
            't1-server-0', 't1-worker-0', 't1-worker-1', *added]},
        {'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['create']},
        {'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['delete'],
         'resourceNames': [f'{pod}-spec-0' for pod in added]},
        {'apiGroups': [''], 'resources': ['pods/log'], 'verbs': ['get'], 'resourceNames': [
            't1-server-0', 't1-worker-0', 't1-worker-1', *added]},
        *coordinator_job.rbac_rules('t1')]
    settings = _settings(plan)
    assert settings.calls == {'worker/0': ['server/0'], 'worker/1': ['server/0']}
    pods_dir = tmp_path / 'pods'  # RUN-pods as the coordinator pod mounts it
    pods_dir.mkdir()
    configmap = next(d for d in plan.documents if d['metadata']['name'] == 't1-pods')
    for key, data in configmap['binaryData'].items():
        (pods_dir / key).write_bytes(base64.b64decode(data))
    kubelet = SimulatedKubelet({'worker': 0.3})  # workers flush something to the server
    with PodmanApiServer(kubelet, tmp_path) as server:
        api = kubernetes.KubernetesApi('default', kubeconfig=server.kubeconfig())
        runner = pod.in_cluster_runner(settings, api=api, pods_dir=str(pods_dir))
        coordinator, controller = pod.supervise(settings, runner)
        kubelet.coordinator, kubelet.controller = coordinator, controller
        kubernetes_launcher._create(api, plan, nodes_owned_by_coordinator=True)

        def pods():
            return {name for kind, name in server.objects() if kind == 'Pod'}

        def spec_configmaps():
            return {name for kind, name in server.objects()
                    if kind == 'ConfigMap' and name.startswith('t1-worker-')}

        job = {'apiVersion': 'batch/v1', 'kind': 'Job', 'name': 't1-coordinator',
               'uid': server.read('Job', 't1-coordinator')['metadata']['uid']}
        coordinator_pod = next(name for name in kubelet.pods  # the Job's, a generated name
                               if name.startswith('t1-coordinator-'))
        size_file.write_text('4')
        _until(lambda: {'t1-worker-2', 't1-worker-3'} <= pods()
               and coordinator.running() == ['server/0', 'worker/0', 'worker/1', 'worker/2',
                                             'worker/3'], 'the group did not grow')
        assert controller.group_size('worker') == 4
        for name in ('t1-worker-2', 't1-worker-3', 't1-worker-0'):
            assert kubelet.pods[name]['metadata']['ownerReferences'] == [job]  # not its pod
        assert {'t1-worker-2-spec-0', 't1-worker-3-spec-0'} <= spec_configmaps()
        size_file.write_text('2')
        _until(lambda: not {'t1-worker-2', 't1-worker-3'} & pods()
               and not {'t1-worker-2-spec-0', 't1-worker-3-spec-0'} & spec_configmaps(),
               'the group did not shrink')
        assert controller.status()['worker/3'].state is lp.NodeState.REMOVED
        assert [(d.group, d.size, d.wanted, d.target) for d in controller.scaling_log] == [
            ('worker', 2, 4, 4), ('worker', 4, 2, 2)]
        size_file.unlink()

        with pytest.raises(ValueError, match='its lp.Elastic allows 0 to 4'):
            coordinator.request_size('worker', 5)  # a node's lp.resize beyond the bounds
        coordinator.request_size('worker', 3)
        _until(lambda: coordinator.running() == ['server/0', 'worker/0', 'worker/1', 'worker/4']
               and controller.status()['worker/4'].state is lp.NodeState.RUNNING,
               'no node for the resize')
        assert 't1-worker-2' in pods(), server.deletions  # the first free name again
        assert kubelet.pods['t1-worker-2']['metadata']['annotations'] == {
            names.NODE_NAME_ANNOTATION: 'worker/4'}

        server.delete('ConfigMap', 't1')  # kubectl delete configmap t1
        assert controller.done and server.objects() == [], server.deletions
    told_server = kubelet.events.index(('told', 'server/0'))
    assert all(kubelet.events.index(('ended', worker)) < told_server  # once they have ended
               for worker in ('worker/0', 'worker/1', 'worker/4')), kubelet.events
    assert {status.state for status in controller.status().values()} == {
        lp.NodeState.FINISHED, lp.NodeState.REMOVED}
    assert kubelet.deleted[kubelet.deleted.index((coordinator_pod, True)) + 1:] and not [
        name for name, ran in kubelet.deleted if ran and name != coordinator_pod]
    out = capsys.readouterr().out
    assert 'created the pod t1-worker-3 of worker/3, added to group worker' in out
    assert 'deleted the pod t1-worker-3 of removed node worker/3' in out
    assert 'a node asked for group worker to have 3 nodes' in out
