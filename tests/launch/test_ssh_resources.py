"""lp.Resources on the SSH test bed: each host declares a different list of stand-in GPUs (its
CUDA_VISIBLE_DEVICES), and every node gets devices and cores of the host it runs on."""
from __future__ import annotations

import dataclasses
import json
import os
import socket

import pytest

import launchpad as lp
from launchpad.process.devices import ResourceShortfallError
from tests.core.test_resources import restarted_once
from tests.launch.test_ssh import hosts  # pylint: disable=unused-import

pytestmark = pytest.mark.timeout(90)


def report() -> None:
    given = lp.get_context().resources
    print('SEEN ' + json.dumps({
        'node': lp.get_context().node_name, 'host': socket.gethostname(),
        'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),
        'omp': os.environ.get('OMP_NUM_THREADS'),
        'cores': sorted(os.sched_getaffinity(0)),
        'given_cores': None if given is None or given.cores is None else list(given.cores)}),
        flush=True)


def _declaring(host: lp.SshHost, devices: str) -> lp.SshHost:
    return dataclasses.replace(host, env={**host.env, 'CUDA_VISIBLE_DEVICES': devices})


def _program(groups):
    program = lp.Program('ssh-resources')
    for label, count in groups.items():
        with program.group(label):
            for _ in range(count):
                program.add_node(lp.PyNode(report))
    return program


def test_each_host_hands_out_its_own_devices_and_cores(hosts, capfd):
    h1, h2 = _declaring(hosts['lp-h1'], '0,1'), _declaring(hosts['lp-h2'], '5,6,7')
    cores = sorted(os.sched_getaffinity(0))
    controller = lp.launch(_program({'learner': 2, 'actor': 3, 'plain': 1}), launch_type='ssh',
                           resources={
                               'learner': lp.SshHosts([h1], resources=lp.Resources(gpus=1, cpus=1)),
                               'actor': lp.SshHosts([h2], resources=lp.Resources(gpus=0.5)),
                               'plain': h2})
    assert controller.wait(timeout=60)
    seen = {}
    for line in capfd.readouterr().out.splitlines():
        if 'SEEN ' in line:
            entry = json.loads(line.split('SEEN ', 1)[1])
            seen[entry['node']] = entry
    assert {name: (s['host'], s['cuda']) for name, s in seen.items()} == {
        'learner/0': ('lp-h1', '0'), 'learner/1': ('lp-h1', '1'),
        'actor/0': ('lp-h2', '5'), 'actor/1': ('lp-h2', '5'), 'actor/2': ('lp-h2', '6'),
        'plain/0': ('lp-h2', '5,6,7')}  # no resources: the host's own environment
    learners = [seen[f'learner/{i}'] for i in range(2)]
    if len(cores) >= 2:  # the bed's hosts share this machine's cores
        assert [s['cores'] for s in learners] == [[cores[0]], [cores[1]]]
        assert [s['given_cores'] for s in learners] == [[cores[0]], [cores[1]]]
    assert [s['omp'] for s in learners] == ['1', '1']


def test_a_shortfall_on_any_host_is_listed_before_anything_starts(hosts):
    h1, h2 = _declaring(hosts['lp-h1'], '0,1'), _declaring(hosts['lp-h2'], '')
    with pytest.raises(ResourceShortfallError) as error:
        lp.launch(_program({'learner': 3, 'actor': 1}), launch_type='ssh', resources={
            'learner': lp.SshHosts([h1], resources=lp.Resources(gpus=1)),
            'actor': lp.SshHosts([h2], resources=lp.Resources(gpus=0.5))})
    message = str(error.value)
    assert "lp-h1: group 'learner': 1 node(s) asking gpus=1" in message
    assert '2 GPU(s) (0,1, from CUDA_VISIBLE_DEVICES)' in message
    assert "lp-h2: group 'actor': 1 node(s) asking gpus=0.5" in message


def test_resources_without_hosts_say_how_to_give_both():
    program = _program({'learner': 1})
    with pytest.raises(TypeError, match=r"lp.SshHosts\(\['host1', 'host2'\], resources="):
        lp.launch(program, launch_type='ssh', resources={'learner': lp.Resources(gpus=1)})


def test_a_restarted_node_keeps_its_devices_on_its_host(hosts, tmp_path):
    h1 = _declaring(hosts['lp-h1'], '0,1')
    program = lp.Program('ssh-restart')
    program.add_node(lp.PyNode(report), label='first')
    path = str(tmp_path / 'attempts')  # the bed's hosts share this machine's files
    with program.group('restarted', restart=lp.RestartPolicy(max_restarts=1, backoff=0.0)):
        program.add_node(lp.PyNode(restarted_once, path))
    controller = lp.launch(program, launch_type='ssh', resources={
        'first': lp.SshHosts([h1], resources=lp.Resources(gpus=1)),
        'restarted': lp.SshHosts([h1], resources=lp.Resources(gpus=1, cpus=1))})
    assert controller.wait(timeout=60)
    first, second = open(path).read().splitlines()
    assert first.startswith('0 1 ') and second.startswith('1 1 ')
    assert first[2:] == second[2:]  # the same device and cores
    assert controller.status()['restarted/0'].restarts == 1
    assert controller.status()['restarted/0'].devices == '1'
