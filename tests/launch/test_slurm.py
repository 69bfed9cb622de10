"""The slurm launch type against a real Slurm cluster (the test bed): single node and three nodes.

Tests that need the cluster take the `slurm_single` / `slurm_multi` fixtures (tests/conftest.py);
they skip when the bed is unavailable unless LAUNCHPAD_TESTBEDS=required. Single-node tests come
first so that the session switches the cluster only once.
"""
import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

import launchpad as lp
from launchpad.launch.slurm.launcher import SlurmLauncher
from launchpad.launch.slurm.script import batch_script, plan

from tests.core.conftest import script_env, wait_until

pytestmark = pytest.mark.timeout(120)


# --- programs ----------------------------------------------------------------------------------

class Producer:
    def produce(self, x):
        return x * x, socket.gethostname()


def consume(producers, results_path):
    results = [producer.produce(i + 1) for i, producer in enumerate(producers)]
    with open(results_path, 'w') as f:
        f.write(repr(results))
    with open(results_path + '.protocols', 'w') as f:  # What carried the calls.
        f.write(repr(sorted({producer.protocol for producer in producers})))
    print('consumed', [value for value, _ in results], flush=True)
    lp.stop()


def producer_consumer(results_path, producers=2):
    program = lp.Program('producer-consumer')
    with program.group('producer'):
        handles = [program.add_node(lp.CourierNode(Producer)) for _ in range(producers)]
    program.add_node(lp.PyNode(consume, handles, results_path), label='consumer')
    return program


class Learner:
    def __init__(self, updates_to_stop):
        self._updates = 0
        self._updates_to_stop = updates_to_stop

    def update(self, actor, trajectory):
        self._updates += 1
        if self._updates == self._updates_to_stop:
            lp.stop()
        return self._updates, socket.gethostname()


class Actor:
    def __init__(self, learner, index):
        self._learner = learner
        self._index = index

    def run(self):
        while not lp.stop_event().is_set():
            try:
                self._learner.update(self._index, [self._index] * 10)
            except Exception:  # pylint: disable=broad-except
                if not lp.stop_event().is_set():
                    raise


def actor_learner(actors=2, updates_to_stop=20):
    program = lp.Program('actor-learner')
    # Calls fail at once (rather than wait) once the learner has stopped serving.
    learner = program.add_node(lp.CourierNode(Learner, updates_to_stop,
                                              courier_client_kwargs={'wait_for_ready': False}),
                               label='learner')
    with program.group('actor'):
        for index in range(actors):
            program.add_node(lp.PyClassNode(Actor, learner, index))
    return program


def serve_until_stopped():
    print('serving', flush=True)
    lp.wait_for_stop()


def raise_soon(message):
    time.sleep(0.3)
    raise ValueError(message)


def exit_hard():
    time.sleep(0.3)
    print('exiting hard now', flush=True)
    os._exit(7)  # pylint: disable=protected-access


def ignore_stop():
    lp.register_stop_handler(lambda: None)  # it cooperates, so it gets the notice period...
    while True:  # ...but never ends
        time.sleep(0.1)


def two_groups(function, *args, name='program'):
    program = lp.Program(name)
    program.add_node(lp.PyNode(serve_until_stopped), label='server')
    program.add_node(lp.PyNode(function, *args), label='worker')
    return program


# --- helpers -----------------------------------------------------------------------------------

def launch(program, tmp_path, **kwargs):
    kwargs.setdefault('job_dir', str(tmp_path / 'jobs'))
    return lp.launch(program, launch_type='slurm', **kwargs)


def queue():
    return subprocess.run(['squeue', '--noheader'], capture_output=True, text=True,
                          check=True).stdout.strip()


def our_processes(marker):
    found = []
    for process in psutil.process_iter(['cmdline']):
        cmdline = ' '.join(process.info['cmdline'] or ())
        if marker in cmdline and process.pid != os.getpid():
            found.append(cmdline)
    return found


def assert_nothing_left(controller, tmp_path):
    """The job, every step, every node process and the run files are gone; the logs stay."""
    assert controller.done
    assert queue() == '', 'jobs or steps left in the queue'
    marker = str(tmp_path / 'jobs')
    assert wait_until(lambda: not our_processes(marker), timeout=10), our_processes(marker)
    assert wait_until(lambda: not our_processes('slurmstepd'), timeout=10), \
        our_processes('slurmstepd')
    job_dir = os.path.dirname(controller.log_dir)
    assert sorted(os.listdir(job_dir)) == ['logs']
    assert 'job.out' in os.listdir(controller.log_dir)


def both_serving(job_dir):
    logs = [pathlib.Path(job_dir, 'logs', f'{name}_0.out') for name in ('server', 'worker')]
    return all(log.exists() and 'serving' in log.read_text() for log in logs)


def hosts(controller):
    return {name: status.host for name, status in controller.status().items()}


# --- no cluster needed -------------------------------------------------------------------------

def test_gpus_memory_and_partition_map_to_sbatch_and_srun_options(tmp_path):
    program = actor_learner(actors=3)
    resources = {
        'learner': lp.SlurmResources(cpus=4, mem='8G', gpus=2, gpu_type='a100', partition='gpu',
                                     time='1:00:00', extra_args=['--qos=high']),
        'actor': lp.SlurmResources(cpus=1, mem='500M')}
    options = lp.LaunchOptions('slurm', resources=resources)
    components = plan(lp.executables_of(program, options), resources, str(tmp_path))
    paths = {index: f'{tmp_path}/{index}.spec' for index in range(4)}
    script = batch_script('actor-learner', components, str(tmp_path), paths)
    header = [line for line in script.splitlines() if line.startswith('#SBATCH')]
    assert header == [
        '#SBATCH --ntasks=1', '#SBATCH --cpus-per-task=4', '#SBATCH --mem-per-cpu=2048M',
        '#SBATCH --gpus-per-task=a100:2', '#SBATCH --partition=gpu', '#SBATCH --time=1:00:00',
        '#SBATCH --qos=high',
        '#SBATCH hetjob',
        '#SBATCH --ntasks=3', '#SBATCH --cpus-per-task=1', '#SBATCH --mem-per-cpu=500M']
    steps = [line for line in script.splitlines() if line.startswith('step ')]
    assert len(steps) == 4
    assert '--het-group=0 --exact --ntasks=1 --nodes=1 --cpus-per-task=4 --mem-per-cpu=2048M ' \
           '--gpus-per-task=a100:2 --job-name=learner/0' in steps[0]
    assert all('--het-group=1 --exact' in step and '--gpus' not in step for step in steps[1:])
    assert all(step.endswith(f'{tmp_path}/{index}.spec &') for index, step in enumerate(steps))


def test_lp_resources_map_to_the_same_sbatch_and_srun_options(tmp_path):
    program = actor_learner(actors=2)
    options = lp.LaunchOptions('slurm', resources={
        'learner': lp.Resources(cpus=4, gpus=2, memory='8G'),
        'actor': lp.Resources(cpus=1, gpus=0)})
    SlurmLauncher().check(program, options)  # as lp.launch does
    assert options.resources['learner'] == lp.SlurmResources(cpus=4, gpus=2, mem='8192M')
    assert options.resources['actor'].env == {'CUDA_VISIBLE_DEVICES': '',
                                              'HIP_VISIBLE_DEVICES': ''}  # sees no GPU
    components = plan(lp.executables_of(program, options), options.resources, str(tmp_path))
    script = batch_script('actor-learner', components, str(tmp_path),
                          {index: f'{index}.spec' for index in range(3)})
    header = [line for line in script.splitlines() if line.startswith('#SBATCH')]
    assert header == [
        '#SBATCH --ntasks=1', '#SBATCH --cpus-per-task=4', '#SBATCH --mem-per-cpu=2048M',
        '#SBATCH --gpus-per-task=2', '#SBATCH hetjob', '#SBATCH --ntasks=2',
        '#SBATCH --cpus-per-task=1']
    # With fields of Slurm's own, and a share of a GPU, which Slurm does not allocate.
    assert lp.SlurmResources.from_resources(lp.Resources(gpus=1), partition='gpu') == \
        lp.SlurmResources(gpus=1, partition='gpu')
    with pytest.raises(ValueError, match='share of a GPU, which Slurm does not allocate'):
        SlurmLauncher().check(program, lp.LaunchOptions('slurm', resources={
            'actor': lp.Resources(gpus=0.5)}))


def test_groups_with_equal_resources_share_one_component(tmp_path):
    program = producer_consumer('unused', producers=3)
    options = lp.LaunchOptions('slurm', resources={})
    components = plan(lp.executables_of(program, options), {}, str(tmp_path))
    assert [len(component.steps) for component in components] == [4]
    script = batch_script('pc', components, str(tmp_path),
                          {i: f'{i}.spec' for i in range(4)})
    assert 'hetjob' not in script and '--het-group' not in script
    assert 'COURIER_AUTH_TOKEN' not in script


def test_an_elastic_group_reserves_its_room_to_grow_and_the_script_runs_added_steps(tmp_path):
    program = actor_learner(actors=2)
    options = lp.LaunchOptions('slurm', resources={'actor': lp.SlurmResources(cpus=2)})
    components = plan(lp.executables_of(program, options), options.resources, str(tmp_path),
                      spare={'actor': 4})
    assert [(len(c.steps), c.spare) for c in components] == [(1, 0), (2, 4)]
    script = batch_script('al', components, str(tmp_path), {i: f'{i}.spec' for i in range(3)},
                          growing=True)
    assert '#SBATCH --ntasks=1\n' in script and '#SBATCH --ntasks=6\n' in script
    assert '"$run"/*.add' in script
    assert '.add' not in batch_script('al', components, str(tmp_path),
                                      {i: f'{i}.spec' for i in range(3)})


class FakeSlurm:
    """A growing step runner of an actor/learner job (learner, actor/0, 1 spare task) whose
    sbatch, scancel and squeue are fakes: `submitted`, `cancelled`, `states` (job -> state)."""

    def __init__(self, tmp_path, monkeypatch):
        # pylint: disable=import-outside-toplevel,protected-access
        from launchpad.launch.slurm import addresses, growing, job
        from launchpad.process import spec as specs
        from launchpad.process.coordinator import Coordinator
        self.submitted, self.cancelled, self.states = [], [], {}
        monkeypatch.setattr(job, 'submit', lambda path, name, output, env: self.submitted.append(
            (os.path.basename(path), name, env)) or f'10{len(self.submitted)}')
        monkeypatch.setattr(job, 'cancel', self.cancelled.append)
        monkeypatch.setattr(job, 'states', lambda job_id: [
            (self.states.get(job_id, 'RUNNING'), 'None')])
        self.program = actor_learner(actors=4)
        options = lp.LaunchOptions('slurm', resources={})
        self.executables = lp.executables_of(self.program, options)  # learner, actor/0 .. 3
        self.run_dir = tmp_path / 'run'
        self.run_dir.mkdir()
        components = plan(self.executables[:2], {}, str(tmp_path), spare={'actor': 1})
        packer = specs.Packer('actor-learner', 'slurm', addresses.NodeAddressTable(
            published={}, coordinator='127.0.0.1:1'), '127.0.0.1:1')
        self.coordinator = Coordinator([e.name for _, e in self.executables])
        self.runner = growing.GrowingStepRunner(
            '100', str(self.run_dir), [step.watched() for step in components[0].steps],
            self.coordinator, watch_job=False, packer=packer, components=components,
            resources={}, log_dir=str(tmp_path), first_index=2, program_name='actor-learner',
            environment={'COURIER_AUTH_TOKEN': 't'}, warning_seconds=None)

    def add(self, number):
        """Adds actor/NUMBER (its executable's index is NUMBER + 1)."""
        self.runner.add_executable('actor', self.executables[number + 1][1],
                                   self.program.policy_of('actor/1'))

    def exited(self, index, code=0):
        (self.run_dir / f'{index}.exit').write_text(str(code))


def test_added_nodes_take_free_tasks_first_then_additional_jobs(tmp_path, monkeypatch):
    """The placement of added nodes: a free task of the allocation (a spare one, or one a node
    that ended freed) runs the next added node; without one, an additional job of one task does,
    cancelled once its removed node's step ended."""
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.add(1)  # the spare task
    assert (slurm.run_dir / '2.add').exists() and not slurm.submitted
    slurm.add(2)  # no free task: a job
    assert slurm.submitted == [('3.sh', 'actor-learner:actor/2', {'COURIER_AUTH_TOKEN': 't'})]
    script = (slurm.run_dir / '3.sh').read_text()
    assert '#SBATCH --ntasks=1' in script and 'step 3 ' in script and '.add' not in script
    slurm.exited(1)  # actor/0 ended: its task is free
    slurm.runner.poll()
    slurm.add(3)
    assert (slurm.run_dir / '4.add').exists() and len(slurm.submitted) == 1
    slurm.runner.remove('actor/2')
    slurm.runner.poll()
    assert slurm.cancelled == []  # its step still runs
    slurm.exited(3)
    assert slurm.runner.poll()['actor/2'] == 0 and slurm.cancelled == ['101']
    slurm.runner.release()
    assert slurm.cancelled == ['101'] and not slurm.run_dir.exists()


def test_a_node_whose_additional_job_ends_under_it_fails_with_slurms_state(tmp_path,
                                                                           monkeypatch):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.add(1)
    slurm.add(2)
    slurm.states['101'] = 'CANCELLED'
    assert wait_until(lambda: slurm.runner.poll()['actor/2'] is not None, timeout=10)
    status = slurm.coordinator.status()['actor/2']
    assert 'its Slurm job 101 ended while it ran: CANCELLED' in status.error
    slurm.runner.release()  # the ended job is cancelled again, harmlessly
    assert slurm.cancelled == ['101']


# An `srun` that notes the node it runs (its step's name) in $SRUN_LOG, and fails at once.
FAILING_SRUN = '''#!/bin/sh
for arg; do case $arg in --job-name=*) echo "${arg#--job-name=}" >> "$SRUN_LOG";; esac; done
exit 3
'''


def test_a_restart_asked_again_by_a_new_driver_runs_the_step_once(tmp_path):
    """A driver that asked for a failed node's restart dies before it noted the restart; its
    successor, re-adopting the node as still to be restarted, asks again: the batch script runs
    the step once more, not twice, and the next restart runs it again. The runner takes no exit
    code of a run before the one it asked for."""
    # pylint: disable=import-outside-toplevel
    from launchpad.launch.slurm.steps import StepRunner
    from launchpad.policy import NodePolicy
    from launchpad.process.coordinator import Coordinator
    srun = tmp_path / 'bin' / 'srun'
    srun.parent.mkdir()
    srun.write_text(FAILING_SRUN)
    srun.chmod(0o700)
    program = actor_learner(actors=1)
    components = plan(lp.executables_of(program, lp.LaunchOptions('slurm', resources={})), {},
                      str(tmp_path))
    steps = sorted((step for c in components for step in c.steps), key=lambda s: s.index)
    name = steps[0].executable.name
    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    script = tmp_path / 'job.sh'
    script.write_text(batch_script('al', components, str(run_dir), {0: 'spec', 1: 'spec'},
                                   restart_waits={0: 30}))
    coordinator = Coordinator([step.executable.name for step in steps], policies={
        step.executable.name: NodePolicy(restart=lp.RestartPolicy(max_restarts=5))
        for step in steps})
    ran = tmp_path / 'ran'
    ran.touch()

    def runner():  # a driver's
        return StepRunner('100', str(run_dir), [step.watched() for step in steps], coordinator,
                          watch_job=False)

    def runs():
        return ran.read_text().split().count(name)

    batch = subprocess.Popen(['bash', str(script)], cwd=tmp_path, env={
        **os.environ, 'PATH': f'{srun.parent}{os.pathsep}{os.environ["PATH"]}',
        'SRUN_LOG': str(ran)})
    try:
        dead = runner()
        assert wait_until(lambda: dead.poll()[name] == 3, timeout=30)  # it failed: restarting
        dead.restart(name)
        assert wait_until(lambda: runs() == 2, timeout=30)  # (the script took the request)
        new = runner()  # the node is still to be restarted, as far as it knows
        new.restart(name)
        coordinator.node_restarted(name)
        assert wait_until(lambda: new.poll()[name] == 3, timeout=30)  # the second run's code
        assert runs() == 2, ran.read_text()
        coordinator.node_failed(name, 'it failed again')
        new.restart(name)
        assert new.poll()[name] is None  # (not the second run's code)
        assert wait_until(lambda: new.poll()[name] == 3, timeout=30)
        assert runs() == 3, ran.read_text()
    finally:
        shutil.rmtree(run_dir)  # the script stops waiting for restarts
        try:
            batch.wait(timeout=10)
        finally:
            batch.kill()


def test_detached_script_starts_the_driver_as_a_module(tmp_path):
    program = producer_consumer('unused')
    options = lp.LaunchOptions('slurm', resources={})
    components = plan(lp.executables_of(program, options), {}, str(tmp_path))
    script = batch_script('pc', components, str(tmp_path), {i: f'{i}.spec' for i in range(3)},
                          detached=True)
    assert f'-m launchpad.launch.slurm.driver {tmp_path} &' in script
    # Without what supervises the program the driver fails at once, but only after starting as a module
    # that nothing imported before (which Python would warn about).
    done = subprocess.run([sys.executable, '-W', 'error::RuntimeWarning', '-m',
                           'launchpad.launch.slurm.driver', str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=script_env())
    assert done.returncode != 0
    assert 'supervision.pkl' in done.stderr and 'RuntimeWarning' not in done.stderr


def test_a_step_loads_nothing_of_the_launchers_side():
    code = ('import sys, launchpad.launch.slurm.addresses, launchpad.launch.slurm.shared; '
            'print(" ".join(m for m in sys.modules if m.startswith("launchpad.launch.slurm")))')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=60, env=script_env(), check=True)
    assert sorted(done.stdout.split()) == [
        'launchpad.launch.slurm', 'launchpad.launch.slurm.addresses',
        'launchpad.launch.slurm.shared']


def test_resources_are_checked_when_written():
    with pytest.raises(ValueError, match='mem'):
        lp.SlurmResources(mem='lots')
    with pytest.raises(ValueError, match='500B'):  # bytes are not megabytes
        lp.SlurmResources(mem='500B')
    assert lp.SlurmResources(mem='2GB').per_task_options()[1] == '--mem-per-cpu=2048M'
    with pytest.raises(ValueError, match='cpus'):
        lp.SlurmResources(cpus=0)
    with pytest.raises(ValueError, match='--qos=high'):
        lp.SlurmResources(extra_args=['--qos high'])
    with pytest.raises(TypeError, match='list'):
        lp.SlurmResources(extra_args='--qos=high')


def test_wrong_resources_type_and_unknown_options_are_named(tmp_path):
    program = two_groups(serve_until_stopped)
    with pytest.raises(TypeError,
                       match="SlurmResources or lp.Resources; group 'worker' got PythonProcess"):
        launch(program, tmp_path, resources={'worker': lp.PythonProcess()})
    with pytest.raises(TypeError, match="Unknown option\\(s\\) \\['partition'\\]"):
        launch(program, tmp_path, partition='debug')


def test_missing_sbatch_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))
    with pytest.raises(lp.SlurmError, match='sbatch.*not found.*PATH'):
        launch(two_groups(serve_until_stopped), tmp_path)
    assert not (tmp_path / 'jobs').exists() or not os.listdir(tmp_path / 'jobs')


# --- single-node cluster -----------------------------------------------------------------------

def test_producer_consumer_on_one_node(slurm_single, tmp_path, capfd):
    results = tmp_path / 'results'
    controller = launch(producer_consumer(str(results)), tmp_path)
    assert isinstance(controller, lp.SlurmController) and controller.job_id.isdigit()
    assert controller.wait(timeout=60)
    assert eval(results.read_text()) == [(1, slurm_single.nodes[0]), (4, slurm_single.nodes[0])]  # pylint: disable=eval-used
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}
    assert '[consumer/0] consumed [1, 4]' in capfd.readouterr().out
    with open(os.path.join(controller.log_dir, 'consumer_0.out')) as f:
        assert 'consumed [1, 4]' in f.read()
    assert_nothing_left(controller, tmp_path)


def test_actor_learner_on_one_node(slurm_single, tmp_path):
    controller = launch(actor_learner(actors=2), tmp_path, terminal='output_to_files')
    assert controller.wait(timeout=60)
    assert set(hosts(controller).values()) == set(slurm_single.nodes)
    assert_nothing_left(controller, tmp_path)


def test_stop_ends_the_job_and_the_token_travels_only_in_the_environment(slurm_single, tmp_path):
    controller = launch(two_groups(serve_until_stopped), tmp_path)
    assert wait_until(lambda: all(s.state is lp.NodeState.RUNNING
                                  for s in controller.status().values()), timeout=30)
    worker = psutil.Process(controller.status()['worker/0'].pid)
    token = worker.environ()['COURIER_AUTH_TOKEN']
    assert len(token) >= 32
    assert not our_processes(token)
    run_dir = os.path.join(os.path.dirname(controller.log_dir), 'run')
    assert os.stat(run_dir).st_mode & 0o777 == 0o700
    with open(os.path.join(run_dir, 'job.sh')) as f:
        assert token not in f.read()
    controller.stop()
    assert {s.state for s in controller.status().values()} == {lp.NodeState.FINISHED}
    assert_nothing_left(controller, tmp_path)


def test_node_ignoring_the_stop_is_cancelled_after_the_notice_period(slurm_single, tmp_path):
    controller = launch(two_groups(ignore_stop), tmp_path, notice_period=0.5)
    assert wait_until(lambda: controller.status()['worker/0'].state is lp.NodeState.RUNNING,
                      timeout=30)
    controller.stop()
    assert controller.status()['worker/0'].state is lp.NodeState.KILLED
    assert_nothing_left(controller, tmp_path)


def test_crashing_node_ends_the_program_with_its_name_and_error(slurm_single, tmp_path):
    controller = launch(two_groups(raise_soon, 'the answer is not 42'), tmp_path)
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=60)
    assert failure.value.node_name == 'worker/0'
    assert failure.value.message == 'ValueError: the answer is not 42'
    assert 'raise_soon' in failure.value.remote_traceback
    assert_nothing_left(controller, tmp_path)


def test_step_that_dies_without_reporting_fails_with_its_exit_code_and_log(slurm_single, tmp_path):
    controller = launch(two_groups(exit_hard), tmp_path)
    with pytest.raises(lp.NodeFailedError) as failure:
        controller.wait(timeout=60)
    assert failure.value.node_name == 'worker/0'
    assert 'exit code 7' in failure.value.message
    assert 'exiting hard now' in failure.value.message
    assert_nothing_left(controller, tmp_path)


def test_slurm_rejections_pass_slurms_message_through(slurm_single, tmp_path):
    program = two_groups(serve_until_stopped)
    with pytest.raises(lp.SlurmError, match='Invalid partition name'):
        launch(program, tmp_path, resources={'worker': lp.SlurmResources(partition='nope')})
    with pytest.raises(lp.SlurmError, match='[Mm]emory specification'):
        launch(program, tmp_path, resources={'worker': lp.SlurmResources(mem='100G')})
    with pytest.raises(lp.SlurmError, match='cannot start.*PartitionConfig'):
        launch(program, tmp_path, resources={'worker': lp.SlurmResources(cpus=64)})
    assert queue() == ''
    assert os.listdir(tmp_path / 'jobs') == []


def test_job_that_does_not_start_in_time_is_cancelled(slurm_single, tmp_path):
    later = lp.SlurmResources(extra_args=['--begin=now+1hour'])
    with pytest.raises(lp.SlurmError, match='did not start within 1 s.*BeginTime'):
        launch(two_groups(serve_until_stopped), tmp_path, resources={'worker': later},
               start_timeout=1)
    assert queue() == ''
    assert os.listdir(tmp_path / 'jobs') == []


SCRIPT = '''
import sys
import launchpad as lp
from tests.launch.test_slurm import producer_consumer, two_groups, serve_until_stopped
kind = sys.argv[1]
program = (two_groups(serve_until_stopped, name='forever') if kind in ('forever', 'grown')
           else producer_consumer(sys.argv[2]))
controller = lp.launch(program, launch_type=None if kind == 'cli' else 'slurm',
                       **({'detach': True} if kind == 'detach' else {}))
if kind == 'grown':  # the job has no spare task: worker/1 runs in an additional job
    controller.add_node(lp.PyNode(serve_until_stopped), label='worker')
print('launched job', controller.job_id, flush=True)
'''


def write_script(tmp_path, tail=''):
    script = tmp_path / 'script.py'
    script.write_text(SCRIPT + tail)
    return script


def env_for(tmp_path):
    """The environment of a launching script: the repository importable, job_dir in tmp_path."""
    return script_env({'LAUNCHPAD_SLURM_DIR': str(tmp_path / 'jobs')})


def test_cli_runs_a_script_on_slurm(slurm_single, tmp_path):
    results = tmp_path / 'results'
    done = subprocess.run(
        [sys.executable, '-m', 'launchpad.launch', '--type=slurm', str(write_script(tmp_path)),
         'cli', str(results)], capture_output=True, text=True, timeout=60, env=env_for(tmp_path))
    assert done.returncode == 0, done.stderr
    assert '[consumer/0] consumed [1, 4]' in done.stdout
    assert eval(results.read_text())[1][0] == 4  # pylint: disable=eval-used
    assert queue() == ''


@contextlib.contextmanager
def serving_script(tmp_path, kind='forever'):
    """A script that launches a program serving until stopped (`kind` 'grown': and adds a node,
    which runs in an additional job), and waits for it; yields the script process (once every
    node serves) and the job directory. The process is killed on exit."""
    process = subprocess.Popen(
        [sys.executable, str(write_script(tmp_path, 'controller.wait()\n')), kind],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for(tmp_path))
    try:
        for line in process.stdout:
            if line.startswith('launched job'):
                break
        job_dir = os.path.join(tmp_path, 'jobs', os.listdir(tmp_path / 'jobs')[0])
        assert wait_until(lambda: both_serving(job_dir), timeout=30)
        if kind == 'grown':
            added = pathlib.Path(job_dir, 'logs', 'worker_1-2.out')
            assert wait_until(lambda: added.exists() and 'serving' in added.read_text(),
                              timeout=60)
            assert len(queue().splitlines()) == 2  # the program's job and the additional one
        yield process, job_dir
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize('kind', ['forever', 'grown'])
def test_ctrl_c_cancels_the_program(slurm_single, tmp_path, kind):
    with serving_script(tmp_path, kind) as (process, job_dir):
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    assert 'Stopping program' in output
    assert process.returncode == 0, output
    assert queue() == ''
    assert wait_until(lambda: not our_processes(job_dir), timeout=10)
    assert os.listdir(job_dir) == ['logs']


def test_job_cancelled_behind_our_back_fails_the_running_nodes(slurm_single, tmp_path):
    controller = launch(two_groups(serve_until_stopped), tmp_path)
    assert wait_until(lambda: all(s.state is lp.NodeState.RUNNING
                                  for s in controller.status().values()), timeout=30)
    subprocess.run(['scancel', controller.job_id], check=True)
    with pytest.raises(lp.NodeFailedError, match=r'SIGTERM: the platform \(slurm\)|Slurm'):
        controller.wait(timeout=30)
    assert_nothing_left(controller, tmp_path)


@pytest.mark.parametrize('kind', ['forever', 'grown'])
def test_nodes_end_when_the_launcher_dies(slurm_single, tmp_path, kind):
    """Also those of additional jobs: they lose the coordinator and end, and their jobs too."""
    from launchpad.launch.slurm import shared  # pylint: disable=import-outside-toplevel
    with serving_script(tmp_path, kind) as (process, job_dir):
        process.kill()
    # The batch script starts added steps until the launcher has been silent ADDING_SILENCE s.
    assert wait_until(lambda: queue() == '', timeout=shared.ADDING_SILENCE + 30)
    assert wait_until(lambda: not our_processes(job_dir), timeout=10)



@pytest.mark.timeout(180)
def test_a_removed_node_that_outlives_its_notice_period_is_killed_alone(slurm_single, tmp_path):
    """Its step is cancelled; the job, and the nodes in it, run on."""
    program = lp.Program('stubborn')
    program.add_node(lp.PyNode(serve_until_stopped), label='server')
    with program.group('actor', elastic=lp.Elastic(min_size=0, max_size=2)):
        program.add_node(lp.PyNode(serve_until_stopped))
        program.add_node(lp.PyNode(ignore_stop))
    controller = launch(program, tmp_path, notice_period=1.0)
    try:
        assert wait_until(lambda: all(s.state is lp.NodeState.RUNNING
                                      for s in controller.status().values()), timeout=60)
        controller.remove_node('actor/1')
        assert wait_until(lambda: controller.status()['actor/1'].state.ended, timeout=60)
        time.sleep(2.0)  # what cancelling the job would end has had time to end
        status = controller.status()
        assert status['server/0'].state is lp.NodeState.RUNNING, status
        assert status['actor/0'].state is lp.NodeState.RUNNING, status
        assert not controller.done and queue() != ''
    finally:
        controller.stop()
    assert controller.wait(timeout=60)
    assert_nothing_left(controller, tmp_path)

# --- three-node cluster ------------------------------------------------------------------------

def test_producers_spread_over_nodes(slurm_multi, tmp_path):
    results = tmp_path / 'results'
    controller = launch(producer_consumer(str(results)), tmp_path,
                        resources={'producer': lp.SlurmResources(nodes=2)})
    assert controller.wait(timeout=60)
    placed = hosts(controller)
    assert sorted(placed.values()) == sorted(slurm_multi.nodes)
    assert [host for _, host in eval(results.read_text())] == [  # pylint: disable=eval-used
        placed['producer/0'], placed['producer/1']]
    # The consumer called a producer on another node over courier's framed protocol (TCP).
    assert (tmp_path / 'results.protocols').read_text() == "['framed']"
    assert_nothing_left(controller, tmp_path)


def test_heterogeneous_actor_learner_groups_land_on_different_nodes(slurm_multi, tmp_path):
    started = time.monotonic()
    controller = launch(actor_learner(actors=3, updates_to_stop=30), tmp_path, resources={
        'learner': lp.SlurmResources(cpus=2), 'actor': lp.SlurmResources(cpus=1)})
    assert controller.wait(timeout=60)
    placed = hosts(controller)
    actor_hosts = {placed[f'actor/{i}'] for i in range(3)}
    assert len(actor_hosts) == 1 and placed['learner/0'] not in actor_hosts
    assert set(placed.values()) <= set(slurm_multi.nodes)
    assert_nothing_left(controller, tmp_path)
    print(f'actor/learner on 2 nodes: {time.monotonic() - started:.1f} s')


def test_crashing_node_on_another_host(slurm_multi, tmp_path):
    program = two_groups(raise_soon, 'remote failure')
    controller = launch(program, tmp_path, resources={'worker': lp.SlurmResources(cpus=2)})
    with pytest.raises(lp.NodeFailedError, match='remote failure') as failure:
        controller.wait(timeout=60)
    assert failure.value.node_name == 'worker/0'
    assert hosts(controller)['worker/0'] != hosts(controller)['server/0']
    assert_nothing_left(controller, tmp_path)


def test_detached_program_outlives_the_launching_process(slurm_multi, tmp_path):
    results = tmp_path / 'results'
    done = subprocess.run([sys.executable, str(write_script(tmp_path)), 'detach', str(results)],
                          capture_output=True, text=True, timeout=60, env=env_for(tmp_path))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split('launched job ')[1].split()[0]
    assert f'scancel {job_id}' in done.stderr and 'launchpad.launch attach' in done.stderr
    assert wait_until(results.exists, timeout=60)
    assert eval(results.read_text())[1][0] == 4  # pylint: disable=eval-used
    assert wait_until(lambda: queue() == '', timeout=30)
    job_dir = os.path.join(tmp_path, 'jobs', os.listdir(tmp_path / 'jobs')[0])
    assert wait_until(lambda: os.listdir(job_dir) == ['logs'], timeout=10)
    with open(os.path.join(job_dir, 'logs', 'job.out')) as f:
        assert "Program 'producer-consumer' ended" in f.read()
    assert wait_until(lambda: not our_processes(job_dir), timeout=10)


@pytest.mark.timeout(240)
def test_an_elastic_group_grows_and_shrinks_within_the_allocation(slurm_multi, tmp_path, capfd):
    """tests/elastic_program.py: a node grows the actors 2 -> 6 -> 1; the job reserved the
    group's spare tasks (max_size 8) and the batch script runs the added steps. The job first
    waits in the queue (held, then released) for longer than the batch script waits for a
    silent launcher: it must still run the added steps. `logs RUN NODE` reads a node's log
    once the program has ended."""
    from tests import elastic_program  # pylint: disable=import-outside-toplevel
    held = lp.SlurmResources(extra_args=['--hold'])
    with _released_after(12.0):
        controller = launch(elastic_program.build(), tmp_path, resources={
            label: held for label in ('learner', 'actor', 'driver')})
    assert controller.wait(timeout=200)
    status = controller.status()
    assert {name: s.state for name, s in status.items() if name.startswith('actor/')} == {
        'actor/0': lp.NodeState.FINISHED,
        **{f'actor/{i}': lp.NodeState.REMOVED for i in range(1, 6)}}
    assert 'ELASTIC shrank to 1' in capfd.readouterr().out
    assert_nothing_left(controller, tmp_path)
    ended = subprocess.run(  # from the node logs its run directory links to
        [sys.executable, '-m', 'launchpad.launch', 'logs', controller.observer.id, 'driver/0'],
        capture_output=True, text=True, timeout=60, check=True)
    assert 'ELASTIC shrank to 1' in ended.stdout


@contextlib.contextmanager
def _released_after(seconds: float):
    """Releases the first held job in the queue `seconds` after it appears."""
    def release():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            held = subprocess.run(['squeue', '--noheader', '--states=PENDING', '--format=%i'],
                                  capture_output=True, text=True, check=True).stdout.split()
            if held:
                time.sleep(seconds)
                subprocess.run(['scontrol', 'release', held[0]], check=True)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def additional_jobs():
    """The names of the jobs in the queue that run one added node (program:node)."""
    out = subprocess.run(['squeue', '--noheader', '--format=%j'], capture_output=True, text=True,
                         check=True).stdout
    return sorted(name for name in out.split() if ':' in name)


@pytest.mark.timeout(300)
def test_an_elastic_group_grows_beyond_the_allocation_through_additional_jobs(
        slurm_multi, tmp_path, capfd):
    """tests/elastic_program.py grows the actors 2 -> 5 -> 2 in a job that reserved one spare
    task: actor/2 runs in the allocation, actor/3 and actor/4 each in an additional job, which
    joins the program's coordinator; the learner hears exactly the live actors throughout.
    Shrinking ends their steps and cancels their jobs while the program runs; after the stop
    nothing is left."""
    from tests import elastic_program  # pylint: disable=import-outside-toplevel
    controller = launch(elastic_program.build(sizes=(5, 2), stop=False), tmp_path,
                        spare_tasks=1)
    try:
        job_dir = os.path.dirname(controller.log_dir)
        with open(os.path.join(job_dir, 'run', 'job.sh')) as f:
            assert '#SBATCH --ntasks=5' in f.read()  # learner, driver, 2 actors and 1 spare
        assert wait_until(lambda: additional_jobs() == ['elastic:actor/3', 'elastic:actor/4'],
                          timeout=120), additional_jobs()
        assert wait_until(lambda: controller.status()['driver/0'].state.ended, timeout=180)
        assert controller.status()['driver/0'].state is lp.NodeState.FINISHED
        assert wait_until(lambda: additional_jobs() == [], timeout=60), additional_jobs()
        assert not controller.done and controller.group_size('actor') == 2
    finally:
        controller.stop()
    assert controller.wait(timeout=60)
    status = controller.status()
    assert {name: s.state for name, s in status.items() if name.startswith('actor/')} == {
        'actor/0': lp.NodeState.FINISHED, 'actor/1': lp.NodeState.FINISHED,
        **{f'actor/{i}': lp.NodeState.REMOVED for i in range(2, 5)}}
    out = capfd.readouterr().out
    assert 'ELASTIC grew to 5' in out and 'ELASTIC shrank to 2' in out
    # The additional jobs' own output files: one per node that ran in one.
    assert sorted(name for name in os.listdir(controller.log_dir) if name.startswith('job-')) \
        == ['job-5.out', 'job-6.out']
    assert_nothing_left(controller, tmp_path)


def test_spare_tasks_must_be_a_count(tmp_path):
    with pytest.raises(ValueError, match='spare_tasks must be a whole number >= 0'):
        launch(actor_learner(), tmp_path, spare_tasks=-1)
