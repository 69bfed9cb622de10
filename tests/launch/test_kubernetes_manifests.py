"""The kubernetes launcher's manifests: valid for Kubernetes 1.32 (strict), labelled, complete."""
from __future__ import annotations

import base64
import pickle
import socket
import subprocess
import sys

import cloudpickle
import kubernetes_validate
import pytest
import yaml

import launchpad as lp
from launchpad.launch import kubernetes
from launchpad.launch.kubernetes import manifests, names
from launchpad.process import spec as specs
from tests.launch import kubernetes_programs

_LOADER = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)
pytestmark = pytest.mark.timeout(60)


def _documents(program, **options):
    options.setdefault('image', 'registry.example/team/agent:v1')
    return list(yaml.load_all(kubernetes.program_to_manifests(program, **options), Loader=_LOADER))


def _validate(documents):
    for document in documents:
        kubernetes_validate.validate(document, '1.32.0', strict=True)


def _by_kind(documents, kind):
    return [d for d in documents if d['kind'] == kind]


def _spec_of(documents, pod_name):
    """The WorkerSpec a node pod runs, read back from its ConfigMap(s)."""
    parts = sorted((d for d in _by_kind(documents, 'ConfigMap')
                    if d['metadata']['name'].startswith(f'{pod_name}-spec-')),
                   key=lambda d: d['metadata']['name'])
    data = b''.join(base64.b64decode(d['binaryData']['spec']) for d in parts)
    _, payload = pickle.loads(data)
    return cloudpickle.loads(payload)


def test_every_manifest_validates_strictly_with_every_option():
    resources = {
        'queue': lp.KubernetesResources(cpu=2, memory='4Gi', gpus=1,
                                        node_selector={'pool': 'gpu'},
                                        tolerations=[{'key': 'nvidia.com/gpu',
                                                      'operator': 'Exists',
                                                      'effect': 'NoSchedule'}],
                                        env={'TF_CPP_MIN_LOG_LEVEL': '2',
                                             'WANDB_API_KEY': {'secretKeyRef': {
                                                 'name': 'wandb', 'key': 'api-key'}}},
                                        args={'learning_rate': 0.1}),
        'producer': lp.KubernetesResources(cpu='500m'),
    }
    documents = _documents(kubernetes_programs.producer_consumer(), resources=resources,
                           namespace='research', image_pull_policy='Always', create_rbac=True,
                           service_account='trainer', name='pc', port=9000,
                           cluster_domain='corp.local')
    _validate(documents)
    kinds = [d['kind'] for d in documents]
    assert kinds[:3] == ['ConfigMap', 'Secret', 'Service']
    assert kinds.count('Pod') == 4 and {'ServiceAccount', 'Role', 'RoleBinding'} <= set(kinds)
    assert kinds.count('Job') == 1  # the coordinator's pod: a Job's, as no launcher follows it
    queue = next(d for d in documents if d['metadata']['name'] == 'pc-queue-0')
    container = queue['spec']['containers'][0]
    assert container['resources'] == {'requests': {'cpu': '2', 'memory': '4Gi'},
                                      'limits': {'memory': '4Gi', 'nvidia.com/gpu': '1'}}
    assert queue['spec']['nodeSelector'] == {'pool': 'gpu'}
    assert queue['spec']['tolerations'][0]['key'] == 'nvidia.com/gpu'
    assert {'name': 'TF_CPP_MIN_LOG_LEVEL', 'value': '2'} in container['env']
    assert {'name': 'WANDB_API_KEY', 'valueFrom': {'secretKeyRef': {
        'name': 'wandb', 'key': 'api-key'}}} in container['env']
    assert container['imagePullPolicy'] == 'Always'
    assert queue['spec']['serviceAccountName'] == 'trainer'
    coordinator = next(d for d in documents if d['metadata']['name'] == 'pc-coordinator')
    assert coordinator['spec']['template']['spec']['serviceAccountName'] == 'pc'  # create_rbac's
    assert _spec_of(documents, 'pc-queue-0').flag_overrides == ['--learning_rate=0.1']


def test_lp_resources_map_to_pod_requests():
    documents = _documents(kubernetes_programs.producer_consumer(), name='pc', resources={
        'queue': lp.Resources(cpus=2, gpus=1, memory='4G'),
        'producer': lp.Resources(gpus=0)})
    _validate(documents)
    pods = {d['metadata']['name']: d['spec']['containers'][0] for d in _by_kind(documents, 'Pod')}
    assert pods['pc-queue-0']['resources'] == {
        'requests': {'cpu': '2', 'memory': '4096Mi'},
        'limits': {'memory': '4096Mi', 'nvidia.com/gpu': '1'}}
    producer = pods['pc-producer-0']
    assert 'resources' not in producer
    assert {'name': 'CUDA_VISIBLE_DEVICES', 'value': ''} in producer['env']  # sees no GPU
    assert lp.KubernetesResources.from_resources(
        lp.Resources(gpus=2), node_selector={'pool': 'gpu'}) == lp.KubernetesResources(
            gpus=2, node_selector={'pool': 'gpu'})
    with pytest.raises(ValueError, match='share of a GPU, which Kubernetes does not allocate'):
        _documents(kubernetes_programs.producer_consumer(),
                   resources={'queue': lp.Resources(gpus=0.25)})


def test_every_object_is_labelled_and_pods_have_stable_dns_names():
    documents = _documents(kubernetes_programs.producer_consumer(), name='pc')
    _validate(documents)
    for document in documents:
        labels = document['metadata']['labels']
        assert labels[kubernetes.PROGRAM_LABEL] == 'pc'
        assert document['metadata']['namespace'] == 'default'
    service = _by_kind(documents, 'Service')[0]
    assert service['spec']['clusterIP'] == 'None'
    assert service['spec']['selector'] == {kubernetes.PROGRAM_LABEL: 'pc'}
    nodes = {d['metadata']['annotations'][kubernetes.NODE_NAME_ANNOTATION]: d
             for d in _by_kind(documents, 'Pod') if 'annotations' in d['metadata']}
    assert sorted(nodes) == ['consumer/0', 'producer/0', 'producer/1', 'queue/0']
    for pod in _by_kind(documents, 'Pod'):
        assert pod['spec']['hostname'] == pod['metadata']['name']
        assert pod['spec']['subdomain'] == 'pc'
        assert pod['spec']['restartPolicy'] == 'Never'
    assert nodes['producer/1']['metadata']['labels'][kubernetes.NODE_LABEL] == 'producer-1'


def test_node_pods_run_the_worker_on_their_spec_with_a_static_address_table():
    documents = _documents(kubernetes_programs.producer_consumer(), name='pc', port=9000)
    pod = next(d for d in documents if d['metadata']['name'] == 'pc-producer-0')
    container = pod['spec']['containers'][0]
    assert container['command'] == specs.worker_argv('/launchpad/spec/spec', 'python3')
    token = {'name': 'COURIER_AUTH_TOKEN',
             'valueFrom': {'secretKeyRef': {'name': 'pc-token', 'key': 'token'}}}
    assert token in container['env']
    assert pod['spec']['initContainers'][0]['command'][-3:] == [
        'pc-coordinator.pc.default.svc.cluster.local', '9000', '600.0']
    spec = _spec_of(documents, 'pc-producer-0')
    assert spec.node_name == 'producer/0' and spec.parent_pid is None
    assert spec.coordinator_address == 'pc-coordinator.pc.default.svc.cluster.local:9000'
    assert list(spec.address_table.static.values()) == [
        'pc-queue-0.pc.default.svc.cluster.local:9000']
    secret = _by_kind(documents, 'Secret')[0]
    assert len(base64.b64decode(secret['data']['token'])) == 32


def test_a_large_executable_is_split_over_configmaps_under_the_limit_and_joined(tmp_path):
    blob = bytes(range(256)) * (10 * kubernetes.SPEC_CHUNK_BYTES // 256 // 4)  # 2.5 chunks
    documents = _documents(kubernetes_programs.checksum(blob), name='big')
    _validate(documents)
    parts = [d for d in _by_kind(documents, 'ConfigMap') if '-spec-' in d['metadata']['name']]
    assert len(parts) == 3
    sizes = [len(base64.b64decode(d['binaryData']['spec'])) for d in parts]
    assert max(sizes) <= kubernetes.SPEC_CHUNK_BYTES < 2 ** 20  # the ConfigMap limit: 1 MiB
    pod = next(d for d in _by_kind(documents, 'Pod') if d['metadata']['name'] == 'big-checker-0')
    join = pod['spec']['initContainers'][1]
    assert join['name'] == 'join-spec'
    # Lay the parts out as the kubelet mounts them and run the join step.
    for mount, part in zip(join['volumeMounts'], parts):
        directory = tmp_path / mount['mountPath'].lstrip('/')
        directory.mkdir(parents=True)
        (directory / 'spec').write_bytes(base64.b64decode(part['binaryData']['spec']))
    target = tmp_path / 'spec'
    assert join['command'][-2:] == [kubernetes.PARTS_DIR, f'{kubernetes.SPEC_DIR}/spec']
    subprocess.run([sys.executable] + join['command'][1:-2]
                   + [str(tmp_path / kubernetes.PARTS_DIR.lstrip('/')), str(target)],
                   check=True, timeout=30)
    assert target.read_bytes() == b''.join(base64.b64decode(d['binaryData']['spec'])
                                           for d in parts)


def test_an_executable_too_large_for_configmaps_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(manifests, 'SPEC_CHUNK_BYTES', 1000)
    with pytest.raises(ValueError, match=r'Node checker/0 is .* MiB.*build large data into '
                                         r'the image'):
        kubernetes.program_to_manifests(kubernetes_programs.checksum(b'x' * 20000), image='i')


def test_bad_options_are_refused_clearly():
    program = kubernetes_programs.producer_consumer()
    with pytest.raises(ValueError, match='needs image='):
        kubernetes.program_to_manifests(program, image='')
    with pytest.raises(TypeError, match='Unknown option.*replicas'):
        kubernetes.program_to_manifests(program, image='i', replicas=3)
    with pytest.raises(TypeError, match="group 'queue' got"):
        kubernetes.program_to_manifests(program, image='i', resources={'queue': {'cpu': 1}})
    with pytest.raises(ValueError, match='groups'):
        kubernetes.program_to_manifests(program, image='i',
                                        resources={'nope': lp.KubernetesResources()})
    with pytest.raises(ValueError, match='namespace'):
        kubernetes.program_to_manifests(program, image='i', namespace='Team_A')
    with pytest.raises(ValueError, match='launch name'):
        kubernetes.program_to_manifests(program, image='i', name='9lives')
    with pytest.raises(ValueError, match='image_pull_policy'):
        kubernetes.program_to_manifests(program, image='i', image_pull_policy='Sometimes')


def test_manifests_are_written_with_how_to_follow_and_delete(tmp_path):
    path = tmp_path / 'program.yaml'
    text = kubernetes.program_to_manifests(kubernetes_programs.producer_consumer(), image='i',
                                           name='pc', path=str(path))
    assert path.read_text() == text
    assert 'kubectl -n default delete pods,services,configmaps,secrets -l ' \
           'launchpad.dev/program=pc' in text
    assert '--max-log-requests 5' in text


def test_any_program_and_group_names_make_valid_distinct_names():
    program = lp.Program('2 Very Long Program Names, With Punctuation!' * 2)
    for label in ('Replay_Buffer_With_A_Long_Name' * 3, 'replay-buffer-with-a-long-name' * 3,
                  'actor', 'Actor'):
        with program.group(label):
            for _ in range(11):
                program.add_node(lp.PyNode(print))
    documents = _documents(program)
    _validate(documents)
    pods = [d['metadata']['name'] for d in _by_kind(documents, 'Pod')]
    assert len(set(pods)) == len(pods) == 4 * 11 + 1
    assert all(len(name) <= 63 for name in pods)
    assert pods[0].startswith('lp-2-very-long-program-names')


def _run_wait_for(port: int, limit: float) -> subprocess.CompletedProcess:
    return subprocess.run(names.pod_command(sys.executable, names.WAIT_FOR_COMMAND, '127.0.0.1',
                                            str(port), str(limit)),
                          capture_output=True, text=True, timeout=30)


def test_the_wait_for_coordinator_command_waits_for_a_listening_port():
    with socket.create_server(('127.0.0.1', 0)) as server:
        assert _run_wait_for(server.getsockname()[1], 5).returncode == 0
        port = server.getsockname()[1]
    result = _run_wait_for(port, 0.3)  # nothing listens any more
    assert result.returncode == 1
    assert f'the coordinator 127.0.0.1:{port} was not reachable within 0.3 s' in result.stderr
    assert 'RuntimeWarning' not in result.stderr  # the package does not import the pod module


def test_node_pods_mount_the_checkpoint_volume_the_user_names():
    claim = {'persistentVolumeClaim': {'claimName': 'checkpoints'}}
    documents = _documents(kubernetes_programs.producer_consumer(), name='pc',
                           checkpoint_volume=claim)
    _validate(documents)
    pod = next(d for d in documents if d['metadata']['name'] == 'pc-producer-0')
    assert {'name': 'checkpoints', **claim} in pod['spec']['volumes']
    assert {'name': 'checkpoints', 'mountPath': '/launchpad/checkpoints'} in \
        pod['spec']['containers'][0]['volumeMounts']
    assert _spec_of(documents, 'pc-producer-0').checkpoint_root == '/launchpad/checkpoints/pc'
    plain = _documents(kubernetes_programs.producer_consumer(), name='pc')
    assert _spec_of(plain, 'pc-producer-0').checkpoint_root is None  # checkpoint_dir says why
    with pytest.raises(ValueError, match='one volume source'):
        _documents(kubernetes_programs.producer_consumer(), checkpoint_volume={'name': 'x'})
