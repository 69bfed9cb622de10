"""Time from `lp.launch` to every node serving, on the Slurm test bed and, for scale, local_mp.

    python benchmarks/slurm_startup.py [--servers 3] [--repeats 5] [--mode single|multi]

Needs root and the test-bed packages (tests/testbeds/install_packages.sh); brings the Slurm bed up
and takes it down again. The program is `--servers` CourierNodes and one probe that calls each of
them once and records the time when the last one answered. Prints the median of each phase.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import launchpad as lp  # pylint: disable=wrong-import-position
from tests import testbeds  # pylint: disable=wrong-import-position


class Server:
    def ping(self):
        return True


def probe(servers, path):
    for server in servers:
        server.ping()
    with open(path, 'w') as f:
        f.write(repr(time.time()))
    lp.stop()


def program(servers: int, path: str) -> lp.Program:
    result = lp.Program('startup')
    with result.group('server'):
        handles = [result.add_node(lp.CourierNode(Server)) for _ in range(servers)]
    result.add_node(lp.PyNode(probe, handles, path), label='probe')
    return result


def measure(launch_type: str, servers: int, work: str, **kwargs) -> tuple[float, float, float]:
    """(seconds in lp.launch, seconds to all serving, seconds to the end) of one launch."""
    path = os.path.join(work, 'serving')
    if os.path.exists(path):
        os.remove(path)
    start = time.time()
    controller = lp.launch(program(servers, path), launch_type=launch_type, **kwargs)
    launched = time.time()
    controller.wait()
    ended = time.time()
    with open(path) as f:
        serving = float(f.read())
    return launched - start, serving - start, ended - start


def report(name: str, runs: list[tuple[float, float, float]]) -> float:
    launch_s, serving_s, end_s = (statistics.median(column) for column in zip(*runs))
    print(f'{name:>14}: lp.launch returns {launch_s:5.2f} s, all serving {serving_s:5.2f} s, '
          f'program ended {end_s:5.2f} s (median of {len(runs)})')
    return serving_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--servers', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--mode', choices=('single', 'multi'), default='single')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        local = [measure('test_mp', args.servers, work) for _ in range(args.repeats)]
        with testbeds.slurm_cluster(args.mode) as cluster:
            print(f'Slurm test bed ({cluster.mode}, nodes {", ".join(cluster.nodes)}); '
                  f'{args.servers} servers + 1 probe')
            resources = {}
            if args.mode == 'multi':  # servers on one node, the probe on another
                resources = {'server': lp.SlurmResources(cpus=1),
                             'probe': lp.SlurmResources(cpus=2)}
            on_slurm = [measure('slurm', args.servers, work, job_dir=work, resources=resources,
                                terminal='output_to_files') for _ in range(args.repeats)]
    slurm_serving = report('slurm', on_slurm)
    local_serving = report('local_mp', local)
    print(f'all serving, slurm / local_mp: {slurm_serving / local_serving:.1f}x')


if __name__ == '__main__':
    main()
