"""The Launchpad paper's Figure 2: parameter-server queries per second against the number of
requesters, for one partition, P partitions, and one partition behind a cacher.

Each point is the median of --repeats runs of examples/parameter_server.py under local_mp (every
node a process), the servers sleeping --sleep_ms per request as in the paper. With --peer_python
(default: $LAUNCHPAD_BENCH_DMLP_PYTHON), the interpreter of a virtual environment holding
dm-launchpad, the same script also runs under dm-launchpad, each run right after ours, so that both
see the same load. dm-launchpad has no CacherNode, so its cacher is always the paper's Cacher class.

Writes parameter_server_scaling.csv and a log-log parameter_server_scaling.png (needs matplotlib:
pip install -e '.[plot]').

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
import uuid
from typing import Dict, List, Optional

import psutil

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLE = os.path.join(_REPO, 'examples', 'parameter_server.py')
_FIELDS = ['system', 'topology', 'requesters', 'partitions', 'cacher', 'qps', 'qps_runs',
           'served', 'seconds', 'sleep_ms', 'load_average']
_OURS, _PEER = 'launchpad', 'dm-launchpad'
_MARKER = 'LAUNCHPAD_PS_SCALING_RUN'


def _topologies(partitions: int) -> Dict[str, List[str]]:
    return {
        '1 partition': ['--partitions=1'],
        f'{partitions} partitions': [f'--partitions={partitions}'],
        '1 partition + cacher': ['--partitions=1'],  # the cacher flag depends on the system
    }


def _command(system: str, args: argparse.Namespace, flags: List[str], requesters: int,
             results_path: str) -> List[str]:
    example_flags = [f'--requesters={requesters}', f'--seconds={args.seconds}',
                     f'--sleep_ms={args.sleep_ms}', f'--results={results_path}', *flags]
    if system == _OURS:
        return [sys.executable, '-m', 'launchpad.launch', '--type=local_mp', _EXAMPLE,
                *example_flags]
    return [args.peer_python, _EXAMPLE, '--lp_launch_type=local_mp', *example_flags]


def _environment(system: str, marker: str) -> Dict[str, str]:
    env = dict(os.environ, **{_MARKER: marker})
    if system == _OURS:
        env['PYTHONPATH'] = os.pathsep.join(p for p in (env.get('PYTHONPATH'), _REPO) if p)
    else:  # its packages have our names: keep ours off its path, and keep it out of tmux
        env.pop('PYTHONPATH', None)
        env['LAUNCHPAD_LAUNCH_LOCAL_TERMINAL'] = 'current_terminal'
    return env


def _kill_marked(marker: str) -> None:
    """Kills every process of one run (all inherit its marker), whichever session it moved to."""
    marked = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(_MARKER) == marker:
                marked.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    for process in marked:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(marked, timeout=5)


def _run_once(system: str, args: argparse.Namespace, flags: List[str], requesters: int) -> dict:
    """One run of the example; whatever of it is left after it ends or times out is killed."""
    marker = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix='ps-scaling-') as tmp:
        results_path = os.path.join(tmp, 'results.json')
        argv = _command(system, args, flags, requesters, results_path)
        try:
            finished = subprocess.run(argv, env=_environment(system, marker), cwd=tmp,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=args.timeout,
                                      check=False)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f'{" ".join(argv)} did not end within {args.timeout} s') from e
        finally:
            _kill_marked(marker)
        if not os.path.exists(results_path):
            raise RuntimeError(f'{" ".join(argv)} wrote no results (exit code '
                               f'{finished.returncode}):\n{finished.stdout}')
        with open(results_path) as f:
            return json.load(f)


def _row(system: str, topology: str, requesters: int, partitions: int, cacher: str,
         results: List[dict], args: argparse.Namespace) -> dict:
    median = sorted(results, key=lambda r: r['qps'])[len(results) // 2]
    return {'system': system, 'topology': topology, 'requesters': requesters,
            'partitions': partitions, 'cacher': cacher, 'qps': round(median['qps']),
            'qps_runs': ' '.join(str(round(r['qps'])) for r in results),
            'served': sum(median['served']), 'seconds': args.seconds, 'sleep_ms': args.sleep_ms,
            'load_average': round(os.getloadavg()[0], 1)}


def measure(args: argparse.Namespace) -> List[dict]:
    systems = [_OURS] + ([_PEER] if args.peer_python else [])
    rows = []
    for topology, flags in _topologies(args.partitions).items():
        partitions = 1 if '--partitions=1' in flags else args.partitions
        for requesters in args.requesters:
            cacher = {_OURS: args.cacher, _PEER: 'class'} if 'cacher' in topology else {}
            results: Dict[str, List[dict]] = {system: [] for system in systems}
            for _ in range(args.repeats):
                for system in systems:
                    extra = [f'--cacher={cacher[system]}'] if cacher else []
                    results[system].append(_run_once(system, args, flags + extra, requesters))
            for system in systems:
                row = _row(system, topology, requesters, partitions, cacher.get(system, ''),
                           results[system], args)
                rows.append(row)
                print(f'{system:>12}  {topology:>20}  {requesters:3d} requesters  '
                      f'{row["qps"]:8,d} queries/s  (runs: {row["qps_runs"]}; servers answered '
                      f'{row["served"]:,d}; load {row["load_average"]})', flush=True)
    return rows


def plot(rows: List[dict], path: str) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(6.4, 4.6))
    topologies = list(dict.fromkeys(row['topology'] for row in rows))
    for system, style in ((_OURS, '-o'), (_PEER, '--x')):
        for color, topology in enumerate(topologies):
            points = sorted((int(r['requesters']), float(r['qps'])) for r in rows
                            if r['system'] == system and r['topology'] == topology)
            if points:
                axes.plot(*zip(*points), style, color=f'C{color}', label=f'{system}: {topology}')
    ticks = sorted({int(r['requesters']) for r in rows})
    axes.set_xscale('log', base=2)
    axes.set_yscale('log')
    axes.set_xticks(ticks, [str(t) for t in ticks])
    axes.set_xlabel('requesters')
    axes.set_ylabel('queries per second')
    axes.set_title(f'Parameter server, {float(rows[0]["sleep_ms"]):g} ms per request, '
                   '2 cores, local_mp')
    axes.grid(True, which='both', alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--requesters', type=int, nargs='+', default=[1, 2, 4, 8, 16, 32])
    parser.add_argument('--partitions', type=int, default=4, help='P of the P-partition topology')
    parser.add_argument('--cacher', choices=['class', 'node'], default='class',
                        help="ours: the paper's Cacher class in a CourierNode, or lp.CacherNode")
    parser.add_argument('--seconds', type=float, default=2.0, help='measuring time per run')
    parser.add_argument('--repeats', type=int, default=3, help='runs per point; the median counts')
    parser.add_argument('--sleep_ms', type=float, default=1.0, help='server work per request')
    parser.add_argument('--timeout', type=float, default=180.0, help='limit per run, seconds')
    parser.add_argument('--peer_python', default=os.environ.get('LAUNCHPAD_BENCH_DMLP_PYTHON'),
                        help='Python of an environment with dm-launchpad, to run it side by side')
    parser.add_argument('--output_dir', default=os.path.join(_REPO, 'benchmarks', 'results'))
    parser.add_argument('--plot_only', action='store_true', help='redraw the plot from the CSV')
    args = parser.parse_args(argv)
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
