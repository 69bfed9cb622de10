"""How a detached program survives its supervisor, per launcher: seconds from the supervisor's
SIGKILL to a re-adopted program whose `status` answers, the longest gap in a node's served calls
meanwhile, and what detaching costs at launch.

It launches the program of tests/launch/detached_program.py (a caller node calling a counter
node all the time, and an idle worker), detached, --rounds times, and each time

  launch       seconds from `lp.launch(..., detach=True)` until every node runs; the same
               program launched attached (`lp.launch` without detach), until every node runs,
               is the baseline (attached local_mp forks nodes from its fork server; a detached
               program's nodes are fresh interpreters, which must not end with it);
  re-adoption  SIGKILL of the supervisor, then seconds until a new one answered where it runs
               (registered in its registry there and answered `node_status`), and until
               `status` answered on this machine (the launch's controller, which reaches the
               new supervisor as `lp.attach`'s does);
  longest gap  the longest time between two calls the counter served, before the kill and over
               the kill and the re-adoption (the caller calls every 10 ms).

--launcher picks where (the beds are those of the tests, tests/testbeds, as root):

  local_mp     this machine; the supervisor is the keeper's child, which the keeper starts again.
  ssh          the SSH bed's three hosts (see benchmarks/ssh_bench.py), the supervisor on the
               first, its keeper starting it again there; its new one reaches the agents on the
               three hosts again through ssh sessions over the master connections of the one
               before (`launchpad.launch.ssh.masters`). local_mp and ssh also time the new
               supervisor's steps from its log (`steps`).
  slurm        the multi-node Slurm bed; the supervisor is the driver in the program's job, which
               the batch script starts again; this machine reaches it through a step of the job.
  kubernetes   the podman bed standing in for Kubernetes (tests/launch/test_kubernetes_podman.py,
               its API server tests/launch/kubernetes_api_server.py); the supervisor is the
               coordinator process in the coordinator pod, whose container the pod restarts;
               this machine reaches it through an exec in that container. (The counter prints
               what it served to its pod's log, read with `podman logs`.) With --lose pod, the
               coordinator pod is deleted instead (as `kubectl delete pod` does, through the API
               stand-in, whose Job controller makes the next pod after its 10 s back-off); the
               new pod's coordinator re-adopts the nodes from the Secret RUN-state. The new
               coordinator's log line `re-adopted the N nodes` times its re-adoption there.

  python benchmarks/recover_bench.py [--rounds 3] [--launcher local_mp|ssh|slurm|kubernetes]
                                     [--lose process|pod]

(`--ssh` is the same as `--launcher ssh`.)
"""
# pylint: disable=cell-var-from-loop  (each round's lambdas run within the round)
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import courier  # pylint: disable=wrong-import-position
import launchpad as lp  # pylint: disable=wrong-import-position
from launchpad.observe import registry  # pylint: disable=wrong-import-position
from tests.launch.detached_program import Counter, make_program  # pylint: disable=wrong-import-position

LAUNCHERS = ('local_mp', 'ssh', 'slurm', 'kubernetes')
STATUS_TIMEOUT = 180.0  # seconds a new supervisor gets to answer before the round fails
# The new supervisor's log lines (`launchpad.launch.supervisor`, `ssh.launcher`) that `steps`
# times, in their order, after its keeper started it.
STEP_LINES = (('started', ' re-adopts program '), ('agents reached', ' agents again after '),
              ('re-adopted', ' re-adopted program '))

Row = Dict[str, Any]


def _all_running(controller) -> bool:
    return all(s.state is lp.NodeState.RUNNING for s in controller.status().values())


def launched(launch: Callable[[], Any]) -> Tuple[Any, float]:
    """The controller that `launch()` returned, and the seconds until every node ran."""
    started = time.monotonic()
    controller = launch()
    while not _all_running(controller):
        time.sleep(0.01)
    return controller, time.monotonic() - started


def answers_there(program_id: str, old_pid: int, runtime_dir: str = '') -> Callable[[], bool]:
    """Whether a supervisor of `program_id` other than `old_pid` answers `node_status`, as
    registered in `runtime_dir` (its host's registry; default this machine's)."""
    def answers() -> bool:
        entry = None
        if runtime_dir:
            try:
                with open(os.path.join(runtime_dir, f'{program_id}.json')) as f:
                    entry = registry.Entry(**json.load(f))
            except (OSError, ValueError, TypeError):
                entry = None
        else:
            entry = next((e for e in registry.entries() if e.id == program_id), None)
        if entry is None or entry.pid == old_pid:
            return False
        try:
            courier.Client(entry.address, auth_token=entry.token, call_timeout=5,
                           wait_for_ready=False).node_status()
            return True
        except courier.CourierError:
            return False
    return answers


def status_again(controller) -> Dict[str, lp.NodeStatus]:
    """The program's `status` from this machine once a supervisor answers it: through
    `controller`, which waits for a new supervisor itself, or, where it gave up (a remote one
    still starting), through a new `lp.attach`."""
    deadline = time.monotonic() + STATUS_TIMEOUT
    while True:
        try:
            return controller.status()
        except Exception:  # pylint: disable=broad-except  (the supervisor is not back yet)
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)
        try:
            controller = lp.attach(controller.id)
        except Exception:  # pylint: disable=broad-except
            pass


def over_the_kill(controller, served: Callable[[], Dict[str, Any]], kill: Callable[[], None],
                  there: Optional[Callable[[], bool]] = None, settle: float = 1.0) -> Row:
    """Kills the supervisor of `controller`'s program (`kill`) once its counter (`served`)
    served two seconds of calls; the seconds until a new one answered there (`there`, if
    given) and here, node restarts and the longest gaps in served calls."""
    while served()['calls'] < 200:  # two seconds of calls
        time.sleep(0.05)
    before = served()['longest_gap']
    killed, killed_wall = time.monotonic(), time.time()
    kill()
    row: Row = {'killed_wall': killed_wall}
    if there is not None:
        deadline = killed + STATUS_TIMEOUT
        while not there():
            if time.monotonic() > deadline:
                raise TimeoutError(f'no new supervisor answered within {STATUS_TIMEOUT:g} s')
            time.sleep(0.005)
        row['readoption'] = time.monotonic() - killed
    statuses = status_again(controller)
    row['status'] = time.monotonic() - killed
    row['restarts'] = sum(s.restarts for s in statuses.values())
    time.sleep(settle)  # calls go on; the counter says what it served every 50 to 500 ms
    return {**row, 'gap_before': before, 'gap_through': served()['longest_gap']}


def steps(log: str, killed_wall: float, registered: str) -> Dict[str, float]:
    """Seconds from the kill to each step of the new supervisor (STEP_LINES) in its `log`
    (supervisor.log), and until its registry entry at `registered` was written."""
    found: Dict[str, float] = {}
    try:
        lines = pathlib.Path(log).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        for name, text in STEP_LINES:
            if text in line:
                try:
                    at = datetime.datetime.strptime(line[:23], '%Y-%m-%d %H:%M:%S,%f')
                except ValueError:
                    continue
                if at.timestamp() >= killed_wall - 0.001:
                    found[name] = at.timestamp() - killed_wall
                    sessions = re.search(r'after ([\d.]+) s \(ssh sessions up after: (.*) s\)',
                                         line)
                    if sessions:  # (seconds from its first ssh command)
                        found['reaching'] = float(sessions.group(1))
                        found['slowest ssh'] = max(map(float, re.findall(r'[\d.]+',
                                                                         sessions.group(2))))
                    over = re.search(r'(\d+) over master connections', line)
                    if over:  # (sessions opened over the masters of the supervisor before)
                        found['over masters'] = int(over.group(1))
    try:
        found['registered'] = os.stat(registered).st_mtime - killed_wall
    except OSError:
        pass
    return found


def local_mp_rounds(directory: str, rounds: int) -> Tuple[List[Row], List[float]]:
    rows: List[Row] = []
    attached: List[float] = []
    for index in range(rounds):
        controller, took = launched(lambda: lp.launch(
            make_program(os.path.join(directory, 'attached.json'), 'attached'),
            launch_type='local_mp', terminal='output_to_files'))
        controller.stop()
        attached.append(took)
        counter = os.path.join(directory, f'counter{index}.json')
        controller, took = launched(lambda: lp.launch(
            make_program(counter, f'recover{index}'), launch_type='local_mp', detach=True))
        try:
            pid = controller.supervisor['pid']
            row = over_the_kill(controller, lambda: Counter.read(counter),
                                lambda: os.kill(pid, signal.SIGKILL),
                                answers_there(controller.id, pid))
            row['steps'] = steps(
                os.path.join(os.environ['LAUNCHPAD_LOGGING_DIR'], controller.id,
                             'supervisor.log'),
                row['killed_wall'], str(registry.directory() / f'{controller.id}.json'))
            rows.append({'launch': took, **row})
        finally:
            controller.stop()
    return rows, attached


def ssh_rounds(directory: str, rounds: int) -> Tuple[List[Row], List[float]]:
    """The rounds on the bed's three hosts (their registry in a directory of `directory`, which
    they share with this machine), and the attached launches."""
    from benchmarks.ssh_bench import bed_hosts  # pylint: disable=import-outside-toplevel
    runtime_dir = tempfile.mkdtemp(prefix='lpb-')  # (a short path: the sockets' are limited)
    logs = os.environ['LAUNCHPAD_LOGGING_DIR']
    rows: List[Row] = []
    attached: List[float] = []
    try:
        with bed_hosts(argparse.Namespace(hosts=None)) as hosts:
            hosts = [dataclasses.replace(host, env={  # (the supervisor's too: its log here)
                **host.env, registry.ENV: runtime_dir, 'LAUNCHPAD_LOGGING_DIR': logs,
                'LAUNCHPAD_RUNS_DIR': os.environ['LAUNCHPAD_RUNS_DIR']}) for host in hosts]
            resources = {'counter': hosts[0], 'caller': hosts[1], 'worker': hosts[2]}
            for index in range(rounds):
                for how in ('attached', 'detached'):
                    counter = os.path.join(directory, f'{how}{index}.json')
                    controller, took = launched(lambda: lp.launch(
                        make_program(counter, how), launch_type='ssh', resources=resources,
                        terminal='output_to_files', detach=how == 'detached'))
                    try:
                        if how == 'attached':
                            attached.append(took)
                            continue
                        pid = controller.supervisor['pid']
                        row = over_the_kill(controller, lambda: Counter.read(counter),
                                            lambda: os.kill(pid, signal.SIGKILL),
                                            answers_there(controller.id, pid, runtime_dir))
                        row['steps'] = steps(
                            os.path.join(logs, controller.id, 'supervisor.log'),
                            row['killed_wall'], os.path.join(runtime_dir, f'{controller.id}.json'))
                        row['steps']['bare ssh'] = bare_ssh(hosts)
                        rows.append({'launch': took, **row})
                    finally:
                        controller.stop()
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
    return rows, attached


def bare_ssh(hosts: List[lp.SshHost]) -> float:
    """Seconds until each of three ssh sessions, one to each of `hosts` at once, ran `true`
    (the slowest): what ssh alone costs at the load of the moment."""
    started = time.monotonic()
    sessions = [subprocess.Popen(host.ssh_argv() + [host.host, 'true']) for host in hosts]
    for session in sessions:
        session.wait(timeout=60)
    return time.monotonic() - started


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _slurm_queue() -> str:
    return subprocess.run(['squeue', '--noheader'], capture_output=True, text=True,
                          check=True).stdout.strip()


def slurm_rounds(directory: str, rounds: int) -> Tuple[List[Row], List[float]]:
    """The rounds on the multi-node Slurm bed: jobs in `directory`, the driver's registry in
    the job's directory on its batch host (this machine's file system)."""
    from tests import testbeds  # pylint: disable=import-outside-toplevel
    rows: List[Row] = []
    attached: List[float] = []
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))
    with _environment(PYTHONPATH=pythonpath, LAUNCHPAD_SLURM_DIR=os.path.join(directory, 'jobs')), \
            testbeds.slurm_cluster('multi', 3):
        try:
            for index in range(rounds):
                for how in ('attached', 'detached'):
                    counter = os.path.join(directory, f'slurm-{how}{index}.json')
                    controller, took = launched(lambda: lp.launch(
                        make_program(counter, how), launch_type='slurm',
                        detach=how == 'detached'))
                    try:
                        if how == 'attached':
                            attached.append(took)
                            continue
                        pid = controller.supervisor['pid']
                        job_registry = os.path.join(
                            os.environ.get('TMPDIR', '/tmp'),
                            f'launchpad-slurm-{os.getuid()}-{controller.job_id}')
                        rows.append({'launch': took, **over_the_kill(
                            controller, lambda: Counter.read(counter),
                            lambda: os.kill(pid, signal.SIGKILL),
                            answers_there(controller.id, pid, job_registry))})
                    finally:
                        controller.stop()
                        _until(lambda: _slurm_queue() == '', 60)
        finally:
            if _slurm_queue():
                subprocess.run(['scancel', '--full', f'--user={os.getuid()}'], check=False)
    return rows, attached


def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def kubernetes_rounds(directory: str, rounds: int,
                      lose: str = 'process') -> Tuple[List[Row], List[float]]:
    """The rounds on the podman bed, through the API server stand-in of the tests (this
    process launches, as the tests' launching script does); `lose`: what of the supervisor is
    lost, its process (SIGKILL) or its pod (deleted through the API)."""
    # pylint: disable=import-outside-toplevel
    from launchpad.launch.kubernetes import names
    from launchpad.launch.kubernetes.api import KubernetesApi
    from launchpad.launch.kubernetes.coordinator_job import coordinator_pod_name
    from tests import testbeds
    from tests.launch import kubernetes_kubectl as kubectl
    from tests.launch.kubernetes_api_server import PodmanApiServer
    from tests.launch.test_kubernetes_podman import PodmanApi, _podman
    # The bed's API server runs no exec: podman's stands in for the API's, and the test's
    # `kubernetes_kubectl` for kubectl (on PATH).
    KubernetesApi.exec = lambda self, *args: PodmanApi.exec(None, *args)
    work = pathlib.Path(directory) / 'kubernetes'
    (work / 'bin').mkdir(parents=True)
    rows: List[Row] = []
    attached: List[float] = []
    path = f'{kubectl.install(str(work / "bin"))}{os.pathsep}{os.environ["PATH"]}'

    def no_pods() -> bool:
        return not subprocess.run(['podman', 'pod', 'ps', '-q', '--filter',
                                   f'network={bed.network}'], capture_output=True, text=True,
                                  timeout=60, check=False).stdout.strip()

    with _environment(PATH=path), testbeds.podman_network() as bed, \
            PodmanApiServer(PodmanApi(bed, work), work) as server:
        options = dict(launch_type='kubernetes', image=bed.image, python=bed.python,
                       kubeconfig=server.kubeconfig(), notice_period=5)
        for index in range(rounds):
            for how in ('attached', 'detached'):
                extra = {'detach': True, 'create_rbac': True} if how == 'detached' else {}
                controller, took = launched(lambda: lp.launch(
                    make_program('', f'{how}{index}'), **options, **extra))
                if how == 'attached':
                    controller.stop()
                    attached.append(took)
                    _until(no_pods, 120)  # (the next program's pods get the same addresses)
                    continue
                run = controller.run
                try:
                    pod = coordinator_pod_name(server, run)  # (its Job's pod)

                    def kill() -> None:
                        if lose == 'pod':  # as `kubectl delete pod` does
                            server.delete('Pod', pod)
                        else:
                            container = f'{pod}-{names.COORDINATOR_CONTAINER}'
                            os.kill(int(_podman('inspect', '--format', '{{.State.Pid}}',
                                                container)), signal.SIGKILL)

                    def readopted() -> bool:  # (its log says so: the lost one still answered)
                        now = coordinator_pod_name(server, run)
                        if now is not None and (now != pod or lose == 'process') and (
                                're-adopted the ' in server.podman.read_log(
                                    now, names.COORDINATOR_CONTAINER)):
                            return True
                        time.sleep(0.1)  # (each look lists podman's containers)
                        return False
                    rows.append({'launch': took, **over_the_kill(
                        controller,
                        lambda: Counter.parse(server.podman.read_log(f'{run}-counter-0', 'node')),
                        kill, readopted, settle=2.0)})
                finally:
                    controller.stop()
                    server.delete('ConfigMap', run)  # (everything of the program goes with it)
                    _until(no_pods, 120)
    return rows, attached


ROUNDS = {'local_mp': local_mp_rounds, 'ssh': ssh_rounds, 'slurm': slurm_rounds,
          'kubernetes': kubernetes_rounds}
TITLES = {'local_mp': 'local_mp', 'ssh': 'ssh, 3 hosts', 'slurm': 'slurm, 3 nodes',
          'kubernetes': 'kubernetes (podman bed)'}
WHERE = {'local_mp': 'registered', 'ssh': 'on its host', 'slurm': 'in its job',
         'kubernetes': 'in its pod: its log line'}


def report(launcher: str, rows: List[Row], attached: List[float], lost: str) -> None:
    """Prints medians and the worst of `rows` (and of the attached launches); `lost`: what
    ended the supervisor."""
    median = lambda key: statistics.median(row[key] for row in rows)  # noqa: E731
    worst = lambda key: max(row[key] for row in rows)  # noqa: E731
    print(f'{TITLES[launcher]}, {len(rows)} rounds (median / worst):')
    if 'readoption' in rows[0]:
        print(f'  re-adoption after {lost}: {median("readoption"):.2f} s / '
              f'{worst("readoption"):.2f} s until the new one answered ({WHERE[launcher]}); '
              f'`status` here answered after {median("status"):.2f} s / {worst("status"):.2f} s')
    else:
        print(f'  re-adoption after {lost}: `status` here answered after '
              f'{median("status"):.2f} s / {worst("status"):.2f} s')
    print(f'  node restarts: {sum(r["restarts"] for r in rows):g}; each round: ' +
          ', '.join(f'{row.get("readoption", row["status"]):.2f}' for row in rows) + ' s')
    if rows[0].get('steps'):
        worst_round = max(rows, key=lambda row: row['readoption'])['steps']
        names = [name for name in ('started', 'reaching', 'slowest ssh', 'agents reached',
                                   're-adopted', 'registered', 'bare ssh')
                 if all(name in row['steps'] for row in rows)]
        ssh = ('; `reaching` the agents and their `slowest ssh` session from its first ssh '
               'command; then, after the round, three `bare ssh` sessions running `true`'
               if launcher == 'ssh' else '')
        print(f'  its steps, seconds from the kill (median / the worst round{ssh}): ' + ', '.join(
            f'{name} {statistics.median(row["steps"][name] for row in rows):.2f} / '
            f'{worst_round[name]:.2f}' for name in names))
    if all('over masters' in row.get('steps', {}) for row in rows):
        print('  ssh sessions that went over the master connections of the supervisor before '
              '(ssh.masters), each round: ' + ', '.join(
                  f'{row["steps"]["over masters"]}' for row in rows))
    print(f'  longest gap in served calls: {median("gap_before") * 1e3:.0f} ms / '
          f'{worst("gap_before") * 1e3:.0f} ms before the kill, '
          f'{median("gap_through") * 1e3:.0f} ms / {worst("gap_through") * 1e3:.0f} ms over '
          'the kill and the re-adoption')
    print(f'  launch until every node runs: detached {median("launch"):.2f} s / '
          f'{worst("launch"):.2f} s, attached {statistics.median(attached):.2f} s / '
          f'{max(attached):.2f} s (ratio {median("launch") / statistics.median(attached):.2f})')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--launcher', choices=LAUNCHERS, default='local_mp')
    parser.add_argument('--ssh', action='store_true', help='the same as --launcher ssh')
    parser.add_argument('--lose', choices=('process', 'pod'), default='process',
                        help='kubernetes: SIGKILL the coordinator process, or delete its pod')
    args = parser.parse_args()
    launcher = 'ssh' if args.ssh else args.launcher
    if args.lose == 'pod' and launcher != 'kubernetes':
        parser.error('--lose pod is for --launcher kubernetes (the coordinator pod)')
    with tempfile.TemporaryDirectory(prefix='lpb-') as directory:
        os.environ.setdefault('LAUNCHPAD_LOGGING_DIR', os.path.join(directory, 'logs'))
        os.environ.setdefault('LAUNCHPAD_RUNS_DIR', os.path.join(directory, 'runs'))
        rows, attached = ROUNDS[launcher](directory, args.rounds,
                                          **({'lose': 'pod'} if args.lose == 'pod' else {}))
    report(launcher, rows, attached,
           'deleting the coordinator pod' if args.lose == 'pod' else 'SIGKILL of the supervisor')


if __name__ == '__main__':
    main()
