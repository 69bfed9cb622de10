"""A detached Slurm program is supervised inside its job as a foreground one is by its launcher:
it grows (in its allocation, and beyond it through additional jobs) and shrinks with the launching
process gone, and keeps its run file; the login side reaches its driver through a step of the job
(docs/detach.md, docs/slurm.md). Needs the Slurm test bed (`slurm_multi`, tests/conftest.py)."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import psutil
import pytest

from launchpad.observe import registry
from tests.core.conftest import wait_until
from tests.launch.test_slurm import additional_jobs, env_for, our_processes, queue

SCRIPT = '''
import sys
import launchpad as lp
from tests import elastic_program
sizes = tuple(int(size) for size in sys.argv[1:])
controller = lp.launch(elastic_program.build(sizes=sizes, driver=bool(sizes)),
                       launch_type='slurm', detach=True, spare_tasks=1)
print('LAUNCHED', controller.id, flush=True)
'''
PYTHON = [sys.executable, '-m', 'launchpad.launch']


@pytest.fixture
def runtime_dir(monkeypatch):
    """This side's registry, private to the test, in a short path (its tunnels' sockets)."""
    path = tempfile.mkdtemp(prefix='lp-rt-')
    monkeypatch.setenv(registry.ENV, path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def launch(tmp_path, *sizes):
    """Runs SCRIPT, which launches the program detached and ends; returns (its environment, the
    program's id, its job id, what the launch printed)."""
    script = tmp_path / 'detach.py'
    script.write_text(SCRIPT)
    env = env_for(tmp_path)
    env['LAUNCHPAD_RUNS_DIR'] = str(tmp_path / 'runs')
    launched = subprocess.run([sys.executable, str(script), *map(str, sizes)],
                              capture_output=True, text=True, timeout=90, env=env)
    assert launched.returncode == 0, launched.stderr
    program_id = launched.stdout.split('LAUNCHED ')[1].split()[0]
    job_id = launched.stderr.split('as Slurm job ')[1].split()[0]
    return env, program_id, job_id, launched.stderr


def sql(env, run, query):
    done = subprocess.run([sys.executable, '-m', 'launchpad.launch', 'sql', run, query, '--json'],
                          capture_output=True, text=True, timeout=60, env=env, check=True)
    return json.loads(done.stdout)


@pytest.mark.timeout(240)
def test_a_detached_elastic_program_grows_and_shrinks_without_its_launcher(slurm_multi, tmp_path,
                                                                          runtime_dir):
    """tests/elastic_program.py grows the actors 2 -> 4 -> 1 from a node, after the launching
    script has ended: actor/2 runs in the job's one spare task, actor/3 in an additional job;
    the learner hears exactly the live actors throughout. The program's run file says how it
    went, and nothing is left once it ended."""
    env, program_id, job_id, printed = launch(tmp_path, 4, 1)
    for how in (f'sql {program_id}', f'scancel {job_id}', f'attach {program_id}'):
        assert how in printed, printed
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


@pytest.mark.timeout(180)
def test_the_login_side_attaches_resizes_follows_and_stops_a_detached_program(
        slurm_multi, tmp_path, runtime_dir):
    """From this side (the login node): `list` shows the program with its job and batch host,
    `lp.attach` resizes its group (the driver in the job runs the new node), `status --json`
    names the driver, `logs` reads the nodes' output, `attach` follows it until Ctrl-C, which
    leaves it running, and `stop` ends it; nothing is left on any node or here."""
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    env, program_id, job_id, _ = launch(tmp_path)
    env[registry.ENV] = runtime_dir

    def cli(*args):
        done = subprocess.run([*PYTHON, *args], capture_output=True, text=True, timeout=60,
                              env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    [listed] = json.loads(cli('list', '--json'))
    assert (listed['id'], listed['job'], listed['launch_type']) == (program_id, job_id, 'slurm')
    assert listed['host'] in ('lp-h1', 'lp-h2', 'lp-h3'), listed
    assert f'on {listed["host"]} (job {job_id})' in cli('list')

    controller = lp.attach(program_id)
    assert {name: s.state.value for name, s in controller.status().items()} == {
        'learner/0': 'running', 'actor/0': 'running', 'actor/1': 'running'}
    controller.resize('actor', 3)
    assert controller.group_size('actor') == 3
    assert wait_until(lambda: controller.status()['actor/2'].state.value == 'running',
                      timeout=30), controller.status()

    status = json.loads(cli('status', program_id, '--json'))
    assert status['controller'] == {'host': listed['host'], 'pid': listed['pid'], 'job': job_id}
    driver = psutil.Process(listed['pid'])  # (the bed's nodes share this machine's processes)
    assert 'launchpad.launch.slurm.driver' in ' '.join(driver.cmdline())
    assert sorted(row['name'] for row in status['nodes']) == [
        'actor/0', 'actor/1', 'actor/2', 'learner/0']
    cli('logs', program_id)  # the steps' output files, read by the driver

    errors = tmp_path / 'attach.err'
    with open(errors, 'w') as err:
        follower = subprocess.Popen([*PYTHON, 'attach', program_id], stdout=subprocess.DEVNULL,
                                    stderr=err, env=env)
    try:
        assert wait_until(lambda: 'Ctrl-C detaches' in errors.read_text(), timeout=30), \
            errors.read_text()
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=30)
    finally:
        follower.kill()
    err = errors.read_text()
    assert follower.returncode == 0 and 'it keeps running' in err, err
    assert controller.status()['learner/0'].state.value == 'running'

    assert f'Stopped elastic ({program_id})' in cli('stop', program_id)
    assert controller.wait(timeout=30)
    assert queue() == ''
    job_dir = tmp_path / 'jobs' / os.listdir(tmp_path / 'jobs')[0]
    assert wait_until(lambda: os.listdir(job_dir) == ['logs'], timeout=10)
    assert wait_until(lambda: not our_processes(str(job_dir)), timeout=10), \
        our_processes(str(job_dir))
    assert not our_processes('launchpad-relay') and not our_processes('observe/relay.py')
    assert os.listdir(runtime_dir) == []  # the entry, and every tunnel's socket
    assert not glob.glob(f'/tmp/launchpad-slurm-{os.getuid()}-{job_id}')  # the driver's registry


@pytest.mark.timeout(120)
def test_a_killed_driver_ends_the_program_and_leaves_nothing(slurm_multi, tmp_path, runtime_dir):
    """Nothing replaces a SIGKILLed driver (docs/slurm.md): its nodes stop without their
    coordinator, the job ends, and the batch script removes what the driver would have; the
    next command here says the program has ended and forgets it."""
    env, program_id, job_id, _ = launch(tmp_path)
    env[registry.ENV] = runtime_dir
    [entry] = registry.entries()
    os.kill(entry.pid, signal.SIGKILL)  # (the bed's nodes share this machine's processes)
    assert wait_until(lambda: queue() == '', timeout=60), queue()
    job_dir = tmp_path / 'jobs' / os.listdir(tmp_path / 'jobs')[0]
    assert os.listdir(job_dir) == ['logs']
    assert 'Killed' in (job_dir / 'logs' / 'job.out').read_text()
    assert not glob.glob(f'/tmp/launchpad-slurm-{os.getuid()}-{job_id}')
    assert wait_until(lambda: not our_processes(str(job_dir)), timeout=10), \
        our_processes(str(job_dir))
    done = subprocess.run([*PYTHON, 'status', program_id], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 1 and 'has ended' in done.stderr, done.stderr
    assert os.listdir(runtime_dir) == []
