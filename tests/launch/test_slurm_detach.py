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
from tests.launch.detached_program import Counter
from tests.launch.test_slurm import additional_jobs, env_for, our_processes, queue

# The detached program of tests/launch/detached_program.py, whose workers hold their start until
# a file exists, and announce it with a file beside it (GATE.waiting): the first worker's process
# waits (FIRST) before it reports its start, an added one (a server) after it did, before it
# serves and publishes its address (ADDED). The driver's periodic state writer waits too, as if
# the driver were killed before it wrote the state: while FIRST is closed, and once a worker was
# added, while ADDED is (it pickles the worker group's node factory every time). A driver waits
# as it starts, before it serves, while DRIVER is closed. The caller also waits for the worker
# group's members to change, a coordinator call always in flight, and notes each membership it
# sees in SEEN (or the error a wait ended with).
READOPT_HELD = '''
import os
import sys
import threading
import time
import launchpad as lp
from tests.launch.detached_program import Counter, call_forever, idle


def wait_for(gate):
    while not os.path.exists(gate):
        time.sleep(0.05)


def announce_and_wait(gate):
    open(gate + '.waiting', 'w').close()
    wait_for(gate)


def unpickled(gate, hold):
    if hold and sys.argv[0].endswith(os.path.join('process', 'worker.py')):  # (a node's)
        announce_and_wait(gate)
    if sys.argv[0].endswith(os.path.join('slurm', 'driver.py')):
        wait_for(os.path.join(os.path.dirname(gate), 'driver'))
    return HeldStart(gate, hold)


class HeldStart:
    """A gate, which holds a node's unpickling if `hold`, and a starting driver's."""

    def __init__(self, gate, hold):
        self.gate, self.hold = gate, hold

    def __reduce__(self):
        return unpickled, (self.gate, self.hold)


def call_and_watch(counter, workers, seen):
    def watch():
        try:
            while not lp.stop_event().is_set():
                if workers.wait_for_change(timeout=None):
                    with open(seen, 'a') as f:
                        f.write(' '.join(workers.names()) + '\\n')
        except Exception as e:  # pylint: disable=broad-except
            with open(seen, 'a') as f:
                f.write(f'ERROR {type(e).__name__}: {e}\\n')

    threading.Thread(target=watch, daemon=True).start()
    call_forever(counter)


def held_idle(held):
    del held
    idle()


class HeldServer:
    """Serves once its gate opens."""

    def __init__(self, held):
        announce_and_wait(held.gate)

    def ping(self):
        return 'pong'


class HeldFactory:
    """The worker group's node factory, which holds the driver's state writer."""

    def __init__(self, first, added):
        self.first, self.added = first, added

    def __call__(self):
        open(self.added + '.made', 'w').close()
        return lp.CourierNode(HeldServer, HeldStart(self.added, hold=False))

    def __reduce__(self):
        if threading.current_thread().name == 'lp-slurm-persist':
            wait_for(self.first)
            if os.path.exists(self.added + '.made'):
                wait_for(self.added)
        return HeldFactory, (self.first, self.added)


counter_file, first, added, seen = sys.argv[1:]
program = lp.Program('detached')
counter = program.add_node(lp.CourierNode(Counter, counter_file), label='counter')
program.add_node(lp.PyNode(call_and_watch, counter, program.group_handle('worker'), seen),
                 label='caller')
with program.group('worker', elastic=lp.Elastic(make_node=HeldFactory(first, added),
                                                min_size=1, max_size=3)):
    program.add_node(lp.PyNode(held_idle, HeldStart(first, hold=True)))
controller = lp.launch(program, launch_type='slurm', detach=True, spare_tasks=1)
print('LAUNCHED', controller.id, flush=True)
'''
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
# An `sbatch` that SIGKILLs its caller (the driver) once, as soon as Slurm accepted the job
# named $KILL_AFTER_SUBMITTING (and notes the job in sbatch.submitted), before the caller could
# note the job's id.
SBATCH_KILLING_CALLER = '''#!/bin/sh
job_id=$({sbatch} "$@") || exit $?
echo "$job_id"
case " $* " in
  *" --job-name=$KILL_AFTER_SUBMITTING "*)
    echo "$job_id" >> "$0.submitted"
    [ -e "$0.killed" ] || {{ touch "$0.killed"; kill -9 "$PPID"; }};;
esac
'''


@pytest.fixture
def runtime_dir(monkeypatch):
    """This side's registry, private to the test, in a short path (its tunnels' sockets); a
    job the test launched and left (it failed) is cancelled, so that the next test finds none."""
    path = tempfile.mkdtemp(prefix='lp-rt-')
    monkeypatch.setenv(registry.ENV, path)
    yield path
    if queue():
        subprocess.run(['scancel', '--full', f'--user={os.getuid()}'], check=False)
        wait_until(lambda: queue() == '', timeout=60)
    shutil.rmtree(path, ignore_errors=True)


def launch(tmp_path, text, *args):
    """Runs the script `text`, which launches a program detached and ends; returns (its
    environment, the program's id, its job id, what the launch printed)."""
    script = tmp_path / 'detach.py'
    script.write_text(text)
    env = env_for(tmp_path)
    env['LAUNCHPAD_RUNS_DIR'] = str(tmp_path / 'runs')
    launched = subprocess.run([sys.executable, str(script), *map(str, args)],
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
    env, program_id, job_id, printed = launch(tmp_path, SCRIPT, 4, 1)
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
    # The run directory links to every node's log, an added one's too: `logs RUN NODE` reads it.
    assert (tmp_path / 'runs' / program_id / 'logs' / 'actor_3.log').resolve() == \
        logs / 'actor_3-5.out'
    ended_logs = subprocess.run([*PYTHON, 'logs', program_id, 'driver/0'], capture_output=True,
                                text=True, timeout=60, env=env)
    assert 'ELASTIC shrank to 1' in ended_logs.stdout, ended_logs.stderr

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
    names the driver, `logs` reads the nodes' output, `stacks` and `waits` reach the nodes,
    `attach` follows it until Ctrl-C, which
    leaves it running, and `stop` ends it; nothing is left on any node or here."""
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    env, program_id, job_id, _ = launch(tmp_path, SCRIPT)
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
    started = {'actor/0', 'actor/1', 'learner/0'}  # (and actor/2 from the next sample on)
    assert started <= {row['name'] for row in status['nodes']} <= started | {'actor/2'}
    cli('logs', program_id)  # the steps' output files, read by the driver
    # The nodes answer live probes through the driver: the learner's own loop is in its stacks,
    # and every running node tells its calls in flight.
    [learner] = json.loads(cli('stacks', program_id, 'learner/0', '--json'))['nodes'].values()
    assert learner['live'] and any(frame[0].endswith('elastic_program.py')
                                   for thread in learner['stacks'] for frame in thread['frames'])
    waits = json.loads(cli('waits', program_id, '--json'))
    assert (waits['silent'], waits['deadlocks']) == ([], []), waits

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
    assert wait_until(lambda: queue() == '', timeout=30), queue()
    job_dir = tmp_path / 'jobs' / os.listdir(tmp_path / 'jobs')[0]
    assert wait_until(lambda: os.listdir(job_dir) == ['logs'], timeout=10)
    assert wait_until(lambda: not our_processes(str(job_dir)), timeout=10), \
        our_processes(str(job_dir))
    assert not our_processes('launchpad-relay') and not our_processes('observe/relay.py')
    assert os.listdir(runtime_dir) == []  # the entry, and every tunnel's socket
    assert not glob.glob(f'/tmp/launchpad-slurm-{os.getuid()}-{job_id}')  # the driver's registry


def lines(path):
    """The lines of the file at `path` ([] while there is none)."""
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def drivers(tmp_path):
    """The pids of the in-job drivers of the program whose job directory is in `tmp_path`."""
    found = []
    for process in psutil.process_iter(['cmdline', 'status']):
        cmdline = ' '.join(process.info['cmdline'] or ())
        if ('launchpad.launch.slurm.driver' in cmdline and str(tmp_path) in cmdline
                and process.info['status'] != psutil.STATUS_ZOMBIE):
            found.append(process.pid)
    return found


@pytest.mark.timeout(150)
def test_a_killed_driver_is_replaced_by_one_that_readopts_the_running_and_starting_steps(
        slurm_multi, tmp_path, runtime_dir):
    """SIGKILL the driver while a node starts, with the driver's periodic state writer held
    meanwhile: first while the program's first nodes start (worker/0 has not reported), then
    while an added node starts (worker/1 has reported, and publishes its address once the
    driver is dead). Each time the batch script starts a new driver, which re-adopts every step
    with 0 restarts, the starting one included; the nodes keep serving each other (the
    counter's calls go on); `lp.attach`'s controller and `status --json` name the new driver.
    The first time, the new driver is held before it serves, and the dead one's socket removed:
    `lp.launch`, which asks the driver meanwhile, waits for the new one (the job runs), and
    returns with the program registered. Last, the group grows into an additional job, whose
    driver is SIGKILLed as soon as Slurm took the job: the next driver finds and follows that
    job (submitted once); `stop` leaves nothing. Throughout, the caller waits for the worker
    group to change (a call to the driver in flight at each kill): each wait goes on with the
    next driver, and sees every change and no other, with no error."""
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    counter, first, added, driver_gate, seen = (str(tmp_path / name) for name in (
        'counter.json', 'first', 'added', 'driver', 'seen'))
    with open(driver_gate, 'w'):
        pass  # drivers start at once
    script = tmp_path / 'detach.py'
    script.write_text(READOPT_HELD)
    sbatch = tmp_path / 'bin' / 'sbatch'
    sbatch.parent.mkdir()
    sbatch.write_text(SBATCH_KILLING_CALLER.format(sbatch=shutil.which('sbatch')))
    sbatch.chmod(0o700)
    env = env_for(tmp_path)
    env.update(LAUNCHPAD_RUNS_DIR=str(tmp_path / 'runs'), KILL_AFTER_SUBMITTING='detached:worker/2',
               PATH=f'{sbatch.parent}{os.pathsep}{env["PATH"]}')  # (the job's too)
    launching = subprocess.Popen([sys.executable, str(script), counter, first, added, seen],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)
    try:
        assert wait_until(lambda: os.path.exists(first + '.waiting'), timeout=60)
        [killed] = drivers(tmp_path)  # while worker/0 starts
        [run_dir] = glob.glob(str(tmp_path / 'jobs' / '*' / 'run'))
        with open(os.path.join(run_dir, 'supervisor.json')) as f:
            observer_socket = json.load(f)['address'].split(':', 1)[1]
        os.remove(driver_gate)  # the next driver waits before it serves
        os.kill(killed, signal.SIGKILL)  # (the bed's nodes share this machine's processes)
        os.remove(observer_socket)  # no socket while no driver serves
        assert wait_until(lambda: set(drivers(tmp_path)) - {killed}, timeout=30)
        # lp.launch asks the driver meanwhile (through a step of the job, which finds no
        # socket): it neither returns nor fails while the job runs.
        assert not wait_until(lambda: launching.poll() is not None, timeout=5), \
            launching.communicate()
        with open(driver_gate, 'w'):
            pass  # the new driver serves
        with open(first, 'w'):
            pass  # worker/0 reports its start, to the new driver; lp.launch returns
        printed, errors = launching.communicate(timeout=60)
    finally:
        launching.kill()
        launching.wait()
    assert launching.returncode == 0, errors
    program_id = printed.split('LAUNCHED ')[1].split()[0]
    job_id = errors.split('as Slurm job ')[1].split()[0]
    env[registry.ENV] = runtime_dir
    assert [entry.id for entry in registry.entries()] == [program_id]
    controller = lp.attach(program_id)
    assert controller.supervisor['pid'] != killed
    [killed] = drivers(tmp_path)
    assert wait_until(lambda: Counter.read(counter)['calls'] > 0, timeout=30)
    controller.resize('worker', 2)
    assert wait_until(lambda: os.path.exists(added + '.waiting'), timeout=30)  # worker/1 starts
    assert controller.status()['worker/1'].state.value == 'running'  # (not yet serving)
    # The caller's wait for the next change of the worker group is in flight at the kill.
    assert wait_until(lambda: lines(seen)[-1:] == ['worker/0 worker/1'], timeout=30), \
        lines(seen)
    os.kill(killed, signal.SIGKILL)
    with open(added, 'w'):
        pass  # worker/1 publishes its address, which waits for the new driver
    calls = Counter.read(counter)['calls']
    assert wait_until(lambda: Counter.read(counter)['calls'] > calls + 100, timeout=10)
    assert 'worker/1' in controller.status()  # through a new relay, once the new driver serves
    driver = controller.supervisor['pid']
    assert driver != killed
    names = ('counter/0', 'caller/0', 'worker/0', 'worker/1')
    assert wait_until(lambda: all(s.state.value == 'running'
                                  for s in controller.status().values()), timeout=30), \
        controller.status()
    statuses = controller.status()
    assert {name: (s.state.value, s.restarts) for name, s in statuses.items()} == {
        name: ('running', 0) for name in names}, statuses
    assert 'launchpad.launch.slurm.driver' in ' '.join(psutil.Process(driver).cmdline())
    done = subprocess.run([*PYTHON, 'status', program_id, '--json'], capture_output=True,
                          text=True, timeout=60, env=env, check=True)
    assert json.loads(done.stdout)['controller']['pid'] == driver
    # worker/2 runs in an additional job; the driver that submits it is killed once Slurm
    # took it: the next one finds the job by its batch script and follows its step.
    controller.resize('worker', 3)
    assert wait_until(lambda: controller.status()['worker/2'].state.value == 'running',
                      timeout=30), controller.status()
    assert controller.supervisor['pid'] not in (driver, killed)
    assert len((sbatch.parent / 'sbatch.submitted').read_text().split()) == 1
    # The caller's waits in flight at the kills went on with the next driver, with no error,
    # and saw the real changes only: a new driver that had not heard from worker/1 yet (its
    # state was written before worker/1 reported) did not drop it from the group.
    assert wait_until(lambda: lines(seen)[-1:] == ['worker/0 worker/1 worker/2'], timeout=30), \
        lines(seen)
    assert lines(seen) == ['worker/0', 'worker/0 worker/1', 'worker/0 worker/1 worker/2']
    assert additional_jobs() == ['detached:worker/2']
    logs = subprocess.run([*PYTHON, 'logs', program_id, 'worker/2'], capture_output=True,
                          text=True, timeout=60, env=env)
    assert logs.returncode == 0, logs.stderr

    controller.stop()
    assert wait_until(lambda: queue() == '', timeout=30), queue()
    job_dir = tmp_path / 'jobs' / os.listdir(tmp_path / 'jobs')[0]
    assert (job_dir / 'logs' / 'job.out').read_text().count('was killed') == 3
    assert wait_until(lambda: os.listdir(job_dir) == ['logs'], timeout=10)
    assert wait_until(lambda: not our_processes(str(job_dir)), timeout=10), \
        our_processes(str(job_dir))
    assert not glob.glob(f'/tmp/launchpad-slurm-{os.getuid()}-{job_id}')
    assert os.listdir(runtime_dir) == []
