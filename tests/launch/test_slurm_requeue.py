"""A requeued Slurm job (`requeue=True`) runs again as the same program, from its checkpoints:
requeued by hand on the one-node bed, by its time-limit warning on the three-node bed."""
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


@pytest.mark.timeout(240)
@pytest.mark.parametrize('cluster', ['slurm_single', 'slurm_multi'])
def test_a_requeued_job_resumes_the_program_from_its_stop_handlers_checkpoints(cluster, request,
                                                                                tmp_path):
    request.getfixturevalue(cluster)
    results = tmp_path / 'results'
    results.mkdir()
    controller = launch(programs.saver_program(str(results), 'wait', restart=False), tmp_path,
                        requeue=True,
                        notice_period=2.0)
    assert wait_until(lambda: len(list(results.iterdir())) == 2, timeout=60)
    job_id = controller.job_id
    if cluster == 'slurm_single':
        subprocess.run(['scontrol', 'requeue', job_id], check=True)
    else:  # what Slurm sends before the time limit: the batch script requeues the job
        subprocess.run(['scancel', '--batch', '--signal=USR1', job_id], check=True)
    assert wait_until(lambda: all(status.restarts == 1 and 'requeued' in (status.error or '')
                                  for status in controller.status().values()), timeout=60), \
        controller.status()
    assert wait_until(lambda: job_state(job_id) == 'PENDING', timeout=30)
    # Slurm holds a requeued job back for a while (its BeginTime); the test lets it go at once.
    subprocess.run(['scontrol', 'update', f'JobId={job_id}', 'StartTime=now'], check=True)
    assert controller.wait(timeout=120)
    found = programs.restored(str(results))
    assert sorted(found) == [('saver', i, a) for i in (0, 1) for a in (0, 1)]
    for index in (0, 1):
        assert found['saver', index, 1]['restored'] == {'steps': 1, 'saved_by': [0]}
        assert found['saver', index, 1]['checkpoint_dir'] == found['saver', index, 0][
            'checkpoint_dir']
    status = controller.status()
    assert [(s.state, s.restarts) for s in status.values()] == [(lp.NodeState.FINISHED, 1)] * 2
    assert controller.job_id == job_id
    assert_nothing_left(controller, tmp_path)
