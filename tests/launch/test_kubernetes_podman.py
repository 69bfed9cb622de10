"""The kubernetes launcher's pods, run for real with `podman kube play` (root only).

There is no API server here, so these tests take the manifests `program_to_manifests` writes and
play them with podman, translating only what `kube play` lacks:
  * cluster DNS: every pod gets the others' names as hostAliases and a fixed IP (`--ip`);
  * the Secret: podman 4.3 stores a Secret document from the YAML but cannot read it back for
    `secretKeyRef`, so the test creates the podman secret itself (same name, same key);
  * `containerPort`: podman publishes it on the host, so two pods would collide; it is dropped;
  * the image has launchpad's dependencies but not launchpad: the source tree is mounted at its
    own path and put on PYTHONPATH.
Everything else (init containers, the spec ConfigMaps as volumes, commands, env, restart policy,
hostnames) runs as generated.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from launchpad.launch import kubernetes
from tests.launch import kubernetes_programs

_LOADER = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)
pytestmark = pytest.mark.timeout(120)


class _Played:
    """A program's manifests running under `podman kube play`; `down()` removes everything."""

    def __init__(self, bed, program, tmp_path, **options):
        self.run = f'lp{os.getpid() % 10000}-{time.monotonic_ns() % 100000}'
        text = kubernetes.program_to_manifests(program, image=bed.image, python=bed.python,
                                               name=self.run, notice_period=2, **options)
        documents = list(yaml.load_all(text, Loader=_LOADER))
        self.pods = [d for d in documents if d['kind'] == 'Pod']
        self.secret = next(d for d in documents if d['kind'] == 'Secret')
        base = bed.subnet.rsplit('.', 1)[0]
        ips = {pod['metadata']['name']: f'{base}.{100 + i}' for i, pod in enumerate(self.pods)}
        aliases = [{'ip': ip, 'hostnames': [f'{name}.{self.run}.default.svc.cluster.local']}
                   for name, ip in ips.items()]
        for pod in self.pods:
            spec = pod['spec']
            spec['hostAliases'] = aliases
            spec.setdefault('volumes', []).append(
                {'name': 'source', 'hostPath': {'path': bed.source_dir}})
            for container in spec['containers'] + spec.get('initContainers', []):
                container.pop('ports', None)
                container.setdefault('volumeMounts', []).append(
                    {'name': 'source', 'mountPath': bed.source_dir, 'readOnly': True})
                container.setdefault('env', []).append(
                    {'name': 'PYTHONPATH', 'value': bed.source_dir})
        self.path = tmp_path / 'play.yaml'
        self.path.write_text(kubernetes.to_yaml([d for d in documents if d['kind'] != 'Secret']))
        secret_file = tmp_path / 'secret.json'
        secret_file.write_text(json.dumps(self.secret['data']))
        self._secret_name = self.secret['metadata']['name']
        _podman('secret', 'create', self._secret_name, str(secret_file))
        command = ['kube', 'play', '--network', bed.network]
        for pod in self.pods:
            command += ['--ip', ips[pod['metadata']['name']]]
        try:
            _podman(*command, str(self.path))
        except BaseException:
            self.down()
            raise

    def wait(self, timeout: float) -> dict:
        """Container name -> exit code, once every container of the program has exited."""
        deadline = time.monotonic() + timeout
        while True:
            listing = json.loads(_podman('ps', '-a', '--format', 'json', '--filter',
                                         f'label={kubernetes.PROGRAM_LABEL}={self.run}'))
            containers = [c for c in listing if not c.get('IsInfra')]
            if containers and all(c['State'] == 'exited' for c in containers):
                return {c['Names'][0]: c['ExitCode'] for c in containers}
            if time.monotonic() > deadline:
                states = {c['Names'][0]: c['State'] for c in containers}
                raise AssertionError(f'still running after {timeout} s: {states}\n{self.logs()}')
            time.sleep(0.5)

    def logs(self) -> str:
        return '\n'.join(f'--- {pod["metadata"]["name"]}\n' + _podman(
            'pod', 'logs', pod['metadata']['name'], check=False) for pod in self.pods)

    def down(self) -> None:
        _podman('kube', 'play', '--down', str(self.path), check=False)
        _podman('secret', 'rm', self._secret_name, check=False)


def _podman(*args: str, check: bool = True) -> str:
    result = subprocess.run(['podman', *args], capture_output=True, text=True, timeout=90,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError(f'podman {" ".join(args)} failed: {result.stderr}')
    return result.stdout + result.stderr


@pytest.fixture
def play(podman_testbed, tmp_path):
    played = []

    def start(program, **options) -> _Played:
        played.append(_Played(podman_testbed, program, tmp_path, **options))
        return played[-1]

    yield start
    for p in played:
        p.down()
    assert not _podman('ps', '-aq', '--filter', f'label={kubernetes.PROGRAM_LABEL}').strip()
    assert 'lp' not in _podman('secret', 'ls', '--format', '{{.Name}}')


def _exit_codes(codes: dict, run: str) -> dict:
    """{'coordinator': code, 'queue-0': code, ...} for the main containers."""
    prefix = f'{run}-'
    return {name[len(prefix):].rsplit('-', 1)[0]: code for name, code in codes.items()
            if name.endswith(('-node', '-coordinator'))}


def test_producer_consumer_runs_across_pods_and_ends_by_lp_stop(play):
    program = play(kubernetes_programs.producer_consumer(producers=2, count=5))
    codes = _exit_codes(program.wait(60), program.run)
    logs = program.logs()
    assert codes == {'coordinator': 0, 'queue-0': 0, 'producer-0': 0, 'producer-1': 0,
                     'consumer-0': 0}, logs
    assert 'consumed 10 items summing to 20' in logs
    assert 'stopping the program: lp.stop() called in consumer/0' in logs


def test_actor_learner_runs_across_pods(play):
    program = play(kubernetes_programs.actor_learner(actors=2, steps=20))
    codes = _exit_codes(program.wait(60), program.run)
    logs = program.logs()
    assert codes == {'coordinator': 0, 'learner-0': 0, 'actor-0': 0, 'actor-1': 0}, logs
    updates = re.search(r'learner: (\d+) updates', logs)
    assert updates and int(updates.group(1)) >= 20, logs
    assert 'actor 0:' in logs and 'actor 1:' in logs


def test_failing_node_stops_the_program_and_the_coordinator_names_it(play):
    program = play(kubernetes_programs.failing())
    codes = _exit_codes(program.wait(60), program.run)
    logs = program.logs()
    assert codes['broken-0'] == 1, logs
    assert codes['coordinator'] == 0 and codes['queue-0'] == 0, logs
    assert 'node broken/0 failed: ValueError: the reward went negative' in logs


def test_executable_split_over_several_configmaps_is_joined(play):
    blob = os.urandom(int(2.5 * kubernetes.SPEC_CHUNK_BYTES))
    program = play(kubernetes_programs.checksum(blob))
    codes = _exit_codes(program.wait(60), program.run)
    logs = program.logs()
    assert codes == {'coordinator': 0, 'checker-0': 0}, logs
    assert f'checksum {kubernetes_programs.digest(blob)}' in logs
