"""A detached Kubernetes program on the podman bed, its launcher gone: the coordinator pod
grows and shrinks an elastic group and restarts a failed node through the API
(`PodmanApiServer`, the real client on both sides); the launching machine reaches it through
an exec in the coordinator container (`podman exec -i` standing in for `kubectl exec -i`):
`status`, `lp.attach` and `stop`; and deleting the program's root object removes everything.
The coordinator pod kept the program's run file on the volume `runs_volume=` named (a host
directory here), which `sql` reads."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import launchpad as lp
from launchpad.launch import kubernetes
from launchpad.launch.kubernetes import in_cluster, names, pod, reach
from launchpad.launch.kubernetes.api import KubernetesApi, KubernetesError, terminated
from launchpad.launch.kubernetes import coordinator_job
from launchpad.launch.kubernetes.coordinator_job import coordinator_pod_name
from launchpad.observe import cli, registry
from tests.failure_checks import wait_for
from tests.launch import kubernetes_kubectl as kubectl
from tests.launch.kubernetes_api_server import PodmanApiServer
from tests.launch.test_kubernetes_in_cluster import (SelectingApi, _manifests, _plan, _program,
                                                     _settings)
from tests.launch.test_kubernetes_launcher import _until
from tests.launch.test_kubernetes_podman import PodmanApi, _podman
from tests.leftovers import no_new_children
from tests.observe import detached_verbs
from tests.testbeds import REPO_ROOT

pytestmark = pytest.mark.timeout(240)  # (the bed test also runs the observer verbs)

LAUNCH = '''
import sys
import launchpad as lp
from launchpad.launch.kubernetes.api import KubernetesApi
from tests.launch import kubernetes_programs
from tests.launch.test_kubernetes_podman import PodmanApi

# The bed's API server runs no exec: podman's stands in for the API's (and, on the PATH the
# test sets, `kubernetes_kubectl` for kubectl).
KubernetesApi.exec = lambda self, *args: PodmanApi.exec(None, *args)
controller = lp.launch(kubernetes_programs.detached_program(), launch_type='kubernetes',
                       detach=True, create_rbac=True, image=sys.argv[1], python=sys.argv[2],
                       kubeconfig=sys.argv[3], notice_period=5,
                       runs_volume={'hostPath': {'path': sys.argv[4]}})
print(f'RETURNED {type(controller).__name__} {controller.id}', flush=True)
'''


class LocalExecApi(SelectingApi):
    """The fake API, whose exec (the API's, and `kubectl exec -i`'s) runs the command on this
    machine, as if in the coordinator container."""

    forbidden = False

    def exec(self, pod_name, container, command, timeout):
        self.calls.append(('exec', pod_name, container))
        if self.forbidden:
            raise KubernetesError(f'pods "{pod_name}" is forbidden: User "me" cannot create '
                                  'resource "pods/exec"')
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                check=False)
        if result.returncode != 0:
            raise KubernetesError(result.stderr)
        return result.stdout

    def exec_command(self, pod_name, container, command):
        return list(command)


def test_a_detached_program_is_reached_through_an_exec_in_its_coordinator_pod(
        monkeypatch, tmp_path, capsys):
    """The coordinator pod's side against a fake API, the launching machine's registry another
    directory than the pod's: the launcher reads the pod's entry, and `status --json`,
    `lp.attach` and `stop` reach the program through the relay."""
    monkeypatch.setattr(in_cluster.InClusterRunner, 'POLL_SECONDS', 0.0)
    monkeypatch.setattr(names, 'OBSERVER_DIR', str(tmp_path / 'pod'))
    monkeypatch.setattr(names, 'UNKEPT_RUNS_DIR', str(tmp_path / 'runs'))
    here = str(tmp_path / 'here')
    monkeypatch.setenv(registry.ENV, here)
    plan = _plan(_program(), create_rbac=True)
    settings = _settings(plan)
    api = LocalExecApi()
    for name in (plan.coordinator_pod, 't1-worker-0', 't1-other-0'):
        api.create(plan.pod_document(name))
    with pytest.raises(TimeoutError, match='did not serve program .t1. within 0.1 s'):
        reach.adopt(api, plan.coordinator_pod, 't1', sys.executable, 0.1)
    api.forbidden = True  # said at once, not after the timeout
    with pytest.raises(PermissionError, match='needs `create` on `pods/exec`'):
        reach.adopt(api, plan.coordinator_pod, 't1', sys.executable, 60)
    api.forbidden = False
    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods)
    coordinator, controller = pod.supervise(settings, runner)
    monkeypatch.setenv(registry.ENV, names.OBSERVER_DIR)  # the pod's own (`run_coordinator`)
    observer = pod.keep_run(settings, coordinator, controller)
    monkeypatch.setenv(registry.ENV, here)  # back on the launching machine
    with no_new_children():  # the relays end with the program
        _reach_and_stop(api, plan, coordinator, controller, observer, capsys)


def _reach_and_stop(api, plan, coordinator, controller, observer, capsys) -> None:
    try:
        entry = reach.adopt(api, plan.coordinator_pod, 't1', sys.executable, 10)
        assert entry.relay[:2] == [sys.executable, '-c']
        assert entry.relay[3:] == [reach.socket_path('t1')]
        _relay_imports_no_launchpad(entry.relay)
        assert [e.id for e in registry.entries()] == ['t1']
        capsys.readouterr()
        assert cli.main(['list']) == 0
        assert f'{os.getpid()} on t1-coordinator' in capsys.readouterr().out
        assert cli.main(['status', 't1', '--json']) == 0, capsys.readouterr().err
        status = json.loads(capsys.readouterr().out)
        assert status['controller'] == {'host': 't1-coordinator', 'pid': os.getpid()}
        assert {node['name'] for node in status['nodes']} == {'worker/0', 'other/0'}
        attached = lp.attach('t1')
        assert attached.supervisor == {'host': 't1-coordinator', 'pid': os.getpid()}
        assert set(attached.status()) == {'worker/0', 'other/0'}
        assert cli.main(['stop', 't1']) == 0, capsys.readouterr().err
        _until(lambda: controller.done, 'the program did not stop')
        assert coordinator.stop_reason.startswith('stopped'), coordinator.stop_reason
    finally:
        controller.stop()
        observer.program_ended()


def _relay_imports_no_launchpad(command) -> None:
    """The relay command starts as a script: the launchpad package (a second of imports, for
    each connection of a tunnel) is not imported."""
    ran = subprocess.run([*command[:-1], reach.socket_path('t1') + '.none'], capture_output=True,
                         text=True, timeout=60, check=True,
                         env={**os.environ, 'PYTHONPROFILEIMPORTTIME': '1'})
    assert ran.stdout == 'gone\n'  # (no observer there)
    imported = {line.rsplit('|', 1)[-1].strip() for line in ran.stderr.splitlines()
                if line.startswith('import time:')}
    assert 'json' in imported
    assert not {name for name in imported if name.split('.')[0] == 'launchpad'}


FAKE_KUBECTL = '''#!/bin/sh
echo "kubectl $*" >> "$CALLS"
case $PHASE in gone) echo 'Error from server (NotFound): pods "p" not found' >&2; exit 1;; esac
case $5 in get) printf %s "$PHASE";;
           *) case $PHASE in Running|''|Suspended) echo "kubectl $*";;
                             *) echo "error: cannot exec in a $PHASE pod" >&2; exit 1;; esac;; esac
'''


def test_the_relay_command_says_gone_once_the_coordinator_pod_has_ended(tmp_path, monkeypatch):
    """`kubectl exec` first, alone while it runs; when it cannot, `kubectl get pod` (or job): an
    ended or deleted pod is `gone` (the tunnel forgets the program), one that has not ended yet
    (Pending) is a relay that ended without a word (tried again)."""
    (tmp_path / 'kubectl').write_text(FAKE_KUBECTL)
    (tmp_path / 'kubectl').chmod(0o700)
    monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
    api = object.__new__(KubernetesApi)  # (its client is not needed here)
    api.namespace, api._kubeconfig, api._context = 'ns', '/k', 'c'  # pylint: disable=protected-access
    command = api.exec_command('p-coordinator', 'coordinator', ['python3', '-m', 'relay', 'S'])
    calls = tmp_path / 'calls'

    def run(phase, command=command, code=0):
        calls.write_text('')
        ran = subprocess.run(command, capture_output=True, text=True, check=False,
                             env={**os.environ, 'PHASE': phase, 'CALLS': str(calls)})
        assert ran.returncode == code, ran.stderr
        return ran.stdout
    assert run('Succeeded') == run('Failed') == run('gone') == 'gone\n'
    assert run('Pending', code=1) == ''
    assert calls.read_text().split('\n')[1].split()[5:7] == ['get', 'pod']
    assert run('Running') == ('kubectl --kubeconfig /k --context c exec -i -n ns p-coordinator '
                              '-c coordinator -- python3 -m relay S\n')
    assert len(calls.read_text().splitlines()) == 1  # (the exec alone)
    # The pod of a Job (`coordinator_job`): gone once the Job has ended (its true conditions).
    job = api.exec_command('job/p-coordinator', 'coordinator', ['python3', '-m', 'relay', 'S'])
    assert run('Complete', job) == run('Failed', job) == run('gone', job) == 'gone\n'
    assert calls.read_text().split('\n')[1].split()[5:7] == ['get', 'job']
    assert run('', job) == run('Suspended', job) == (
        'kubectl --kubeconfig /k --context c exec -i -n ns job/p-coordinator -c coordinator -- '
        'python3 -m relay S\n')


@pytest.mark.timeout(420, func_only=True)  # (not the wait for a bed another process holds)
def test_a_detached_program_resizes_and_restarts_from_its_coordinator_pod(
        podman_testbed, tmp_path, capsys, monkeypatch):
    """prober/0 grows group member to 2 nodes and shrinks it to 1 (lp.resize): the coordinator
    pod creates the new member's pod and deletes it once removed. Then worker/0 crashes in its first
    attempt (after answering prober/0); the coordinator pod creates its pod again, and prober/0
    gets answers from attempt 1. From the launching machine, `status --json` and `lp.attach`
    see the program. The coordinator is killed and comes back (`_readopts_once_...`), then its pod
    is deleted and its Job's next pod takes over (`_readopts_once_its_coordinator_pod_is_lost`),
    and `stop` ends the program."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    monkeypatch.setenv('PATH', f'{kubectl.install(str(bin_dir))}{os.pathsep}{os.environ["PATH"]}')
    with no_new_children(), PodmanApiServer(PodmanApi(podman_testbed, tmp_path),
                                            tmp_path) as server:
        started = time.monotonic()
        runs = tmp_path / 'runs'
        runs.mkdir(mode=0o777)
        runs.chmod(0o777)  # (whoever the coordinator container runs as)
        launcher = subprocess.run(
            [sys.executable, '-c', LAUNCH, podman_testbed.image, podman_testbed.python,
             server.kubeconfig(), str(runs)], cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=120)
        assert launcher.returncode == 0, launcher.stdout + launcher.stderr
        run = re.search(r'Launched (\S+) in namespace', launcher.stdout).group(1)
        assert f'RETURNED KubernetesAttachedController {run}' in launcher.stdout, \
            launcher.stdout + launcher.stderr
        launched = time.monotonic() - started

        def log(pod, container='node'):
            if pod == 'coordinator':  # the pod its Job made last
                return server.podman.read_log([name for kind, name in server.created if kind == 'Pod'
                                               and name.startswith(f'{run}-coordinator-')][-1],
                                              container)
            return server.podman.read_log(f'{run}-{pod}', container)

        def exit_codes():  # (the Job's pod as RUN-coordinator)
            return {re.sub(r'-coordinator-\w+$', '-coordinator', pod['metadata']['name']):
                    (terminated(pod, pod['spec']['containers'][0]['name']) or {}).get('exitCode')
                    for pod in server.list_pods(f'{kubernetes.PROGRAM_LABEL}={run}')}

        assert wait_for(lambda: 'PROBE restarted' in log('prober-0'), 120), \
            log('coordinator', 'coordinator')
        capsys.readouterr()
        assert cli.main(['status', run, '--json']) == 0, capsys.readouterr().err
        status = json.loads(capsys.readouterr().out)
        assert status['controller']['host'] == f'job/{run}-coordinator', status
        assert {node['name'] for node in status['nodes']} >= {
            'worker/0', 'member/0', 'prober/0'}, status
        detached_verbs.check_verbs(run, 'prober/0', 'PROBE restarted', 'worker/0',
                                   'failure_programs.py', lambda: log('prober-0'), capsys)
        detached_verbs.follow_then_detach(run, '[prober/0] PROBE restarted')
        attached = lp.attach(run)  # (still running)
        assert attached.status()['worker/0'].restarts == 1
        member = attached.status()['member/1']  # added, then removed, by the coordinator pod
        assert member.state == lp.NodeState.REMOVED, member
        _readopts_once_its_coordinator_is_killed(server, run, log, attached)
        coordinator = log('coordinator', 'coordinator')  # (before the pod goes)
        assert (f'created the pod {run}-member-1 of member/1, added to group member'
                in coordinator), coordinator
        assert f'deleted the pod {run}-member-1 of removed node member/1' in coordinator
        prober = log('prober-0')
        assert "RESIZED 2: ['member/0', 'member/1']" in prober, prober
        assert "RESIZED 1: ['member/0']" in prober, prober
        assert 'node worker/0 failed: RuntimeError: worker crashed' in coordinator, coordinator
        assert f'created the pod {run}-worker-0 of worker/0 again' in coordinator, coordinator
        assert 'PROBE restarted: attempt 1' in prober, prober
        assert server.created.count(('Pod', f'{run}-worker-0')) == 2
        assert f'keeping the run file in /launchpad/runs/{run}' in coordinator, coordinator
        _readopts_once_its_coordinator_pod_is_lost(server, run, log, capsys)
        with _NodeLogs(run) as node_logs:  # (a pod deleted at the stop takes its log along)
            stopping = time.monotonic()
            assert cli.main(['stop', run]) == 0, capsys.readouterr().err
            assert wait_for(lambda: None not in exit_codes().values(), 60), \
                log('coordinator', 'coordinator')
            with capsys.disabled():
                print(f'stop to every pod ended: {time.monotonic() - stopping:.1f} s')
                if len(exit_codes()) != 4 or set(exit_codes().values()) != {0}:  # (see below)
                    print(server.deletions, *node_logs.tails().items(),
                          log('coordinator', 'coordinator')[-3000:], sep='\n')
        assert wait_for(lambda: run not in {e.id for e in registry.entries()}, 30)
        print(f'launch {launched:.1f} s, launch to end {time.monotonic() - started:.1f} s')
        assert exit_codes() == {f'{run}-{name}': 0 for name in (
            'coordinator', 'worker-0', 'member-0', 'prober-0')}, (
                server.deletions, node_logs.tails(), log('coordinator', 'coordinator')[-3000:])
        assert wait_for(lambda: server.read('Job', f'{run}-coordinator')['status'].get(
            'succeeded') == 1, 30)
        capsys.readouterr()
        assert cli.main(['sql', str(runs / run), 'SELECT node, restart FROM restarts',
                         '--json']) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out) == [{'node': 'worker/0', 'restart': 1}]
        assert cli.main(['sql', str(runs / run), 'SELECT count(*) FROM run WHERE ended IS NOT '
                                                 'NULL']) == 0
        assert capsys.readouterr().out.splitlines()[-1] == '1'

        server.delete('ConfigMap', run)  # kubectl delete configmap RUN
        assert server.objects() == []
    assert not _podman('ps', '-aq', '--filter', f'label={kubernetes.PROGRAM_LABEL}').strip()
    assert not set(_podman('pod', 'ps', '--format', '{{.Name}}').split()) & {
        name for kind, name in server.created if kind == 'Pod'}
    assert run not in _podman('secret', 'ls', '--format', '{{.Name}}')
    assert not set(_podman('volume', 'ls', '--format', '{{.Name}}').split()) & {
        name for kind, name in server.created if kind == 'ConfigMap'}  # (kube play's volumes)


class _NodeLogs:
    """Follows the node containers' logs (with podman's timestamps) while in its block, for
    the failure message of a node pod that did not end on its own."""

    def __init__(self, run):
        self._followers = {name: subprocess.Popen(
            ['podman', 'logs', '--follow', '--timestamps', f'{run}-{name}-node'],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name in ('worker-0', 'member-0', 'prober-0')}
        self._lines = {name: [] for name in self._followers}
        self._readers = [threading.Thread(target=self._lines[name].extend, args=(process.stdout,),
                                          daemon=True) for name, process in self._followers.items()]
        for reader in self._readers:
            reader.start()

    def tails(self):
        """The last lines of each node's log, without the prober's counts."""
        return {name: ''.join([line for line in lines if ' CALLS ' not in line][-25:])
                for name, lines in self._lines.items()}

    def __enter__(self):
        return self

    def __exit__(self, failed, *exc_info):
        for process in self._followers.values():  # (each ends with its container)
            try:
                process.wait(0 if failed else 30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
        for reader in self._readers:
            reader.join(10)


def _calls(log):
    """prober/0's last count of its calls to worker/0: (answered, failed)."""
    counted = re.findall(r'CALLS (\d+) answered, (\d+) failed', log('prober-0'))
    return tuple(map(int, counted[-1])) if counted else (0, 0)


def _node_processes(run):
    """The pid and start time of each node container: the same ones, no node restarted."""
    return {name: _podman('inspect', '--format', '{{.State.Pid}} {{.State.StartedAt}}',
                          f'{run}-{name}-node').strip()
            for name in ('worker-0', 'member-0', 'prober-0')}


def _readopts_once_its_coordinator_is_killed(server, run, log, attached) -> None:
    """SIGKILL the coordinator: its pod starts the container again, and the new coordinator
    re-adopts the running node pods from the state the old one kept (`readopt`). The same node
    containers (same pids) served on throughout: prober/0's calls to worker/0 kept being
    answered, none failed; no pod was created again, and worker/0 still has 1 restart."""
    def calls():
        return _calls(log)

    def node_processes():
        return _node_processes(run)

    assert wait_for(lambda: calls()[0] > 0, 30), log('prober-0')
    processes, created = node_processes(), list(server.created)
    coordinator = f'{coordinator_pod_name(server, run)}-{names.COORDINATOR_CONTAINER}'
    # As the OOM killer would: `podman kill` counts as stopped by the user, never restarted.
    os.kill(int(_podman('inspect', '--format', '{{.State.Pid}}', coordinator)), signal.SIGKILL)
    killed_at = calls()
    assert wait_for(lambda: 're-adopted the 4 nodes' in log('coordinator', 'coordinator'), 60), \
        log('coordinator', 'coordinator')
    assert _podman('inspect', '--format', '{{.RestartCount}}', coordinator).strip() == '1'
    readopted_at = calls()
    assert readopted_at[0] > killed_at[0], log('prober-0')  # served while none supervised
    assert wait_for(lambda: calls()[0] > readopted_at[0] + 50, 30), log('prober-0')
    assert calls()[1] == killed_at[1] == 0, log('prober-0')
    assert node_processes() == processes
    assert server.created == created  # no pod made again
    status = attached.status()  # through the new coordinator (another observer token)
    assert status['worker/0'].restarts == 1, status
    assert {name: s.state for name, s in status.items() if name != 'member/1'} == {
        name: lp.NodeState.RUNNING for name in ('worker/0', 'member/0', 'prober/0')}, status


def _readopts_once_its_coordinator_pod_is_lost(server, run, log, capsys) -> None:
    """Delete the coordinator pod (`kubectl delete pod`, as an eviction or a lost node would):
    its Job makes a new pod, with a new address that the nodes' DNS name follows, whose
    coordinator re-adopts the node pods from the state kept in the Secret RUN-state. The same
    node containers served on (prober/0's counter kept increasing, no call failed), no node
    pod was made again, and `status` from the launching machine is answered by the new
    coordinator."""
    def calls():
        return _calls(log)

    def node_processes():
        return _node_processes(run)

    lost = coordinator_pod_name(server, run)
    processes, created, before = node_processes(), list(server.created), calls()
    deleted_at = time.monotonic()
    server.delete('Pod', lost)
    assert wait_for(lambda: coordinator_pod_name(server, run) not in (None, lost), 60)
    assert wait_for(lambda: 're-adopted the 4 nodes' in log('coordinator', 'coordinator'), 60), \
        log('coordinator', 'coordinator')

    def answered():  # (lp.attach takes the new coordinator's token from the relay on a refusal)
        try:
            return lp.attach(run).status()['prober/0'].state is lp.NodeState.RUNNING
        except Exception:  # pylint: disable=broad-except  (the new pod does not serve yet)
            return False
    assert wait_for(answered, 90), log('coordinator', 'coordinator')
    with capsys.disabled():  # (the test's output, not the commands')
        print(f'coordinator pod deleted to status answered by the new one: '
              f'{time.monotonic() - deleted_at:.1f} s')
    capsys.readouterr()
    assert cli.main(['status', run, '--json']) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)['controller']['host'] == f'job/{run}-coordinator'
    said = coordinator_job.recovery_of_entry(  # what `attach --recover` says
        next(entry for entry in registry.entries() if entry.id == run))
    assert 'lost its pod 1 time' in said, said
    assert f'its pod {coordinator_pod_name(server, run)} runs now' in said, said
    assert wait_for(lambda: calls()[0] > before[0] + 50, 30), log('prober-0')
    assert calls()[1] == 0, log('prober-0')
    assert node_processes() == processes  # 0 node restarts
    assert [c for c in server.created if c not in created] == [
        ('Pod', coordinator_pod_name(server, run))], server.created  # no node pod made again
    assert 'reading the state an earlier coordinator pod kept in the Secret' in log(
        'coordinator', 'coordinator')
