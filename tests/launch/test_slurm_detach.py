"""A detached Slurm program is supervised inside its job as a foreground one is by its launcher:
it grows (in its allocation, and beyond it through additional jobs) and shrinks with the launching
process gone, and keeps its run file (docs/detach.md, docs/slurm.md). Needs the Slurm test bed
(`slurm_multi`, tests/conftest.py)."""
import json
import os
import subprocess
import sys

import pytest

from tests.core.conftest import wait_until
from tests.launch.test_slurm import additional_jobs, env_for, our_processes, queue

SCRIPT = '''
import launchpad as lp
from tests import elastic_program
controller = lp.launch(elastic_program.build(sizes=(4, 1)), launch_type='slurm', detach=True,
                       spare_tasks=1)
print('launched job', controller.job_id, flush=True)
'''


def sql(env, run, query):
    done = subprocess.run([sys.executable, '-m', 'launchpad.launch', 'sql', run, query, '--json'],
                          capture_output=True, text=True, timeout=60, env=env, check=True)
    return json.loads(done.stdout)


@pytest.mark.timeout(240)
def test_a_detached_elastic_program_grows_and_shrinks_without_its_launcher(slurm_multi, tmp_path):
    """tests/elastic_program.py grows the actors 2 -> 4 -> 1 from a node, after the launching
    script has ended: actor/2 runs in the job's one spare task, actor/3 in an additional job;
    the learner hears exactly the live actors throughout. The program's run file says how it
    went, and nothing is left once it ended."""
    script = tmp_path / 'detach.py'
    script.write_text(SCRIPT)
    env = env_for(tmp_path)
    env['LAUNCHPAD_RUNS_DIR'] = str(tmp_path / 'runs')
    launched = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=60, env=env)
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.split('launched job ')[1].split()[0]
    program_id = launched.stdout.split('its id is ')[1].split('.\n')[0]
    for how in (f'sql {program_id}', f'scancel {job_id}', 'tail -f'):
        assert how in launched.stdout, launched.stdout
    seen = set()  # the additional jobs seen while the program ran

    def ended():
        seen.update(additional_jobs())
        return queue() == ''

    assert wait_until(ended, timeout=180), queue()
    assert seen == {'elastic:actor/3'}

    job_dir = tmp_path / 'jobs' / os.listdir(tmp_path / 'jobs')[0]
    logs = job_dir / 'logs'
    out = (logs / 'driver_0.out').read_text()
    assert 'ELASTIC grew to 4' in out and 'ELASTIC shrank to 1' in out, out
    ended = (logs / 'job.out').read_text()
    states = eval(ended.split("Program 'elastic' ended: ")[1].splitlines()[0])  # pylint: disable=eval-used
    assert {name: state for name, state in states.items() if name.startswith('actor/')} == {
        'actor/0': 'finished', **{f'actor/{i}': 'removed' for i in range(1, 4)}}, ended
    assert sorted(name for name in os.listdir(logs) if name.startswith('job-')) == ['job-5.out']

    [run] = sql(env, program_id, 'SELECT launch_type, ended, stop_reason FROM run')
    assert run['launch_type'] == 'slurm' and run['ended'] is not None, run
    removed = sql(env, program_id, "SELECT DISTINCT node FROM node_states WHERE state = 'removed'"
                                   ' ORDER BY node')
    assert [row['node'] for row in removed] == ['actor/1', 'actor/2', 'actor/3']

    assert wait_until(lambda: os.listdir(job_dir) == ['logs'], timeout=10)
    assert wait_until(lambda: not our_processes(str(job_dir)), timeout=10), \
        our_processes(str(job_dir))


def test_the_controller_of_a_detached_job_refuses_to_resize_it_saying_why(tmp_path):
    """Its supervisor runs in the job, not in this process: growing it from here would fail
    with a misleading 'the program has ended'."""
    # pylint: disable=import-outside-toplevel
    import launchpad as lp
    from launchpad.launch.slurm.launcher import SlurmController
    from launchpad.launch.slurm.steps import StepRunner
    from launchpad.process.coordinator import Coordinator
    nothing = Coordinator([])
    controller = SlurmController('elastic', nothing, StepRunner('7', None, [], nothing,
                                                                watch_job=False),
                                 launch_type='slurm', job_id='7', log_dir=str(tmp_path),
                                 detached=True)
    controller.attach(lp.Program('elastic'), {})
    for call in (lambda: controller.add_node(lp.PyNode(print), 'actor'),
                 lambda: controller.remove_node('actor/0'), lambda: controller.resize('actor', 3)):
        with pytest.raises(RuntimeError, match=r"runs detached in Slurm job 7.*lp\.resize"):
            call()
