"""Observing Kubernetes programs: `stacks` and `waits` of an attached program reach its nodes
through the coordinator pod (the API's exec, played here by running the pod command in this
process); a detached program's coordinator pod keeps the program's run file on the volume
`runs_volume=` names, which `sql` and `dashboard RUN` read once copied out (here: the pod's side
against a fake API, the volume a directory)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import threading

import pytest

import launchpad as lp
from launchpad.launch import kubernetes
from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import in_cluster, names, pod
from launchpad.launch.kubernetes import launcher as kubernetes_launcher
from launchpad.observe import cli, inspect_cli, runstore
from launchpad.process import probe
from launchpad.policy import NodePolicy
from tests.launch.test_kubernetes_in_cluster import (SelectingApi, _manifests, _plan, _program,
                                                     _settings)
from tests.launch.test_kubernetes_launcher import FakeApi, _until, exited, launch, running
from tests.launch.test_kubernetes_manifests import _validate

pytestmark = pytest.mark.timeout(60)
RUNS_VOLUME = {'persistentVolumeClaim': {'claimName': 'runs'}}


def _sql(capsys, run: str, query: str) -> list:
    capsys.readouterr()  # (what the coordinator printed)
    assert cli.main(['sql', run, query, '--json']) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_detached_programs_coordinator_pod_keeps_its_run_file_on_the_named_volume(
        monkeypatch, tmp_path, caplog, capsys):
    with caplog.at_level(logging.WARNING):
        unkept = _plan(_program(), create_rbac=True)
    assert 'keeps no run file' in caplog.text and 'pass runs_volume=' in caplog.text
    assert _settings(unkept).runs_dir is None
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan = _plan(_program(), create_rbac=True, runs_volume=RUNS_VOLUME)
        attached = _plan(_program(), attached=True, runs_volume=RUNS_VOLUME)
    assert 'keeps no run file' not in caplog.text
    _validate(plan.documents)
    coordinator_pod = plan.pod_document(plan.coordinator_pod)
    assert {'name': 'runs', **RUNS_VOLUME} in coordinator_pod['spec']['volumes']
    assert {'name': 'runs', 'mountPath': names.RUNS_DIR} in \
        coordinator_pod['spec']['containers'][0]['volumeMounts']
    settings = _settings(plan)
    assert (settings.runs_dir, settings.program) == (names.RUNS_DIR, 'p')
    assert _settings(attached).runs_dir is None  # its launcher keeps the run file
    assert 'volumes' not in attached.pod_document(attached.coordinator_pod)['spec']
    with pytest.raises(ValueError, match='runs_volume must be one volume source'):
        _plan(_program(), runs_volume={'name': 'runs', **RUNS_VOLUME})

    # The coordinator pod's side: worker/0's pod is OOM-killed and created again, then the
    # program is stopped; the run file on the volume says so.
    monkeypatch.setattr(in_cluster.InClusterRunner, 'POLL_SECONDS', 0.0)
    volume = tmp_path / 'volume'
    settings = dataclasses.replace(settings, runs_dir=str(volume))
    api = SelectingApi()
    api.create(coordinator_pod)
    runner = in_cluster.InClusterRunner(api, 't1', _manifests(plan), plan.node_pods)
    coordinator = pod.PodCoordinator(settings.nodes, followed=False, policies={
        name: NodePolicy.from_json(policy) for name, policy in settings.policies.items()})
    controller = Controller('t1', coordinator, runner, launch_type='kubernetes',
                            notice_period=0.5, poll_interval=0.01)
    observer = pod.keep_run(settings, coordinator, controller)
    assert f'keeping the run file in {volume / "t1"}' in capsys.readouterr().out
    api.statuses['t1-worker-0'] = [running(), exited(137, 'OOMKilled'), running()]
    for name in ('t1-worker-0', 't1-other-0'):
        api.create(plan.pod_document(name))
    _until(lambda: controller.status()['worker/0'].restarts == 1, 'not restarted')
    _until(lambda: _sql(capsys, str(volume / 't1'), 'SELECT * FROM restarts'),
           'no restart in the run file')  # read while the pod writes it
    coordinator.request_stop('stopped by the test')
    _until(lambda: controller.done, 'the program did not end')
    _until(lambda: observer.view()['ended'], 'no last sample')

    run = str(volume / 't1')  # as copied out of the volume (kubectl cp)
    assert _sql(capsys, run, 'SELECT id, name, launch_type, stop_reason, ended IS NOT NULL AS '
                             'ended FROM run') == [
        {'id': 't1', 'name': 'p', 'launch_type': 'kubernetes',
         'stop_reason': 'stopped by the test', 'ended': 1}]
    assert _sql(capsys, run, 'SELECT node, restart FROM restarts') == [
        {'node': 'worker/0', 'restart': 1}]
    failures = _sql(capsys, run, 'SELECT node, message FROM failures')
    assert [f['node'] for f in failures] == ['worker/0'], failures
    assert 'OOMKilled, exit code 137' in failures[0]['message']
    states = {row['node'] for row in _sql(capsys, run, 'SELECT DISTINCT node FROM node_states')}
    assert states == {'worker/0', 'other/0'}
    stored = runstore.StoredRun(volume / 't1')  # what `dashboard RUN` serves
    try:
        assert stored.describe()['nodes'] == ['worker/0', 'other/0']
        assert {row['name'] for row in stored.view()['nodes']} == {'worker/0', 'other/0'}
    finally:
        stored.close()
    assert not (volume / 't1' / 'run.sqlite-wal').exists()  # one file, whole

    # Without a service account no controller runs in the pod; the run file is kept all the same.
    bare = dataclasses.replace(_settings(unkept), runs_dir=str(volume), run='t2')
    coordinator = pod.PodCoordinator(bare.nodes, followed=False)
    observer = pod.keep_run(bare, coordinator)
    coordinator.request_stop('the coordinator pod was deleted')
    observer.program_ended()  # as run_coordinator does when it ends
    assert _sql(capsys, str(volume / 't2'), 'SELECT name, stop_reason FROM run') == [
        {'name': 'p', 'stop_reason': 'the coordinator pod was deleted'}]


class ExecApi(FakeApi):
    """The fake API, running what is exec'd in the coordinator pod (`pod.py probe`) here."""

    unreachable = False

    def exec(self, pod_name, container, command, timeout):
        self.calls.append(('exec', pod_name, container, timeout))
        if self.unreachable:
            raise kubernetes.KubernetesError('pods "t1-coordinator" is forbidden: User "me" '
                                             'cannot create resource "pods/exec"')
        assert command[:3] == ['python3', '-m', names.POD_MODULE], command
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            pod.main(command[3:])
        return printed.getvalue()


def _answering(coordinator, name: str, stop: threading.Event) -> None:
    """What a node's probe thread does (`probe.start_answering`), until `stop`."""
    while not stop.is_set():
        asked = coordinator.wait_for_probe(name, None, 0.1)
        if asked:
            kinds = set().union(*(kinds for _, kinds in asked))
            coordinator.answer_probe(name, [probe_id for probe_id, _ in asked],
                                     probe.answer(kinds))


def test_an_attached_programs_nodes_are_probed_through_its_coordinator_pod(
        monkeypatch, tmp_path, capsys):
    api = ExecApi()
    monkeypatch.setattr(kubernetes_launcher.PodRunner, 'POLL_SECONDS', 0.0)
    lp.register_launcher('kubernetes_fake', lambda: kubernetes.KubernetesLauncher(lambda _: api))
    monkeypatch.setattr(names, 'PROBE_SOCKET', str(tmp_path / 'probes.sock'))
    # The coordinator pod's coordinator, worker/0's probe thread answering it; other/0 is silent.
    coordinator = pod.PodCoordinator(['worker/0', 'other/0'])
    server = pod.serve_probes(coordinator, names.PROBE_SOCKET)
    stop = threading.Event()
    answering = threading.Thread(target=_answering, args=(coordinator, 'worker/0', stop),
                                 name='worker-probe-thread')
    answering.start()
    controller = launch(_program())
    try:
        _until(lambda: {s.state for s in controller.status().values()} == {lp.NodeState.RUNNING},
               'the nodes did not run')
        program_id = controller.observer.id
        assert inspect_cli.main(['stacks', program_id, '--json']) == 0
        probed = json.loads(capsys.readouterr().out)['nodes']
        assert probed['worker/0']['live'] and not probed['other/0']['live']
        threads = {thread['name'] for thread in probed['worker/0']['stacks']}
        assert 'worker-probe-thread' in threads, threads
        assert ('exec', 't1-coordinator', names.COORDINATOR_CONTAINER) in [
            call[:3] for call in api.calls]
        assert inspect_cli.main(['waits', program_id, '--json']) == 0
        assert json.loads(capsys.readouterr().out)['silent'] == ['other/0']
        api.unreachable = True
        assert inspect_cli.main(['stacks', program_id]) == 1
        assert ('the nodes cannot be asked through the coordinator pod t1-coordinator: pods '
                '"t1-coordinator" is forbidden') in capsys.readouterr().err
    finally:
        stop.set()
        answering.join()
        server.Stop()
        controller.stop()
        controller.wait(timeout=20)


class _LogApi:
    """A pod log as the API serves it with timestamps; `since` and `tail` are what was asked."""

    def __init__(self):
        self.lines = []  # (seconds since the epoch as text 'SS.NNNNNNNNN', line)
        self.asked = []
        self.refusal = None

    def read_timestamped_log(self, pod, container, *, since_seconds=None, tail_lines=None):
        self.asked.append((pod, container, since_seconds, tail_lines))
        if self.refusal is not None:
            raise self.refusal
        lines = [f'2026-11-26T09:00:{when}Z {line}' for when, line in self.lines]
        return ''.join(line + '\n' for line in lines[-tail_lines if tail_lines else 0:])


def test_a_detached_programs_coordinator_pod_reads_node_logs_with_a_cursor():
    """`PodLogs`, which the coordinator pod's controller offers the observer (`logs`, `attach`):
    the last lines first, then only new ones, also among lines of one time (written at once),
    asking the API for the seconds since the last line plus a margin; a refusal is said."""
    from launchpad.launch.kubernetes.api import KubernetesError, NotFound  # pylint: disable=import-outside-toplevel
    from launchpad.launch.kubernetes.pod_logs import CLOCK_MARGIN, PodLogs  # pylint: disable=import-outside-toplevel
    api = _LogApi()
    now = [1795683610.0]  # 2026-11-26T09:00:10Z
    logs = PodLogs(api, {'worker/0': 't1-worker-0'}.get, clock=lambda: now[0])
    assert logs.read_log('worker/0') == ([], None)
    api.lines = [('01.000000001', 'one'), ('02.5', 'two'), ('02.5', 'three')]
    lines, cursor = logs.read_log('worker/0')
    assert lines == ['one', 'two', 'three']
    assert api.asked[-1] == ('t1-worker-0', 'node', None, 2000)
    assert logs.read_log('worker/0', cursor) == ([], cursor)
    assert api.asked[-1] == ('t1-worker-0', 'node', 8 + CLOCK_MARGIN, None)  # 09:00:02.5 +
    api.lines += [('02.5', 'four'), ('03.25', 'five in parts2026-11-26T09:00:03.5Z ')]
    lines, cursor = logs.read_log('worker/0', cursor)
    assert lines == ['four', 'five in parts']  # (the time of its newline taken out)
    assert logs.read_log('worker/0', cursor)[0] == []
    api.refusal = NotFound('no pod')  # deleted, or not created yet
    assert logs.read_log('worker/0', cursor) == ([], cursor)
    api.refusal = KubernetesError('forbidden by RBAC')
    with pytest.raises(LookupError, match='cannot read the log of pod t1-worker-0: forbidden'):
        logs.read_log('worker/0', cursor)
    with pytest.raises(LookupError, match="node 'other/0' has no pod"):
        logs.read_log('other/0')
