"""The Launchpad paper's Figure 2: parameter-server queries per second against the number of
requesters, for one partition, P partitions, and one partition behind a cacher.

Each point is the median of --repeats runs of examples/parameter_server.py under local_mp (every
node a process), the servers sleeping --sleep_ms per request as in the paper. Writes
parameter_server_scaling.csv and a log-log parameter_server_scaling.png (needs matplotlib:
pip install -e '.[benchmarks]').

    python benchmarks/parameter_server_scaling.py --partitions=4 --seconds=2
    python benchmarks/parameter_server_scaling.py --plot_only   # redraw from the CSV
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import psutil

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLE = os.path.join(_REPO, 'examples', 'parameter_server.py')
_FIELDS = ['topology', 'requesters', 'partitions', 'cacher', 'qps', 'qps_runs', 'served',
           'seconds', 'sleep_ms', 'load_average']

# dm-launchpad 0.5.2 on this machine (issue 5): (topology, requesters) -> queries per second.
_DM_LAUNCHPAD = {('1 partition', 1): 750, ('1 partition', 4): 2900, ('1 partition', 16): 7400,
                 ('1 partition + cacher', 16): 12900}


def _topologies(partitions: int, cacher: str) -> Dict[str, List[str]]:
    return {
        '1 partition': ['--partitions=1'],
        f'{partitions} partitions': [f'--partitions={partitions}'],
        '1 partition + cacher': ['--partitions=1', f'--cacher={cacher}'],
    }


def _run_point(args: argparse.Namespace, flags: List[str], requesters: int) -> dict:
    """One run of the example; kills the whole program if it outlives the timeout."""
    with tempfile.TemporaryDirectory(prefix='ps-scaling-') as tmp:
        results_path = os.path.join(tmp, 'results.json')
        python_path = [p for p in (os.environ.get('PYTHONPATH'), _REPO) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(python_path))
        argv = [sys.executable, '-m', 'launchpad.launch', '--type=local_mp', _EXAMPLE,
                f'--requesters={requesters}', f'--seconds={args.seconds}',
                f'--sleep_ms={args.sleep_ms}', f'--results={results_path}', *flags]
        process = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = process.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            family = psutil.Process(process.pid).children(recursive=True) + [process]
            for member in family:
                try:
                    member.kill()
                except psutil.NoSuchProcess:
                    pass
            process.communicate()
            raise RuntimeError(f'{" ".join(argv)} did not end within {args.timeout} s')
        if process.returncode != 0:
            raise RuntimeError(f'{" ".join(argv)} failed:\n{output}')
        with open(results_path) as f:
            return json.load(f)


def measure(args: argparse.Namespace) -> List[dict]:
    rows = []
    for topology, flags in _topologies(args.partitions, args.cacher).items():
        for requesters in args.requesters:
            results = [_run_point(args, flags, requesters) for _ in range(args.repeats)]
            median = sorted(results, key=lambda r: r['qps'])[len(results) // 2]
            partitions = args.partitions if '--partitions=1' not in flags else 1
            row = {'topology': topology, 'requesters': requesters, 'partitions': partitions,
                   'cacher': args.cacher if 'cacher' in topology else '',
                   'qps': round(median['qps']),
                   'qps_runs': ' '.join(str(round(r['qps'])) for r in results),
                   'served': sum(median['served']), 'seconds': args.seconds,
                   'sleep_ms': args.sleep_ms, 'load_average': round(os.getloadavg()[0], 1)}
            rows.append(row)
            print(f'{topology:>22}  {requesters:3d} requesters  {row["qps"]:8,d} queries/s  '
                  f'(servers answered {row["served"]:,d}; load {row["load_average"]})', flush=True)
    return rows


def plot(rows: List[dict], path: str) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(6.4, 4.4))
    for topology in dict.fromkeys(row['topology'] for row in rows):
        points = sorted((int(r['requesters']), float(r['qps'])) for r in rows
                        if r['topology'] == topology)
        axes.plot(*zip(*points), marker='o', label=f'launchpad: {topology}')
    for topology, marker in (('1 partition', 'x'), ('1 partition + cacher', '+')):
        points = sorted((n, qps) for (name, n), qps in _DM_LAUNCHPAD.items() if name == topology)
        axes.scatter(*zip(*points), marker=marker, s=80, color='black', zorder=3,
                     label=f'dm-launchpad 0.5.2: {topology}')
    sleep_ms = float(rows[0]['sleep_ms'])
    axes.set_xscale('log', base=2)
    axes.set_yscale('log')
    ticks = sorted({int(r['requesters']) for r in rows})
    axes.set_xticks(ticks, [str(t) for t in ticks])
    axes.set_xlabel('requesters')
    axes.set_ylabel('queries per second')
    axes.set_title(f'Parameter server, {sleep_ms:g} ms per request, 2 cores (local_mp)')
    axes.grid(True, which='both', alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--requesters', type=int, nargs='+', default=[1, 2, 4, 8, 16, 32])
    parser.add_argument('--partitions', type=int, default=4, help='P of the P-partition topology')
    parser.add_argument('--cacher', choices=['class', 'node'], default='class',
                        help="the paper's Cacher class in a CourierNode, or lp.CacherNode")
    parser.add_argument('--seconds', type=float, default=2.0, help='measuring time per run')
    parser.add_argument('--repeats', type=int, default=3, help='runs per point; the median counts')
    parser.add_argument('--sleep_ms', type=float, default=1.0, help='server work per request')
    parser.add_argument('--timeout', type=float, default=180.0, help='limit per run, seconds')
    parser.add_argument('--output_dir', default=os.path.join(_REPO, 'benchmarks', 'results'))
    parser.add_argument('--plot_only', action='store_true', help='redraw the plot from the CSV')
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    csv_path = os.path.join(args.output_dir, 'parameter_server_scaling.csv')
    png_path = os.path.join(args.output_dir, 'parameter_server_scaling.png')
    if args.plot_only:
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
    else:
        started = time.monotonic()
        rows = measure(args)
        with open(csv_path, 'w', newline='') as f:
            writer = csv.DictWriter(f, fieldnames=_FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        print(f'Measured {len(rows)} points in {time.monotonic() - started:.0f} s; wrote {csv_path}')
    plot(rows, png_path)
    print(f'Wrote {png_path}')


if __name__ == '__main__':
    main()
