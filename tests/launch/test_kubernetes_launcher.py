"""The kubernetes launcher against a fake API that records calls and plays back pod states.

Also the thin API layer itself (`KubernetesApi`), with the real `kubernetes` client talking to a
canned HTTP server on loopback: missing kubeconfig, unreachable server, missing namespace,
forbidden.
"""
from __future__ import annotations

import base64
import copy
import http.server
import io
import json
import pickle
import subprocess
import sys
import threading
import time
import urllib.parse

import cloudpickle
import kubernetes_validate
import pytest

import courier
import launchpad as lp
from launchpad.launch import kubernetes
from launchpad.launch.kubernetes import api as kubernetes_api
from launchpad.launch.kubernetes import launcher as kubernetes_launcher
from launchpad.launch.kubernetes import names, pod
from launchpad.policy import NodePolicy
from tests import elastic_program as elastic
from tests.launch import kubernetes_programs

pytestmark = pytest.mark.timeout(60)


def running():
    return {'phase': 'Running', 'containerStatuses': [{'name': 'node', 'state': {'running': {}}}]}


def exited(code: int, reason: str = 'Completed'):
    return {'phase': 'Succeeded' if code == 0 else 'Failed',
            'containerStatuses': [{'name': 'node', 'state': {'terminated': {
                'exitCode': code, 'reason': reason}}}]}


class FakeApi:
    """Stands in for `KubernetesApi`: records every call, keeps created objects, and answers
    `list_pods` with the statuses a test scripted for each pod (one per call, the last repeats)."""

    def __init__(self):
        self.calls = []
        self.objects = {}
        self.statuses = {}
        self.logs = {}
        self.events_of = {}
        self.create_errors = {}
        self.namespace_error = None
        self.lock = threading.Lock()

    def check_namespace(self):
        self.calls.append(('check_namespace',))
        if self.namespace_error is not None:
            raise self.namespace_error

    def create(self, document):
        key = (document['kind'], document['metadata']['name'])
        with self.lock:
            self.calls.append(('create',) + key)
            if key in self.create_errors:
                raise self.create_errors[key]
            created = copy.deepcopy(document)
            created['metadata']['uid'] = f'uid-{len(self.calls)}'
            self.objects[key] = created
            return created

    def delete(self, kind, name, grace_period_seconds=None, uid=None):
        with self.lock:
            self.calls.append(('delete', kind, name, grace_period_seconds))
            if uid is None or (self.objects.get((kind, name)) or {}).get(
                    'metadata', {}).get('uid') == uid:  # else: the precondition fails
                self.objects.pop((kind, name), None)

    def read(self, kind, name):
        with self.lock:
            self.calls.append(('read', kind, name))
            return copy.deepcopy(self.objects.get((kind, name)))

    def patch_secret(self, name, data):
        with self.lock:
            self.calls.append(('patch_secret', name))
            self.objects['Secret', name].setdefault('data', {}).update(data)

    def list_pods(self, selector):
        with self.lock:
            self.calls.append(('list_pods', selector))
            pods = []
            for (kind, name), document in self.objects.items():
                if kind != 'Pod':
                    continue
                script = self.statuses.setdefault(name, [running()])
                status = script.pop(0) if len(script) > 1 else script[0]
                pods.append({**document, 'status': status})
            return pods

    def read_log(self, pod, container, tail_lines=None):
        self.calls.append(('read_log', pod, container, tail_lines))
        lines = self.logs.get(pod, [])
        return b''.join(lines[-tail_lines:] if tail_lines else lines).decode()

    def open_log(self, pod, container):
        self.calls.append(('open_log', pod, container))
        return io.BytesIO(b''.join(self.logs.get(pod, [])))

    def events(self, pod):
        self.calls.append(('events', pod))
        return self.events_of.get(pod, [])

    def deleted(self):
        return [call[1:] for call in self.calls if call[0] == 'delete']


@pytest.fixture
def fake(monkeypatch):
    api = FakeApi()
    monkeypatch.setattr(kubernetes_launcher.PodRunner, 'POLL_SECONDS', 0.0)
    lp.register_launcher('kubernetes_fake', lambda: kubernetes.KubernetesLauncher(lambda _: api))
    return api


def launch(program, **options):
    options.setdefault('image', 'registry.example/agent:v1')
    options.setdefault('name', 't1')
    options.setdefault('notice_period', 0.5)
    return lp.launch(program, launch_type='kubernetes_fake', **options)


def test_a_program_that_finishes_is_followed_then_all_its_objects_are_deleted(fake, capfd):
    fake.statuses = {'t1-queue-0': [running(), exited(0)],
                     't1-producer-0': [running(), exited(0)],
                     't1-producer-1': [running(), exited(0)],
                     't1-consumer-0': [running(), running(), exited(0)]}
    fake.logs = {'t1-consumer-0': [b'consumed 10 items summing to 20\n']}
    controller = launch(kubernetes_programs.producer_consumer())
    assert controller.wait(timeout=20)
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}
    created = [call[1:] for call in fake.calls if call[0] == 'create']
    assert created[0] == ('ConfigMap', 't1')  # the root first: everything else is owned by it
    assert ('Pod', 't1-coordinator') in created and len(created) == 3 + 1 + 2 * 4
    assert fake.objects == {}  # the launcher deleted everything at the end
    deleted = {(kind, name) for kind, name, _ in fake.deleted()}
    assert deleted == set(created)
    assert '[consumer-0] consumed 10 items summing to 20' in capfd.readouterr().out


class _LaggingLog(io.BytesIO):
    """A log stream whose last line arrives `lag` seconds after it is opened."""

    def __init__(self, data: bytes, lag: float):
        super().__init__(data)
        self._lag = lag

    def readline(self, *args):
        line = super().readline(*args)
        if line and self.tell() == len(self.getvalue()):
            time.sleep(self._lag)
        return line


def test_the_last_lines_of_a_lagging_log_are_printed_before_wait_returns(fake, capfd):
    fake.statuses = {f't1-{n}': [running(), exited(0)] for n in (
        'queue-0', 'producer-0', 'producer-1', 'consumer-0')}
    fake.logs = {'t1-consumer-0': [b'starting\n', b'consumed 10 items summing to 20\n']}
    fake.open_log = lambda pod, container: _LaggingLog(b''.join(fake.logs.get(pod, [])), 3.0)
    controller = launch(kubernetes_programs.producer_consumer())
    assert controller.wait(timeout=20)
    # The poll's own wait for the follower (2 s) is shorter than the lag.
    assert '[consumer-0] consumed 10 items summing to 20' in capfd.readouterr().out


def test_the_logs_of_pods_that_end_together_are_waited_for_together(fake, monkeypatch):
    """Four pods end in one poll while their logs stay open: the poll waits for their last
    lines FOLLOWER_WAIT seconds in all, not that for each pod, one after another."""
    fake.statuses = {f't1-{n}': [running(), exited(0)] for n in (
        'queue-0', 'producer-0', 'producer-1', 'consumer-0')}
    ended, joins = threading.Event(), []  # (the logs end after the poll's four waits)
    fake.open_log = lambda pod, container: io.BufferedReader(_HeldLog(ended))

    class Follower(threading.Thread):
        def join(self, timeout=None):
            super().join(timeout)
            joins.append(timeout)
            if len(joins) == 4:
                ended.set()
    monkeypatch.setattr(kubernetes_launcher, 'threading',
                        type('Threading', (), {'Thread': Follower, 'Lock': threading.Lock}))
    try:
        assert launch(kubernetes_programs.producer_consumer()).wait(timeout=50)
    finally:
        ended.set()
    assert sum(joins[:4]) <= kubernetes_launcher.PodRunner.FOLLOWER_WAIT + 0.1, joins


class _HeldLog(io.RawIOBase):
    """A log stream that ends once `ended` is set."""

    def __init__(self, ended: threading.Event):
        super().__init__()
        self._ended = ended

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self._ended.wait()
        return 0


def test_objects_are_owned_by_the_root_so_deleting_it_deletes_the_program(fake):
    fake.statuses = {f't1-{n}': [exited(0)] for n in ('queue-0', 'producer-0', 'producer-1',
                                                       'consumer-0')}
    snapshot = {}
    original = fake.create

    def create(document):
        created = original(document)
        snapshot[(document['kind'], document['metadata']['name'])] = copy.deepcopy(created)
        return created

    fake.create = create
    launch(kubernetes_programs.producer_consumer()).wait(timeout=20)
    root_uid = snapshot[('ConfigMap', 't1')]['metadata']['uid']
    for key, document in snapshot.items():
        labels = document['metadata']['labels']
        assert labels[kubernetes.PROGRAM_LABEL] == 't1'
        if key != ('ConfigMap', 't1'):
            assert document['metadata']['ownerReferences'] == [
                {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 't1', 'uid': root_uid}]


def test_a_failing_pod_ends_the_program_with_its_node_name_exit_reason_and_log_tail(fake):
    fake.statuses = {'t1-broken-0': [running(), exited(1, 'Error')]}
    fake.logs = {'t1-broken-0': [b'Traceback (most recent call last):\n',
                                 b'ValueError: the reward went negative\n']}
    controller = launch(kubernetes_programs.failing())
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=20)
    assert failure.value.node_name == 'broken/0'
    assert 'its pod t1-broken-0 exited with code 1 (Error)' in failure.value.message
    assert 'ValueError: the reward went negative' in failure.value.remote_traceback
    # The stop went to the cluster by deleting the coordinator gracefully (notice period + 5 s);
    # the nodes that did not end within the notice period were deleted at once.
    deleted = fake.deleted()
    assert deleted.index(('Pod', 't1-coordinator', 6)) < deleted.index(('Pod', 't1-queue-0', 0))
    assert fake.objects == {}
    assert controller.status()['queue/0'].state is lp.NodeState.KILLED


def test_image_pull_failure_is_reported_from_the_pod_events(fake):
    pulling = {'phase': 'Pending', 'containerStatuses': [{
        'name': 'node', 'image': 'registry.example/agent:v1',
        'state': {'waiting': {'reason': 'ImagePullBackOff', 'message': 'Back-off pulling'}}}]}
    fake.statuses = {'t1-queue-0': [pulling]}
    fake.events_of = {'t1-queue-0': [
        {'type': 'Normal', 'reason': 'Pulling', 'message': 'Pulling image'},
        {'type': 'Warning', 'reason': 'Failed',
         'message': 'Failed to pull image "registry.example/agent:v1": manifest unknown'}]}
    with pytest.raises(lp.NodeFailedError) as failure:
        launch(kubernetes_programs.producer_consumer()).wait(timeout=20)
    message = failure.value.message
    assert failure.value.node_name == 'queue/0'
    assert "cannot pull image 'registry.example/agent:v1'" in message
    assert 'manifest unknown' in message and 'imagePullSecrets' in message
    assert ('events', 't1-queue-0') in fake.calls


def test_an_unschedulable_pod_fails_the_program_with_the_schedulers_reason(fake, caplog):
    pending = {'phase': 'Pending', 'conditions': [{
        'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
        'message': '0/3 nodes are available: 3 Insufficient nvidia.com/gpu.'}]}
    fake.statuses = {'t1-queue-0': [pending]}
    with pytest.raises(lp.NodeFailedError) as failure:
        launch(kubernetes_programs.producer_consumer(), pending_timeout=0.3).wait(timeout=20)
    assert 'could not be scheduled for 0.3 s: 0/3 nodes are available: 3 Insufficient ' \
           'nvidia.com/gpu.' in failure.value.message
    assert 'cannot be scheduled yet' in caplog.text  # warned at once, failed after the timeout


def test_a_failing_init_container_is_reported_with_its_log(fake):
    failed = {'phase': 'Failed', 'initContainerStatuses': [{
        'name': 'wait-for-coordinator', 'state': {'terminated': {'exitCode': 1,
                                                                  'reason': 'Error'}}}]}
    fake.statuses = {'t1-consumer-0': [failed]}
    fake.logs = {'t1-consumer-0': [b'launchpad: the coordinator ... was not reachable\n']}
    with pytest.raises(lp.NodeFailedError) as failure:
        launch(kubernetes_programs.producer_consumer()).wait(timeout=20)
    assert 'init container wait-for-coordinator of pod t1-consumer-0 exited with code 1' in \
           failure.value.message
    assert 'was not reachable' in failure.value.remote_traceback


def test_a_pod_deleted_behind_the_launchers_back_fails_the_program(fake):
    controller = launch(kubernetes_programs.producer_consumer())
    fake.delete('Pod', 't1-producer-1')
    with pytest.raises(lp.NodeFailedError, match='its pod t1-producer-1 was deleted'):
        controller.wait(timeout=20)


def test_stop_deletes_the_coordinator_gracefully_then_kills_what_remains(fake):
    controller = launch(kubernetes_programs.producer_consumer(), notice_period=0.3)
    controller.stop(timeout=20)
    assert controller.done
    deleted = fake.deleted()
    assert deleted[0] == ('Pod', 't1-coordinator', 6)
    assert ('Pod', 't1-queue-0', 0) in deleted
    assert {s.state for s in controller.status().values()} == {lp.NodeState.KILLED}
    assert fake.objects == {}


def test_a_failed_creation_removes_what_was_created(fake):
    fake.create_errors[('Pod', 't1-producer-0')] = kubernetes.KubernetesError(
        "Cannot create Pod t1-producer-0 in namespace 'default': forbidden by RBAC")
    with pytest.raises(kubernetes.KubernetesError, match='forbidden by RBAC'):
        launch(kubernetes_programs.producer_consumer())
    assert fake.objects == {}
    assert ('Pod', 't1-coordinator', 0) in fake.deleted()


def test_the_namespace_is_checked_before_anything_is_created(fake):
    fake.namespace_error = kubernetes.KubernetesError("Namespace 'nope' does not exist.")
    with pytest.raises(kubernetes.KubernetesError, match='does not exist'):
        launch(kubernetes_programs.producer_consumer(), namespace='nope')
    assert [c for c in fake.calls if c[0] == 'create'] == []


def test_detached_launch_prints_how_to_follow_and_delete_and_keeps_the_objects(fake, capsys):
    fake.statuses = {f't1-{n}': [exited(0)] for n in ('queue-0', 'producer-0', 'producer-1',
                                                       'consumer-0')}
    controller = launch(kubernetes_programs.producer_consumer(), detach=True)
    out = capsys.readouterr().out
    assert 'Launched t1 in namespace default (5 ConfigMap, 1 Secret, 1 Service, 5 Pod)' in out
    assert 'kubectl -n default logs -f --prefix -l launchpad.dev/program=t1' in out
    assert 'kubectl -n default delete configmap t1' in out
    assert controller.wait(timeout=20)
    assert fake.deleted() == [] and len(fake.objects) == 12
    assert not [c for c in fake.calls if c[0] == 'open_log']


def test_other_terminals_are_refused(fake):
    with pytest.raises(ValueError, match="Unknown terminal 'tmux_session' for launch type kubernetes"):
        launch(kubernetes_programs.producer_consumer(), terminal='tmux_session')


# ---------------------------------------------------------------------------------------------
# The real client against canned answers.


class _CannedApiServer:
    """An HTTP server on loopback answering (method, path) with canned JSON, recording requests."""

    def __init__(self, answers):
        self.requests = []
        self.queries = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(length) if length else b''
                outer.requests.append((self.command, self.path.split('?')[0], body))
                outer.queries.append(self.path.partition('?')[2])
                status, payload = answers.get((self.command, self.path.split('?')[0]),
                                              (404, {'message': 'not found'}))
                data = payload if isinstance(payload, bytes) else json.dumps(
                    {'kind': 'Status', 'apiVersion': 'v1', **payload}).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'text/plain' if isinstance(payload, bytes)
                                 else 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _kubeconfig(tmp_path, server_url):
    path = tmp_path / 'kubeconfig'
    path.write_text(json.dumps({
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'test',
        'clusters': [{'name': 'test', 'cluster': {'server': server_url}}],
        'users': [{'name': 'me', 'user': {'token': 'not-a-real-token'}}],
        'contexts': [{'name': 'test', 'context': {'cluster': 'test', 'user': 'me'}}]}))
    return str(path)


@pytest.fixture
def canned(tmp_path, monkeypatch):
    servers = []

    def start(answers):
        servers.append(_CannedApiServer(answers))
        monkeypatch.setenv('KUBECONFIG', _kubeconfig(tmp_path, servers[-1].url))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_no_kubeconfig_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'missing'))
    with pytest.raises(kubernetes.KubernetesError, match='No usable Kubernetes configuration.*'
                                                         'Set KUBECONFIG'):
        lp.launch(kubernetes_programs.producer_consumer(), launch_type='kubernetes', image='i')


def test_an_unreachable_api_server_is_a_clear_error(tmp_path, monkeypatch):
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv('KUBECONFIG', _kubeconfig(tmp_path, f'http://127.0.0.1:{closed_port}'))
    api = kubernetes.KubernetesApi('default')
    api._client.configuration.retries = 0  # pylint: disable=protected-access
    with pytest.raises(kubernetes.KubernetesError,
                       match=f'Cannot reach the Kubernetes API server at http://127.0.0.1:'
                             f'{closed_port}'):
        api.check_namespace()


def test_a_missing_namespace_is_a_clear_error(canned):
    canned({('GET', '/api/v1/namespaces/research'): (404, {'message': 'namespaces "research" '
                                                                      'not found'})})
    with pytest.raises(kubernetes.KubernetesError,
                       match="Namespace 'research' does not exist. Create it with `kubectl "
                             "create namespace research`"):
        lp.launch(kubernetes_programs.producer_consumer(), launch_type='kubernetes', image='i',
                  namespace='research')


def test_forbidden_by_rbac_is_a_clear_error_and_nothing_is_left(canned):
    server = canned({
        ('GET', '/api/v1/namespaces/default'): (403, {'message': 'cannot get namespaces'}),
        ('POST', '/api/v1/namespaces/default/configmaps'): (
            403, {'message': 'configmaps is forbidden: User "me" cannot create resource '
                             '"configmaps"'})})
    with pytest.raises(kubernetes.KubernetesError) as error:
        lp.launch(kubernetes_programs.producer_consumer(), launch_type='kubernetes', image='i')
    assert "Cannot create ConfigMap" in str(error.value)
    assert "forbidden by RBAC (configmaps is forbidden: User \"me\" cannot create" in \
           str(error.value)
    posted = json.loads(server.requests[-1][2])
    assert posted['kind'] == 'ConfigMap' and posted['metadata']['labels'][
        kubernetes.PROGRAM_LABEL].startswith('producer-consumer-')


def test_the_api_layer_sends_plain_dicts_and_reads_pods_back(canned):
    status = exited(3, 'Error')
    status['containerStatuses'][0].update(image='i', imageID='', ready=False, restartCount=0)
    pod_list = {'kind': 'PodList', 'apiVersion': 'v1', 'items': [
        {'metadata': {'name': 'p', 'labels': {'a': 'b'}}, 'status': status}]}
    server = canned({('GET', '/api/v1/namespaces/default/pods'): (200, pod_list),
                     ('DELETE', '/api/v1/namespaces/default/pods/p'): (200, {}),
                     ('DELETE', '/api/v1/namespaces/default/pods/gone'): (404, {}),
                     ('GET', '/api/v1/namespaces/default/pods/p/log'): (200, b'one\ntwo\n')})
    api = kubernetes.KubernetesApi('default')
    pods = api.list_pods('launchpad.dev/program=x')
    assert pods[0]['metadata']['name'] == 'p'
    assert kubernetes_api.terminated(pods[0], 'node')['exitCode'] == 3
    api.delete('Pod', 'p', grace_period_seconds=0)
    api.delete('Pod', 'gone')  # already gone: fine
    log = api.open_log('p', 'node')
    assert [log.readline(), log.readline(), log.readline()] == [b'one\n', b'two\n', b'']
    log.close()
    assert api.read_log('p', 'node', tail_lines=5) == 'one\ntwo\n'
    methods = [(method, path) for method, path, _ in server.requests]
    assert methods == [('GET', '/api/v1/namespaces/default/pods'),
                       ('DELETE', '/api/v1/namespaces/default/pods/p'),
                       ('DELETE', '/api/v1/namespaces/default/pods/gone'),
                       ('GET', '/api/v1/namespaces/default/pods/p/log'),
                       ('GET', '/api/v1/namespaces/default/pods/p/log')]
    follow = urllib.parse.parse_qs(server.queries[3])
    # The API server takes a boolean parameter as true unless it is '0' or 'false' in any case;
    # the client for Python 3.9 (kubernetes 35) sends 'True', later ones 'true'.
    assert follow.pop('follow')[0].lower() == 'true' and follow == {'container': ['node']}
    assert urllib.parse.parse_qs(server.queries[4]) == {'container': ['node'],
                                                        'tailLines': ['5']}
    assert 'gracePeriodSeconds=0' in server.queries[1]
    assert 'propagationPolicy=Background' in server.queries[1]
    assert urllib.parse.parse_qs(server.queries[0]) == {'labelSelector': [
        'launchpad.dev/program=x']}


def test_importing_launchpad_does_not_import_the_kubernetes_client():
    code = ('import sys, launchpad as lp; from launchpad.launch import launcher; '
            'launcher.load_builtin_launchers(); '
            'assert "kubernetes" in launcher.registered_launch_types(); '
            'assert "kubernetes" not in sys.modules, "imported"')
    subprocess.run([sys.executable, '-c', code], check=True, timeout=60)


def test_a_missing_client_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'kubernetes', None)
    with pytest.raises(ImportError, match=r"pip install 'launchpad-ml\[kubernetes\]'"):
        lp.launch(kubernetes_programs.producer_consumer(), launch_type='kubernetes', image='i')


def test_the_coordinator_pod_notices_a_node_pod_that_died_without_reporting(fake, capsys):
    coordinator = pod.PodCoordinator(['queue/0', 'consumer/0'])
    watcher = pod.PodWatcher('t1', 'default', coordinator)
    assert 'not watching the node pods' in capsys.readouterr().out  # no cluster here
    watcher._api = fake  # pylint: disable=protected-access
    fake.objects[('Pod', 't1-queue-0')] = {'metadata': {
        'name': 't1-queue-0', 'annotations': {kubernetes.NODE_NAME_ANNOTATION: 'queue/0'}}}
    fake.statuses['t1-queue-0'] = [exited(137, 'OOMKilled')]
    watcher.check()
    assert coordinator.failure.node_name == 'queue/0'
    assert 'exit code 137' in coordinator.failure.message
    assert coordinator.stop_reason == 'node queue/0 failed'
    assert 'node queue/0: its pod ended (OOMKilled, exit code 137) without reporting' in \
           capsys.readouterr().out


def test_tls_is_refused_before_anything_is_created(fake):
    with pytest.raises(ValueError, match='tls= is not supported by the kubernetes'):
        launch(kubernetes_programs.producer_consumer(), tls=courier.TLSConfig())
    assert fake.calls == []


def _until(condition, what):
    """Waits (up to 20 s, for a loaded machine) until `condition()` holds."""
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_nodes_join_and_leave_a_running_program_as_pods_made_like_the_launchs(fake):
    # A node's lp.resize reaches the launcher as a line of the coordinator pod's log.
    fake.logs['t1-coordinator'] = [f'{names.SIZE_REQUEST}["actor", 3]\n'.encode()]
    controller = launch(elastic.build(driver=False))
    _until(lambda: ('Pod', 't1-actor-2') in fake.objects, 'the group did not grow')
    added, first = fake.objects[('Pod', 't1-actor-2')], fake.objects[('Pod', 't1-actor-1')]
    root = fake.objects[('ConfigMap', 't1')]
    for document in (added, fake.objects[('ConfigMap', 't1-actor-2-spec-0')]):
        assert document['metadata']['ownerReferences'] == [
            {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': 't1',
             'uid': root['metadata']['uid']}]
        assert document['metadata']['labels'][kubernetes.PROGRAM_LABEL] == 't1'
    assert added['metadata']['annotations'] == {kubernetes.NODE_NAME_ANNOTATION: 'actor/2'}
    assert added['spec']['containers'] == first['spec']['containers']  # image, env, token
    assert (added['spec']['subdomain'], added['spec']['hostname']) == ('t1', 't1-actor-2')
    wait = added['spec']['initContainers'][0]
    assert wait['command'][:-2] == first['spec']['initContainers'][0]['command']
    joining = names.Joining.from_json(wait['command'][-1])
    address = 't1-actor-2.t1.default.svc.cluster.local:7100'
    assert joining.node == 'actor/2' and list(joining.endpoints.values()) == [address]
    assert {'name': 'COURIER_AUTH_TOKEN', 'valueFrom': {'secretKeyRef': {
        'name': 't1-token', 'key': 'token'}}} in wait['env']
    _, payload = pickle.loads(base64.b64decode(
        fake.objects[('ConfigMap', 't1-actor-2-spec-0')]['binaryData']['spec']))
    spec = cloudpickle.loads(payload)
    assert address in spec.address_table.static.values()
    assert 't1-learner-0.t1.default.svc.cluster.local:7100' in spec.address_table.static.values()

    controller.remove_node('actor/2')  # a leave pod tells the coordinator pod
    _until(lambda: ('Pod', 't1-actor-2-leave') in fake.objects, 'no leave pod')
    leave = fake.objects[('Pod', 't1-actor-2-leave')]
    assert leave['spec']['containers'][0]['command'][-2:] == ['600.0', 'actor/2']
    for document in (added, leave):
        kubernetes_validate.validate(
            {k: v for k, v in document.items() if k != 'status'}, '1.32.0', strict=True)
    fake.statuses['t1-actor-2-leave'] = [exited(0)]
    fake.statuses['t1-actor-2'] = [exited(0)]
    _until(lambda: controller.status()['actor/2'].state is lp.NodeState.REMOVED, 'not removed')
    _until(lambda: ('Pod', 't1-actor-2') not in fake.objects
           and ('ConfigMap', 't1-actor-2-spec-0') not in fake.objects
           and ('Pod', 't1-actor-2-leave') not in fake.objects, 'its objects were not deleted')
    assert ('Pod', 't1-coordinator') in fake.objects and not controller.done
    assert controller.group_size('actor') == 2
    controller.stop(timeout=20)
    assert fake.objects == {}


def test_a_removed_node_is_killed_a_notice_period_after_its_leave_pod_told_it(fake):
    controller = launch(elastic.build(driver=False), notice_period=0.2)
    _until(lambda: controller.status()['actor/1'].state is lp.NodeState.RUNNING, 'not running')
    fake.statuses['t1-actor-1-leave'] = [running()] * 20 + [exited(0)]  # slow to tell it
    controller.remove_node('actor/1')
    _until(lambda: ('Pod', 't1-actor-1') not in fake.objects, 'not killed')
    deleted = [call[1:3] for call in fake.calls if call[0] == 'delete']
    assert deleted.index(('Pod', 't1-actor-1-leave')) < deleted.index(('Pod', 't1-actor-1'))
    _until(lambda: controller.status()['actor/1'].state is lp.NodeState.REMOVED, 'not removed')
    assert ('Pod', 't1-coordinator') in fake.objects  # a removal's kill is no program kill
    controller.stop(timeout=20)


def test_the_coordinator_pod_lets_added_nodes_join_and_says_size_requests(capsys):
    coordinator = pod.PodCoordinator(['learner/0', 'actor/0'])
    coordinator.set_node_addresses({'actor/0': ['a0']})
    coordinator.node_started('actor/0', 1, 'h')
    for _ in range(2):  # again for a restarted pod: nothing changes
        coordinator.join('actor/1', NodePolicy().to_json(), {'a1': 'p1.svc:7100'})
    coordinator.node_started('actor/1', 1, 'h')
    assert coordinator.members('actor') == [('actor/0', ['a0']), ('actor/1', ['a1'])]
    assert coordinator.lookup_address('a1', 0) == 'p1.svc:7100'
    coordinator.request_size('actor', 4)
    out = capsys.readouterr().out
    assert out.count('node actor/1 joins the program') == 1
    assert f'{names.SIZE_REQUEST}["actor", 4]\n' in out


def _idle():
    lp.stop_event().wait()


def test_an_added_nodes_pod_is_created_again_by_its_groups_restart_policy(fake):
    program = lp.Program('p')
    with program.group('actor', restart=lp.RestartPolicy(max_restarts=2, backoff=0.0),
                       elastic=lp.Elastic(make_node=lambda: lp.PyNode(_idle), max_size=3)):
        program.add_node(lp.PyNode(_idle))
    controller = launch(program)
    controller.resize('actor', 2)
    fake.statuses['t1-actor-1'] = [exited(1, 'Error'), running()]
    _until(lambda: controller.status()['actor/1'].restarts == 1, 'not restarted')
    assert [c for c in fake.calls if c[:3] == ('create', 'Pod', 't1-actor-1')] == [
        ('create', 'Pod', 't1-actor-1')] * 2
    assert '--join' in fake.objects[('Pod', 't1-actor-1')]['spec']['initContainers'][0]['command']
    controller.stop(timeout=20)
    assert fake.objects == {}
