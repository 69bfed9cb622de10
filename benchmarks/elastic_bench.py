"""Scale-up time per launcher: seconds from `controller.add_node` to the new node running.

For each launch type it launches a program with one courier node in an elastic group, adds
--adds more nodes one at a time, and reports the median and the worst of

  running   from the request until the node reported to the coordinator that it runs
            (`controller.scale_up_times`); its server binds right after;
  serving   (local_mt, local_mp: the launching process can call nodes) until a call to the new
            node answered.

local_mp forks new nodes from its pre-started fork server and SSH hosts' agents fork them from
theirs, as at launch; Slurm runs a new job step in the job's allocation (slurm) or, launched with
spare_tasks=0, in an additional job per node (slurm-jobs); Kubernetes creates a pod, whose init
container joins it to the coordinator pod. SSH uses the SSH test bed (root; see tests/testbeds)
unless --hosts names two machines that run this launchpad; Slurm (--slurm) the Slurm test bed;
Kubernetes (--kubernetes) the podman bed, through the podman stand-in for the API server of
tests/launch/test_kubernetes_podman.py (the launcher lists pods once a second, as on a cluster).

  python benchmarks/elastic_bench.py [--adds 5] [--no-ssh] [--slurm] [--kubernetes]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import pathlib
import statistics
import sys
import time
from typing import Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'benchmarks'))

import launchpad as lp  # pylint: disable=wrong-import-position


class Echo:
    def ping(self) -> str:
        return 'pong'


def measure(launch_type: str, adds: int, resources: Optional[dict] = None,
            **options) -> Dict[str, List[float]]:
    program = lp.Program('elastic_bench')
    # On Slurm the job reserves max_size - 1 spare tasks for the group.
    with program.group('echo', elastic=lp.Elastic(make_node=lambda: lp.CourierNode(Echo),
                                                  max_size=adds + 1)):
        program.add_node(lp.CourierNode(Echo))
    options.setdefault('terminal', 'output_to_files')
    controller = lp.launch(program, launch_type=launch_type, resources=resources, **options)
    serving = []
    try:
        local = launch_type in ('local_mt', 'local_mp')
        for added in range(1, adds + 1):
            started = time.monotonic()
            handle = controller.add_node(lp.CourierNode(Echo), label='echo')
            if local:
                handle.dereference().ping()
                serving.append(time.monotonic() - started)
            deadline = time.monotonic() + 60
            while len(controller.scale_up_times) < added:
                if time.monotonic() > deadline:
                    raise TimeoutError(f'{launch_type}: an added node did not start in 60 s')
                time.sleep(0.005)
        return {'running': controller.scale_up_times, 'serving': serving}
    finally:
        controller.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--adds', type=int, default=5)
    parser.add_argument('--no-ssh', action='store_true', help='skip SSH (no test bed here)')
    parser.add_argument('--slurm', action='store_true',
                        help='also Slurm, on the Slurm test bed (one node; needs root)')
    parser.add_argument('--kubernetes', action='store_true',
                        help='also Kubernetes, as pods on the podman test bed (needs root)')
    parser.add_argument('--hosts', type=lambda s: s.split(','), help='ssh hosts, a,b')
    parser.add_argument('--python', default='python3', help='interpreter on --hosts')
    parser.add_argument('--pythonpath', help='PYTHONPATH on --hosts')
    args = parser.parse_args()
    args.env = {'PYTHONPATH': args.pythonpath} if args.pythonpath else {}
    logs = tempfile.mkdtemp(prefix='elastic-bench-')  # node output, removed at the end
    os.environ['LAUNCHPAD_LOGGING_DIR'] = logs
    try:
        results = measure_all(args)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    print(f'{"launcher":10} {"running median / max (s)":>26} {"serving median / max (s)":>26}')
    for launch_type, times in results.items():
        cells = []
        for key in ('running', 'serving'):
            values = times[key]
            cells.append(f'{statistics.median(values):.3f} / {max(values):.3f}' if values
                         else 'n/a')
        print(f'{launch_type:10} {cells[0]:>26} {cells[1]:>26}')


def measure_all(args) -> Dict[str, Dict[str, List[float]]]:
    results = {}
    for launch_type in ('local_mt', 'local_mp'):
        results[launch_type] = measure(launch_type, args.adds)
    if not args.no_ssh:
        from ssh_bench import bed_hosts  # pylint: disable=import-outside-toplevel
        with bed_hosts(args) as hosts:
            results['ssh'] = measure('ssh', args.adds, {'echo': lp.SshHosts(hosts[:2])})
    if args.slurm:
        from tests import testbeds  # pylint: disable=import-outside-toplevel
        with testbeds.slurm_cluster('single'):
            # The bed's node has 4 CPUs: the job holds the first node and 3 spare tasks.
            results['slurm'] = measure('slurm', min(args.adds, 3), job_dir=os.environ[
                'LAUNCHPAD_LOGGING_DIR'])
            # No spare task: each added node is a job of its own, which Slurm schedules.
            results['slurm-jobs'] = measure('slurm', min(args.adds, 3), job_dir=os.environ[
                'LAUNCHPAD_LOGGING_DIR'], spare_tasks=0)
    if args.kubernetes:
        results['kubernetes'] = measure_pods(args.adds)
    return results


def measure_pods(adds: int) -> Dict[str, List[float]]:
    """`measure` on the kubernetes launcher, its pods played by podman on the test bed."""
    from launchpad.launch import kubernetes  # pylint: disable=import-outside-toplevel
    from tests import testbeds  # pylint: disable=import-outside-toplevel
    from tests.launch import test_kubernetes_podman as bed_api  # pylint: disable=C0415
    with testbeds.podman_network() as bed, tempfile.TemporaryDirectory() as directory:
        api = bed_api.PodmanApi(bed, pathlib.Path(directory))
        lp.register_launcher('kubernetes_podman', lambda: kubernetes.KubernetesLauncher(
            lambda _: api))
        try:
            return measure('kubernetes_podman', adds, image=bed.image, python=bed.python,
                           terminal='current_terminal', notice_period=5)
        finally:
            api.close()


if __name__ == '__main__':
    with contextlib.suppress(KeyboardInterrupt):
        main()
