"""The kubernetes launcher running real pods with `podman kube play` (root only).

There is no API server here. `PodmanApi` stands in for the launcher's thin API layer: the launcher
builds its objects and creates them one by one as on a cluster, and each Pod is played with podman,
translating only what `kube play` lacks:
  * cluster DNS: every pod gets the others' DNS names as hostAliases and a fixed IP (`--ip`); a
    Job's new pod gets a new IP, and its name moves in the running pods' hosts files
    (`podman_hosts`);
  * the Secret: podman 4.3 stores a Secret document from the YAML but cannot read it back for
    `secretKeyRef`, so it is created as a podman secret of the same name and key;
  * `containerPort`: podman publishes it on the host, so two pods would collide; it is dropped;
  * the image has launchpad's dependencies but not launchpad: the source tree is mounted at its
    own path and put on PYTHONPATH.
Everything else (init containers, the spec ConfigMaps as volumes, commands, env, restart policy,
hostnames, grace periods) runs as generated. As on a cluster, a pod cannot be created again
(a restarted node) until the deleted one is gone.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import types

import pytest

import launchpad as lp
from tests.leftovers import no_new_children
from launchpad.launch import kubernetes
from launchpad.launch.kubernetes import launcher as kubernetes_launcher
from launchpad.launch.kubernetes.api import AlreadyExists
from tests.core.conftest import wait_until
from tests.launch import kubernetes_programs, podman_hosts

# The pods start within the waits below (the stand-in plays them after `create` answers).
pytestmark = pytest.mark.timeout(180)
GROWTH = 8  # pods of added nodes per group that the stand-in's DNS knows


class PodmanApi:
    """The kubernetes launcher's API layer (`KubernetesApi`'s methods) played by podman.

    Each Pod is started with `kube play` as the launcher creates it, together with the
    ConfigMaps it mounts, with the translations described at the top of this module; pod
    statuses are read back from the containers' states, logs from `podman logs`, and deleting a
    pod stops it with its grace period (SIGTERM, then SIGKILL), in the background like a kubelet.
    Like an API server, `create` answers at once and the pod is played in the background, listed
    as Pending meanwhile: `kube play` can take longer than a client's request timeout (30 s) on
    a loaded machine, and a coordinator pod adding a node would then fail.
    """

    def __init__(self, bed, tmp_path):
        self._bed = bed
        self._dir = tmp_path
        self._configmaps = {}
        self._pods = {}        # pod name -> its document (as created)
        self._ips = {}
        self._base = ''
        self._aliases = []
        self._secrets = []
        self._deleting = []
        self._playing = {}     # pod name -> the thread playing it
        self.play_errors = {}  # pod name -> why `kube play` failed
        self.move_errors = []  # why a move of a DNS name did not take (`_move`)
        self._hosts_lock = threading.Lock()  # (a move, and a play catching up with the moves)
        self._played = set()   # pods played, whose hosts files `_move` rewrites
        self._followers = []
        self.created = []

    def check_namespace(self) -> None:
        pass

    def create(self, document):
        kind, name = document['kind'], document['metadata']['name']
        self.created.append((kind, name))
        document = json.loads(json.dumps(document))
        document['metadata']['uid'] = f'uid-{len(self.created)}'
        if kind == 'ConfigMap' and 'pods' in document.get('data', {}):  # the root
            run = document['metadata']['labels'][kubernetes.PROGRAM_LABEL]
            base = self._bed.subnet.rsplit('.', 1)[0]
            pods = list(json.loads(document['data']['pods']).values())
            # A hosts file is fixed when its pod starts: the pods of nodes added later (named
            # like their group's) are listed in advance, up to GROWTH per group.
            groups = {m.group(1) for m in map(re.compile(r'(.+)-\d+').fullmatch, pods) if m}
            pods += [f'{group}-{k}' for group in sorted(groups) for k in range(GROWTH)]
            self._ips = {pod: f'{base}.{100 + i}' for i, pod in enumerate(dict.fromkeys(pods))}
            self._base = base
            self._aliases = [{'ip': ip, 'hostnames': [f'{pod}.{run}.default.svc.cluster.local']}
                             for pod, ip in self._ips.items()]
        elif kind == 'ConfigMap':
            self._configmaps[name] = document
        elif kind == 'Secret':
            path = self._dir / f'{name}.json'
            path.write_text(json.dumps(document['data']))
            _podman('secret', 'create', name, str(path))
            self._secrets.append(name)
        elif kind == 'Pod':
            if self._being_deleted(name):  # as the API answers while a pod terminates
                raise AlreadyExists(f'Cannot create Pod {name}: it already exists (terminating).')
            self._play(document)
        return document

    def address(self, name):
        """The address pod `name` was given."""
        return self._ips[name]

    def _being_deleted(self, name):
        return any(thread.is_alive() and thread.name == f'delete-{name}'
                   for thread in self._deleting)

    def _play(self, pod):
        name = pod['metadata']['name']
        hostname = pod['spec'].get('hostname', name)
        if hostname != name:  # a Job's pod: a new address, which its DNS name follows
            self._ips[name] = f'{self._base}.{100 + len(self._ips)}'
            self._move(hostname, self._ips[name])
        _translate(pod, self._aliases, self._bed.source_dir)
        written = {a['hostnames'][0]: a['ip'] for a in pod['spec']['hostAliases']}
        mounted = [v['configMap']['name'] for v in pod['spec'].get('volumes', [])
                   if 'configMap' in v]
        path = self._dir / f'{name}.yaml'
        path.write_text(kubernetes.to_yaml([self._configmaps[c] for c in mounted] + [pod]))
        self._pods[name] = pod
        ip = self._ips.setdefault(name, f'{self._base}.{100 + len(self._ips)}')  # leave pods

        def play():
            try:
                _podman('kube', 'play', '--network', self._bed.network, '--ip', ip, str(path))
            except (AssertionError, subprocess.SubprocessError) as e:
                self.play_errors[name] = str(e)
                return
            with self._hosts_lock:  # the moves made while it played
                for alias in self._aliases:
                    if written.get(alias['hostnames'][0], alias['ip']) != alias['ip']:
                        self._point(name, alias['hostnames'][0], alias['ip'])
                self._played.add(name)

        self.play_errors.pop(name, None)
        thread = threading.Thread(target=play, name=f'play-{name}')
        self._playing[name] = thread
        thread.start()

    def _move(self, hostname, ip):
        """Points the DNS name of pod hostname `hostname` at `ip`, in the hosts file of every
        pod, as a cluster's DNS follows a pod made again (with a new address: reusing the old
        one left the other pods' neighbour entries stale, and their connects timed out). A pod
        still being played catches up once played; a move that does not take is printed, and
        `close` fails naming it."""
        with self._hosts_lock:
            for alias in self._aliases:
                if alias['hostnames'][0].startswith(f'{hostname}.'):
                    alias['ip'], fqdn = ip, alias['hostnames'][0]
                    break
            else:
                return
            for name in [name for name in list(self._pods) if name in self._played]:
                self._point(name, fqdn, ip)

    def _point(self, name, fqdn, ip):
        """`podman_hosts.point` in pod `name`, its failure kept in `move_errors`."""
        pod = self._pods.get(name)
        if pod is None:  # deleted meanwhile
            return
        try:
            podman_hosts.point(name, [c['name'] for c in pod['spec']['containers']], fqdn, ip,
                               self._bed.python, _podman)
        except AssertionError as e:
            print(e, flush=True)
            self.move_errors.append(str(e))

    def delete(self, kind, name, grace_period_seconds=None):
        if kind == 'Secret' and name in self._secrets:
            self._secrets.remove(name)
            _podman('secret', 'rm', name, check=False)
        pod = self._pods.pop(name, None) if kind == 'Pod' else None
        self._played.discard(name)
        if pod is None:
            return
        grace = 30 if grace_period_seconds is None else grace_period_seconds
        main = f'{name}-{pod["spec"]["containers"][0]["name"]}'

        playing = self._playing.get(name)

        def stop():
            if playing is not None:
                playing.join()  # (`_podman` ends it within its timeout)
            # Like a kubelet: the containers get SIGTERM and the grace period while the pod's
            # network stays up (`podman pod stop` would stop its infra container at once).
            _podman('stop', '--time', str(grace), main, check=False)
            _podman('pod', 'rm', '--force', name, check=False)

        thread = threading.Thread(target=stop, name=f'delete-{name}')
        self._deleting.append(thread)
        thread.start()

    def list_pods(self, selector):
        del selector
        # Which pods are still being played, before podman is asked: a play that ends in between
        # has made its containers by then.
        playing = {name for name, thread in list(self._playing.items()) if thread.is_alive()}
        containers = {c['Names'][0]: c for c in json.loads(_podman('ps', '-a', '--format', 'json'))}
        pods = []
        for name, document in list(self._pods.items()):
            main = document['spec']['containers'][0]['name']
            if f'{name}-{main}' in containers:  # gone once deleted, like a pod
                pods.append({**document, 'status': _status(containers[f'{name}-{main}'], main)})
            elif name in self.play_errors:
                pods.append({**document, 'status': {
                    'phase': 'Failed', 'reason': 'KubePlayFailed',
                    'message': self.play_errors[name]}})
            elif name in playing:
                pods.append({**document, 'status': {'phase': 'Pending'}})
        return pods

    def read_log(self, pod, container, tail_lines=None):
        return _podman('logs', '--tail', str(tail_lines or -1), f'{pod}-{container}', check=False)

    def open_log(self, pod, container):
        process = subprocess.Popen(['podman', 'logs', '--follow', f'{pod}-{container}'],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._followers.append(process)
        return process.stdout

    def events(self, pod):
        return []

    def exec(self, pod, container, command, timeout):
        result = subprocess.run(['podman', 'exec', f'{pod}-{container}', *command],
                                capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise kubernetes.KubernetesError(f'exec in {pod} failed: {result.stderr}')
        return result.stdout

    def close(self):
        """Waits for pending plays and deletions, then removes whatever the launcher did not;
        fails naming the pods `kube play` could not start."""
        for thread in list(self._playing.values()) + self._deleting:
            thread.join(120)
        for name in list(self._pods):
            self.delete('Pod', name, 0)
        for thread in self._deleting:
            thread.join(60)
        for name in list(self._secrets):
            self.delete('Secret', name)
        for name in self._configmaps:  # `kube play` keeps each mounted ConfigMap as a volume
            _podman('volume', 'rm', name, check=False)
        for process in self._followers:  # `podman logs --follow` ends with its container
            process.wait(30)
        assert not self.play_errors, f'kube play failed: {self.play_errors}'
        assert not self.move_errors, self.move_errors


def _status(container, main):
    """A Kubernetes pod status from the state of a podman pod's main container."""
    if container['State'] not in ('running', 'exited', 'stopping'):
        return {'phase': 'Pending'}
    if container['State'] == 'exited':
        code = container['ExitCode']
        return {'phase': 'Succeeded' if code == 0 else 'Failed',
                'containerStatuses': [{'name': main, 'state': {'terminated': {
                    'exitCode': code, 'reason': 'Completed' if code == 0 else 'Error'}}}]}
    return {'phase': 'Running', 'containerStatuses': [{'name': main, 'state': {'running': {}}}]}


def _translate(pod, aliases, source_dir):
    """What `kube play` needs instead of cluster DNS, published ports and an image with our code."""
    spec = pod['spec']
    spec['hostAliases'] = [dict(alias) for alias in aliases]  # (as the pod is played)
    spec.setdefault('volumes', []).append({'name': 'source', 'hostPath': {'path': source_dir}})
    for container in spec['containers'] + spec.get('initContainers', []):
        container.pop('ports', None)
        container.setdefault('volumeMounts', []).append(
            {'name': 'source', 'mountPath': source_dir, 'readOnly': True})
        container.setdefault('env', []).append({'name': 'PYTHONPATH', 'value': source_dir})


def _podman(*args: str, check: bool = True) -> str:
    result = subprocess.run(['podman', *args], capture_output=True, text=True, timeout=90,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError(f'podman {" ".join(args)} failed: {result.stderr}')
    return result.stdout + result.stderr


@pytest.fixture
def podman_launch(podman_testbed, tmp_path, monkeypatch):
    apis = []
    monkeypatch.setattr(kubernetes_launcher.PodRunner, 'POLL_SECONDS', 0.3)

    def launch(program, **options):
        apis.append(PodmanApi(podman_testbed, tmp_path))
        lp.register_launcher('kubernetes_podman',
                             lambda: kubernetes.KubernetesLauncher(lambda _: apis[-1]))
        options.setdefault('notice_period', 5)
        return lp.launch(program, launch_type='kubernetes_podman', image=podman_testbed.image,
                         python=podman_testbed.python, **options), apis[-1]

    with no_new_children():
        yield launch
        for api in apis:
            api.close()
    assert not _podman('ps', '-aq', '--filter', f'label={kubernetes.PROGRAM_LABEL}').strip()
    pods = set(_podman('pod', 'ps', '--format', '{{.Name}}').split())
    assert not pods & {name for api in apis for kind, name in api.created if kind == 'Pod'}
    volumes = set(_podman('volume', 'ls', '--format', '{{.Name}}').split())
    assert not volumes & {name for api in apis for kind, name in api.created if kind == 'ConfigMap'}


def test_producer_consumer_runs_across_pods_and_ends_by_lp_stop_in_a_pod(podman_launch, capfd):
    payload = os.urandom(int(2.5 * kubernetes.SPEC_CHUNK_BYTES))  # split over 3 ConfigMaps
    controller, api = podman_launch(
        kubernetes_programs.producer_consumer(producers=2, count=5, payload=payload))
    assert controller.wait(timeout=150)
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}
    out = capfd.readouterr().out
    assert '[consumer-0] consumed 10 items summing to 20' in out, out
    # Between pods, a node's plain client of another node speaks courier's framed protocol.
    assert (f'[producer-0] produced 5, payload {kubernetes_programs.digest(payload)}, '
            f'over framed') in out, out
    assert '[coordinator] stopping the program: lp.stop() called in consumer/0' in out
    assert sum(1 for kind, name in api.created if '-producer-0-spec-' in name) == 3


def test_actor_learner_runs_across_pods(podman_launch, capfd):
    controller, _ = podman_launch(kubernetes_programs.actor_learner(actors=2, steps=20))
    assert controller.wait(timeout=150)
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}
    out = capfd.readouterr().out
    updates = re.search(r'\[learner-0\] learner: (\d+) updates', out)
    assert updates and int(updates.group(1)) >= 20, out
    assert '[actor-0] actor 0:' in out and '[actor-1] actor 1:' in out


def test_launcher_stop_reaches_the_pods_as_the_stop_signal_and_probes_reach_a_node(
        podman_launch):
    controller, _ = podman_launch(kubernetes_programs.actor_learner(actors=1, steps=10 ** 9),
                                  notice_period=5)
    deadline = time.monotonic() + 120
    while controller.status()['actor/0'].state is lp.NodeState.PENDING:
        assert time.monotonic() < deadline, controller.status()
        time.sleep(0.2)  # until its pod runs (the launcher learns it from the pod's phase)
    assert controller.status()['actor/0'].host.endswith('-actor-0')
    # `stacks` asks the nodes through the coordinator pod (the exec of `pod.py probe` there);
    # a pod that runs may still be connecting to the coordinator, before the actor's own code.
    while True:
        probed = controller.observer.probe(['stacks'], 'actor/0', timeout=5.0)['nodes'][
            'actor/0']
        if probed['live'] and 'kubernetes_programs.py' in json.dumps(probed['stacks']):
            break
        assert time.monotonic() < deadline, probed
        time.sleep(0.5)
    controller.stop(timeout=60)
    # The coordinator pod turned its SIGTERM into the program's stop: every node ended by itself
    # within the notice period (exit code 0), none was killed.
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}


def test_launcher_reports_a_failing_pod_with_its_real_log_tail(podman_launch):
    controller, _ = podman_launch(kubernetes_programs.failing())
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=150)
    assert failure.value.node_name == 'broken/0'
    assert 'exited with code 1' in failure.value.message
    assert 'ValueError: the reward went negative' in failure.value.remote_traceback


@pytest.mark.timeout(300)
def test_an_elastic_group_grows_and_shrinks_in_pods(podman_launch, capfd):
    """tests/elastic_program.py: a node grows the actors 2 -> 6 -> 1 (its lp.resize reaches the
    launcher through the coordinator pod's log; added pods join the coordinator in their init
    container, removed ones are told by a leave pod) while the learner receives from, and
    broadcasts to, whoever is alive; every pod is gone at the end (the fixture checks)."""
    from tests import elastic_program  # pylint: disable=import-outside-toplevel
    controller, api = podman_launch(elastic_program.build(), notice_period=10)
    assert controller.wait(timeout=260)
    status = controller.status()
    assert {name: s.state for name, s in status.items() if name.startswith('actor/')} == {
        'actor/0': lp.NodeState.FINISHED,
        **{f'actor/{i}': lp.NodeState.REMOVED for i in range(1, 6)}}
    out = capfd.readouterr().out
    assert 'ELASTIC shrank to 1' in out, out
    pods = [name for kind, name in api.created if kind == 'Pod']
    run = pods[0][:-len('-coordinator')]
    assert sorted(p for p in pods if '-actor-' in p and not p.endswith('-leave')) == [
        f'{run}-actor-{i}' for i in range(6)]
    assert sorted(p for p in pods if p.endswith('-leave')) == [
        f'{run}-actor-{i}-leave' for i in range(1, 6)]
    assert len(controller.scale_up_times) == 4


def test_the_stand_in_answers_a_pod_creation_before_kube_play_ends(tmp_path, monkeypatch):
    """As an API server does, so that a slow `kube play` on a loaded machine cannot run past a
    client's request timeout: the pod is listed as Pending while it plays, then as its
    containers are; a deletion waits for the play; a failed play is a Failed pod, and `close`
    names it. (A fake podman: no bed needed.)"""
    plays = {'p': threading.Event(), 'q': threading.Event(), 'bad': threading.Event()}
    calls, running = [], set()

    def fake_podman(*args, check=True):
        if args[:2] == ('kube', 'play'):
            name = os.path.basename(args[-1])[:-len('.yaml')]
            assert plays[name].wait(10), f'{name} was never let play'
            if name == 'bad':
                raise AssertionError('podman kube play failed: no such image')
            running.add(name)
        calls.append(args[:2] + args[-1:])
        if args[:2] == ('pod', 'rm'):
            running.discard(args[-1])
        if args == ('ps', '-a', '--format', 'json'):
            return json.dumps([{'Names': [f'{name}-main'], 'State': 'running'} for name in running])
        return ''

    monkeypatch.setattr(sys.modules[__name__], '_podman', fake_podman)
    bed = types.SimpleNamespace(network='lpnet', subnet='10.201.0.0/24', source_dir=str(tmp_path))
    api = PodmanApi(bed, tmp_path)

    def phases():
        return {pod['metadata']['name']: pod['status']['phase'] for pod in api.list_pods('')}

    for name in plays:
        started = time.monotonic()
        api.create({'kind': 'Pod', 'metadata': {'name': name},
                    'spec': {'containers': [{'name': 'main', 'command': ['true']}]}})
        assert time.monotonic() - started < 5  # not after the play (10 s here)
    assert phases() == {'p': 'Pending', 'q': 'Pending', 'bad': 'Pending'}
    api.delete('Pod', 'q', grace_period_seconds=0)  # while it plays
    plays['p'].set()
    plays['bad'].set()
    assert wait_until(lambda: phases() == {'p': 'Running', 'bad': 'Failed'}), phases()
    bad = next(pod for pod in api.list_pods('') if pod['metadata']['name'] == 'bad')
    assert 'no such image' in bad['status']['message']
    assert ('pod', 'rm', 'q') not in calls  # its deletion waits for its play
    plays['q'].set()
    assert wait_until(lambda: ('pod', 'rm', 'q') in calls), calls
    assert calls.index(('kube', 'play', str(tmp_path / 'q.yaml'))) < calls.index(('stop', '--time', 'q-main'))
    with pytest.raises(AssertionError, match="kube play failed: .*'bad'.*no such image"):
        api.close()
    assert running == set()


def test_the_stand_ins_dns_follows_a_jobs_new_pod_into_the_running_pods(podman_testbed,
                                                                        tmp_path):
    """A Job's pod made again (the coordinator's) gets a new address, and its DNS name (its
    hostname in the program's subdomain) resolves to it in a pod that was already running, as
    a cluster's DNS would: the podman stand-in rewrites that pod's hosts files."""
    api = PodmanApi(podman_testbed, tmp_path)
    run, fqdn = 'lpdns', 'lpdns-coordinator.lpdns.default.svc.cluster.local'

    def pod(name, **spec):
        return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name}, 'spec': {
            'restartPolicy': 'Never', 'containers': [
                {'name': 'main', 'image': podman_testbed.image, 'command': ['sleep', '120']}],
            **spec}}

    def resolved():
        return _podman('exec', f'{run}-node-0-main', podman_testbed.python, '-c',
                       podman_hosts.RESOLVE, fqdn, check=False).strip()

    def running(name):
        return any(p['metadata']['name'] == name and p['status']['phase'] == 'Running'
                   for p in api.list_pods(''))

    try:
        api.create({'kind': 'ConfigMap', 'metadata': {
            'name': run, 'labels': {kubernetes.PROGRAM_LABEL: run}}, 'data': {'pods': json.dumps(
                {'node/0': f'{run}-node-0', 'coordinator': f'{run}-coordinator'})}})
        api.create(pod(f'{run}-node-0'))
        assert wait_until(lambda: running(f'{run}-node-0'), timeout=120)
        addresses = []
        for job_pod in (f'{run}-coordinator-a1b2c', f'{run}-coordinator-d3e4f'):
            api.create(pod(job_pod, hostname=f'{run}-coordinator', subdomain=run))
            addresses.append(api.address(job_pod))
            assert wait_until(lambda: resolved() == addresses[-1], timeout=30), (
                resolved(), addresses)
            api.delete('Pod', job_pod, grace_period_seconds=0)
        assert addresses[0] != addresses[1]
    finally:
        api.close()
    assert not api.move_errors


def test_a_hosts_file_is_rewritten_in_place(tmp_path):
    """A bind-mounted /etc/hosts cannot be replaced, only rewritten: the same file (inode) names
    the new address, other names on a shared line stay."""
    hosts = tmp_path / 'hosts'
    hosts.write_text('127.0.0.1 localhost\n10.0.0.5\tp.r.svc # old\n10.0.0.5 q.r.svc p.r.svc\n')
    inode = hosts.stat().st_ino
    podman_hosts._rewrite(str(hosts), 'p.r.svc', '10.0.0.9')  # pylint: disable=protected-access
    assert hosts.read_text() == '127.0.0.1 localhost\n10.0.0.5 q.r.svc\n10.0.0.9\tp.r.svc\n'
    assert hosts.stat().st_ino == inode
