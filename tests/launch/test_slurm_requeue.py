"""A requeued Slurm job (`requeue=True`) runs again as the same program, from its checkpoints:
requeued by hand, then by its time-limit warning; a node that had finished is left out."""
import subprocess

import pytest

import launchpad as lp
from launchpad.launch.slurm.script import batch_script, plan

from tests import checkpoint_programs as programs
from tests.core.conftest import wait_until
from tests.launch.test_slurm import assert_nothing_left, launch


def job_state(job_id):
    return subprocess.run(['squeue', '--noheader', f'--jobs={job_id}', '--states=all',
                           '--format=%T'], capture_output=True, text=True).stdout.strip()


def test_requeue_is_submitted_with_a_warning_to_the_batch_script(tmp_path):
    program = programs.saver_program(str(tmp_path), 'wait')
    executables = lp.executables_of(program, lp.LaunchOptions('slurm'))
    text = batch_script('p', plan(executables, {}, str(tmp_path)), str(tmp_path), {0: 's', 1: 's'},
                        warning_seconds=90, requeue=True)
    assert '#SBATCH --requeue\n#SBATCH --signal=B:USR1@90\n' in text
    assert "trap 'scontrol requeue \"$SLURM_JOB_ID\"' USR1" in text
    with pytest.raises(ValueError, match='detached'):
        lp.launch(program, launch_type='slurm', requeue=True, detach=True)


def requeued(controller, results, requeue, attempt):
    """Requeues the job with `requeue` once every node's `attempt` has run, lets Slurm start it
    again at once, and checks what `status` says meanwhile."""
    assert wait_until(lambda: len(list(results.iterdir())) == 2 * (attempt + 1) + 1, timeout=60)
    assert wait_until(lambda: controller.status()['done/0'].state is lp.NodeState.FINISHED)
    subprocess.run(requeue + [controller.job_id], check=True)
    assert wait_until(lambda: all(
        status.restarts == attempt + 1 and f'requeue {attempt + 1})' in (status.error or '')
        for name, status in controller.status().items() if name != 'done/0'),
        timeout=60), controller.status()
    assert wait_until(lambda: job_state(controller.job_id) == 'PENDING', timeout=30)
    # Slurm holds a requeued job back for a while (its BeginTime); the test lets it go at once.
    subprocess.run(['scontrol', 'update', f'JobId={controller.job_id}', 'StartTime=now'],
                   check=True)


@pytest.mark.timeout(240)
def test_a_requeued_job_resumes_the_program_from_its_stop_handlers_checkpoints(slurm_multi,
                                                                                tmp_path):
    """No restart policy: a node that reported its SIGTERM as a failure would fail the program."""
    results = tmp_path / 'results'
    results.mkdir()
    program = programs.saver_program(str(results), 'wait', restart=False, attempts=2)
    program.add_node(lp.PyNode(programs.saver, str(results), 'wait', 0), label='done')
    controller = launch(program, tmp_path, requeue=True, notice_period=2.0)
    job_id = controller.job_id
    requeued(controller, results, ['scontrol', 'requeue'], attempt=0)
    # What Slurm sends before the time limit: the batch script requeues the job itself.
    requeued(controller, results, ['scancel', '--batch', '--signal=USR1'], attempt=1)
    assert controller.wait(timeout=120)
    found = programs.restored(str(results))
    assert sorted(found) == [('done', 0, 0)] + [('saver', i, a) for i in (0, 1) for a in (0, 1, 2)]
    for index in (0, 1):
        assert [found['saver', index, a]['restored'] for a in (0, 1, 2)] == [
            {'steps': 0, 'saved_by': []}, {'steps': 1, 'saved_by': [0]},
            {'steps': 2, 'saved_by': [0, 1]}]
        assert len({found['saver', index, a]['checkpoint_dir'] for a in (0, 1, 2)}) == 1
    status = controller.status()
    assert [(s.state, s.restarts) for s in status.values()] == [
        (lp.NodeState.FINISHED, 2)] * 2 + [(lp.NodeState.FINISHED, 0)]  # done/0 never ran again
    assert controller.job_id == job_id
    assert_nothing_left(controller, tmp_path)
