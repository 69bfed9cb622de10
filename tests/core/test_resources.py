"""lp.Resources on local_mp: each node's GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3 in the launching
environment stands for four devices), cores and thread counts, the preflight, restarts and nodes
joining and leaving."""
import os

import psutil
import pytest

import launchpad as lp
from launchpad.observe import cli
from launchpad.process.devices import Allocator, Inventory, ResourceShortfallError
from tests.core.conftest import wait_until


class Probe:
    """Tells what its process was given."""

    def seen(self):
        return {'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),
                'hip': os.environ.get('HIP_VISIBLE_DEVICES'),
                'omp': os.environ.get('OMP_NUM_THREADS'),
                'cores': sorted(os.sched_getaffinity(0)),
                'context': lp.get_context().resources}


def _probes(groups):
    """A program with `groups[label]` Probe nodes in each group, and their handles."""
    program = lp.Program('resources')
    handles = {}
    for label, count in groups.items():
        with program.group(label):
            handles[label] = [program.add_node(lp.CourierNode(Probe)) for _ in range(count)]
    return program, handles


def _seen(handles):
    return {f'{label}/{i}': handle.dereference().seen()
            for label, group in handles.items() for i, handle in enumerate(group)}


@pytest.fixture
def four_devices(monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,1,2,3')
    monkeypatch.delenv('HIP_VISIBLE_DEVICES', raising=False)


def _two_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f'needs 2 cores to pin two nodes apart; this process may use {cores}')
    return cores


def test_each_node_gets_its_devices_cores_and_thread_counts(four_devices, capsys):
    cores = _two_cores()
    program, handles = _probes({'learner': 1, 'actor': 3, 'evaluator': 1, 'plain': 1})
    controller = lp.launch(program, launch_type='test_mp', resources={
        'learner': lp.Resources(gpus=2, cpus=1),
        'actor': lp.Resources(gpus=0.5),
        'evaluator': lp.PythonProcess(env={'EXTRA': '1'}, resources=lp.Resources(gpus=0, cpus=1)),
    })
    seen = _seen(handles)
    assert seen['learner/0']['cuda'] == seen['learner/0']['hip'] == '0,1'
    # Halves share a device: two actors on device 2, the third on device 3.
    assert [seen[f'actor/{i}']['cuda'] for i in range(3)] == ['2', '2', '3']
    assert seen['evaluator/0']['cuda'] == ''  # asks for no GPU: sees none
    assert seen['plain/0']['cuda'] == '0,1,2,3'  # no resources: the launching environment's
    # Disjoint cores, and thread counts that follow them.
    assert seen['learner/0']['cores'] == [cores[0]]
    assert seen['evaluator/0']['cores'] == [cores[1]]
    assert seen['learner/0']['omp'] == seen['evaluator/0']['omp'] == '1'
    assert seen['actor/0']['cores'] == cores and seen['actor/0']['omp'] is None
    # Each node reads what it was given.
    learner = seen['learner/0']['context']
    assert (learner.requested, learner.gpus, learner.cores) == (
        lp.Resources(gpus=2, cpus=1), ('0', '1'), (cores[0],))
    assert seen['actor/1']['context'].gpu_share == 0.5
    assert seen['plain/0']['context'] is None
    # status and the CLI show each node's devices and cores.
    status = controller.status()
    assert {name: (s.devices, s.cores) for name, s in status.items()} == {
        'learner/0': ('0,1', str(cores[0])), 'evaluator/0': ('none', str(cores[1])),
        'actor/0': ('2 (0.5 each)', ''), 'actor/1': ('2 (0.5 each)', ''),
        'actor/2': ('3 (0.5 each)', ''), 'plain/0': ('', '')}
    capsys.readouterr()
    assert cli.main(['status', 'resources']) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line for line in table if line.startswith('NODE'))
    assert 'GPUS' in header and 'CORES' in header
    learner = next(line for line in table if line.startswith('learner/0'))
    assert learner[header.index('GPUS'):].split()[:2] == ['0,1', str(cores[0])]
    controller.stop()


def test_a_program_asking_too_much_fails_before_anything_starts(four_devices):
    cores = _two_cores()
    program, _ = _probes({'learner': 2, 'actor': 3, 'plain': 1})
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ResourceShortfallError) as error:
        lp.launch(program, launch_type='test_mp', resources={
            'learner': lp.Resources(gpus=3),
            'actor': lp.Resources(cpus=len(cores))})
    message = str(error.value)
    assert "localhost: group 'learner': 1 node(s) asking gpus=3" in message
    assert '4 GPU(s) (0,1,2,3, from CUDA_VISIBLE_DEVICES)' in message
    assert f"localhost: group 'actor': 2 node(s) asking cpus={len(cores)}" in message
    assert {p.pid for p in psutil.Process().children(recursive=True)} == children


def test_a_machine_without_devices_is_a_shortfall(monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    program, _ = _probes({'learner': 1})
    with pytest.raises(ResourceShortfallError, match='no GPU .none found by CUDA_VISIBLE_'):
        lp.launch(program, launch_type='test_mp', resources={'learner': lp.Resources(gpus=1)})


def restarted_once(path):
    attempt = lp.get_context().attempt
    with open(path, 'a') as f:
        f.write(f'{attempt} {os.environ["CUDA_VISIBLE_DEVICES"]} '
                f'{sorted(os.sched_getaffinity(0))}\n')
    if attempt == 0:
        raise RuntimeError('first attempt fails')


def test_a_restarted_node_keeps_its_devices_and_cores(four_devices, tmp_path):
    _two_cores()
    program = lp.Program('restart')
    program.add_node(lp.CourierNode(Probe), label='first')
    path = str(tmp_path / 'attempts')
    with program.group('restarted', restart=lp.RestartPolicy(max_restarts=1, backoff=0.0)):
        program.add_node(lp.PyNode(restarted_once, path))
    controller = lp.launch(program, launch_type='test_mp', resources={
        'first': lp.Resources(gpus=1, cpus=1), 'restarted': lp.Resources(gpus=1, cpus=1)})
    controller.wait(['restarted'], timeout=60)
    first, second = open(path).read().splitlines()
    assert first.startswith('0 1 ') and second.startswith('1 1 ')
    assert first[2:] == second[2:]
    assert controller.status()['restarted/0'].restarts == 1
    controller.stop()


def test_nodes_that_join_get_free_devices_and_a_removed_nodes_devices(four_devices):
    program, handles = _probes({'actor': 4})
    controller = lp.launch(program, launch_type='test_mp',
                           resources={'actor': lp.Resources(gpus=1)})
    assert sorted(s['cuda'] for s in _seen(handles).values()) == ['0', '1', '2', '3']
    with pytest.raises(ResourceShortfallError, match="group 'actor': 1 node.s. asking gpus=1"):
        controller.add_node(lp.CourierNode(Probe), 'actor')
    assert sorted(controller.status()) == [f'actor/{i}' for i in range(4)]  # nothing was added
    given_to_removed = handles['actor'][1].dereference().seen()['cuda']
    controller.remove_node('actor/1')
    assert wait_until(lambda: controller.status()['actor/1'].state is lp.NodeState.REMOVED,
                      timeout=60)
    added = controller.add_node(lp.CourierNode(Probe), 'actor')
    assert added.dereference().seen()['cuda'] == given_to_removed
    for i in (0, 2, 3):  # the others kept theirs
        assert handles['actor'][i].dereference().seen()['cuda'] == str(i)
    controller.stop()


def test_shares_fill_a_device_before_opening_the_next():
    devices = Allocator(Inventory('h', ('a', 'b'), (0, 1, 2), 'test'))
    quarter, half = lp.Resources(gpus=0.25), lp.Resources(gpus=0.5)
    given = [devices.assign(f'g/{i}', r).gpus for i, r in
             enumerate([quarter, half, quarter, half, quarter])]
    assert given == [('a',), ('a',), ('a',), ('b',), ('b',)]
    assert devices.use() == {'a': 1.0, 'b': 0.75}
    with pytest.raises(ResourceShortfallError, match="h: group 'x': 1 node.s. asking gpus=0.5"):
        devices.assign('x/0', half)
    devices.release('g/1')
    assert devices.assign('x/0', half).gpus == ('a',)
    assert devices.assign('g/0', half).gpus == ('a',)  # a node keeps what it has


@pytest.mark.parametrize('bad, message', [
    (dict(gpus=1.5), 'more than one GPU must be a whole number'),
    (dict(gpus=-1), 'number of GPUs >= 0'),
    (dict(cpus=0), 'whole number of cores >= 1'),
    (dict(cpus=1.5), 'whole number of cores >= 1'),
    (dict(memory='lots'), "like '512M' or '8G'"),
])
def test_bad_resources_say_what_to_give(bad, message):
    with pytest.raises(ValueError, match=message):
        lp.Resources(**bad)


def test_memory_sizes():
    assert lp.Resources(memory='8G').memory_bytes == 8 << 30
    assert lp.Resources(memory='512Mi').memory_bytes == 512 << 20
    assert lp.Resources(memory=1000).memory_bytes == 1000


def test_devices_are_found_by_nvidia_smi_unless_the_environment_names_them(tmp_path, monkeypatch):
    fake = tmp_path / 'nvidia-smi'
    fake.write_text('#!/bin/sh\necho "GPU 0: Stand-in (UUID: GPU-a)"\n'
                    'echo "GPU 1: Stand-in (UUID: GPU-b)"\n')
    fake.chmod(0o755)
    monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.delenv('HIP_VISIBLE_DEVICES', raising=False)
    found = Inventory.discover()
    assert (found.gpus, found.source) == (('0', '1'), 'nvidia-smi -L')
    assert found.cores == tuple(sorted(os.sched_getaffinity(0)))
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '1')  # it limits what may be handed out
    assert Inventory.discover().gpus == ('1',)
