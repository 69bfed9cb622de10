"""Runs the benchmark workloads on our launchpad and on the installed peers, side by side.

Every workload runs for each system in turn, in one invocation, each run a separate subprocess
(its own interpreter; dm-launchpad's `launchpad` never shares a path with ours). The driver
prints a table of values with the ratio ours/peer and writes everything as JSON. Peers are found
through environment variables (see peers.py); a missing one is skipped with the reason.

    python benchmarks/run.py                       # every workload, ours and every peer found
    python benchmarks/run.py --workloads sync_calls,launch_32 --systems ours,dmlp
    python benchmarks/run.py --quick               # CI smoke: tiny sizes, ours only, seconds

Numbers from different invocations are not comparable on a shared machine: compare the columns
of one table. Exit status 1 when a run failed or a requested system is unavailable.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import peers

sys.path.insert(0, peers.WORKLOADS_DIR)
import bench_catalog  # noqa: E402  (lives beside the workload scripts, which import it too)
import bench_cleanup  # noqa: E402

RESULTS_DIR = os.path.join(peers.BENCHMARKS_DIR, 'results')
LOG_TAIL_LINES = 30
DRIVER_GRACE_S = 30.0  # beyond a script's own time bound, before the driver kills it


def _csv(text: str) -> List[str]:
    return [part.strip() for part in text.split(',') if part.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='workloads:\n' + '\n'.join(f'  {w.name:18} {w.summary}'
                                          for w in bench_catalog.WORKLOADS.values()))
    parser.add_argument('--workloads', type=_csv, default=list(bench_catalog.WORKLOADS),
                        help='comma-separated workload names (default: all)')
    parser.add_argument('--systems', type=_csv, default=None,
                        help=f'comma-separated systems among {",".join(peers.KEYS)} '
                             '(default: all; with --quick: ours)')
    parser.add_argument('--quick', action='store_true',
                        help='tiny sizes and durations, ours only unless --systems says otherwise: '
                             'a smoke run for CI, not a measurement')
    parser.add_argument('--out', default=None,
                        help='JSON output path (default: benchmarks/results/<time>.json); the '
                             'log of every run goes to a folder beside it')
    parser.add_argument('--timeout', type=float, default=None,
                        help='seconds one run may take (default: per workload)')
    parser.add_argument('--repeat', type=int, default=1,
                        help='runs per workload and system, interleaved across systems; the '
                             'table shows the median (default: 1)')
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in bench_catalog.WORKLOADS]
    if unknown:
        parser.error(f'unknown workloads {unknown}; known: {", ".join(bench_catalog.WORKLOADS)}')
    if args.repeat < 1:
        parser.error('--repeat must be at least 1')
    if args.systems is None:
        args.systems = ['ours'] if args.quick else list(peers.KEYS)
    unknown = [s for s in args.systems if s not in peers.KEYS]
    if unknown:
        parser.error(f'unknown systems {unknown}; known: {", ".join(peers.KEYS)}')
    return args


def _tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-lines:])
    except OSError:
        return ''


def _parse_result(stdout: str) -> Optional[Dict[str, Any]]:
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def run_one(system: peers.System, workload: bench_catalog.Workload, quick: bool,
            timeout_s: Optional[float], log_path: str) -> Dict[str, Any]:
    """Runs one workload script for one system; returns its result (with `error` on failure).

    Whatever the outcome, every process the run started is ended before this returns.
    """
    timeout_s = timeout_s or (60.0 if quick else workload.timeout_s)
    marker = bench_cleanup.new_marker()
    env = system.env()
    env[bench_cleanup.MARKER_ENV] = marker
    started = time.time()
    problem = None
    stdout = ''
    returncode = None
    with tempfile.TemporaryDirectory(prefix='lpbench-cwd-') as cwd, open(log_path, 'w') as log:
        proc = subprocess.Popen(system.command(workload.name, quick, timeout_s), cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                text=True, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout_s + DRIVER_GRACE_S)
        except subprocess.TimeoutExpired:
            problem = f'killed by the driver after {timeout_s + DRIVER_GRACE_S:.0f} s'
            _kill_group(proc)
            stdout, _ = proc.communicate()
        except BaseException:  # Ctrl-C: end this run's processes before going
            _kill_group(proc)
            proc.wait()
            bench_cleanup.kill_marked_processes(marker)
            raise
        finally:
            leftovers = bench_cleanup.kill_marked_processes(marker)
        returncode = proc.returncode
    result = _parse_result(stdout) or {'metrics': {}}
    result.update(key=system.key, title=system.title, workload=workload.name,
                  returncode=returncode, driver_wall_s=round(time.time() - started, 3),
                  log=log_path)
    if leftovers:
        result['leftover_pids'] = leftovers
    if problem is None and returncode != 0 and 'error' not in result:
        problem = f'exited with status {returncode}'
    if problem is None and result.get('system') not in (None, system.reports_as):
        problem = (f'the script measured {result.get("system")!r}, expected '
                   f'{system.reports_as!r}: check which launchpad its interpreter imports')
    if problem is None and not result['metrics'] and 'error' not in result:
        problem = 'printed no result'
    if problem is not None:
        result['error'] = f'{result["error"]}; {problem}' if 'error' in result else problem
    if 'error' in result:
        result['log_tail'] = _tail(log_path)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _format_value(value: Optional[float]) -> str:
    if value is None:
        return '-'
    if abs(value) >= 100:
        return f'{value:,.0f}'
    return f'{value:.3g}'


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def build_table(runs: List[Dict[str, Any]], systems: List[peers.System],
                workloads: Sequence[str]) -> List[Dict[str, Any]]:
    """One row per (workload, metric): the value per system (the median of its successful runs)
    and the ratio ours/peer."""
    grouped: Dict[tuple, List[Dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run['workload'], run['key']), []).append(run)
    rows = []
    for name in workloads:
        metric_names: List[str] = []
        for system in systems:
            for run in grouped.get((name, system.key), []):
                for metric in run.get('metrics', {}):
                    if metric not in metric_names:
                        metric_names.append(metric)
        if not metric_names:
            metric_names = ['(no result)']
        for metric in metric_names:
            spec = bench_catalog.METRICS.get(metric, bench_catalog.Metric('', ''))
            values, errors, samples = {}, {}, {}
            for system in systems:
                measured = [r['metrics'][metric] for r in grouped.get((name, system.key), [])
                            if 'error' not in r and metric in r.get('metrics', {})]
                values[system.key] = _median(measured) if measured else None
                if len(measured) > 1:
                    samples[system.key] = measured
                failed = [r['error'] for r in grouped.get((name, system.key), []) if 'error' in r]
                if failed:
                    errors[system.key] = failed[-1]
            ratios = {}
            ours = values.get('ours')
            for system in systems:
                theirs = values.get(system.key)
                if system.key != 'ours' and ours is not None and theirs:
                    ratios[system.key] = ours / theirs
            rows.append({'workload': name, 'metric': metric, 'unit': spec.unit,
                         'better': spec.better, 'values': values, 'ratios': ratios,
                         'errors': errors, 'samples': samples})
    return rows


def format_table(rows: List[Dict[str, Any]], systems: List[peers.System]) -> str:
    peer_systems = [s for s in systems if s.key != 'ours']
    has_ours = any(s.key == 'ours' for s in systems)
    header = ['workload', 'metric', 'unit', 'better'] + [s.title for s in systems]
    if has_ours:
        header += [f'ours/{s.title}' for s in peer_systems]
    lines = [header]
    for row in rows:
        cells = [row['workload'], row['metric'], row['unit'], row['better']]
        for s in systems:
            value = row['values'].get(s.key)
            cells.append('error' if value is None and s.key in row['errors']
                         else _format_value(value))
        if has_ours:
            cells += [f'{row["ratios"][s.key]:.2f}x' if s.key in row['ratios'] else '-'
                      for s in peer_systems]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text_columns = 4
    out = []
    for n, line in enumerate(lines):
        out.append('  '.join(cell.ljust(w) if i < text_columns else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(line, widths))).rstrip())
        if n == 0:
            out.append('  '.join('-' * w for w in widths))
    if has_ours and peer_systems:
        out.append('ratio = ours / peer: above 1 is better for "higher" metrics, '
                   'below 1 is better for "lower" ones.')
    return '\n'.join(out)


def _repo_commit() -> Optional[str]:
    try:
        done = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=peers.REPO_ROOT,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _default_out(quick: bool) -> str:
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    return os.path.join(RESULTS_DIR, f'{"quick" if quick else "run"}-{stamp}.json')


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    out_path = os.path.abspath(args.out or _default_out(args.quick))
    log_dir = os.path.splitext(out_path)[0] + '.logs'
    os.makedirs(log_dir, exist_ok=True)

    systems, skipped = peers.discover(args.systems)
    for key, reason in skipped.items():
        print(f'skipping {key}: {reason}', flush=True)
    for s in systems:
        print(f'measuring {s.title} {s.version} ({s.python})', flush=True)

    runs: List[Dict[str, Any]] = []
    plan = [(bench_catalog.get(name), repetition, system) for name in args.workloads
            for repetition in range(1, args.repeat + 1) for system in systems]
    for number, (workload, repetition, system) in enumerate(plan, 1):
        print(f'[{number}/{len(plan)}] {workload.name} on {system.title} ... ', end='', flush=True)
        suffix = f'.{repetition}' if args.repeat > 1 else ''
        log_path = os.path.join(log_dir, f'{workload.name}.{system.key}{suffix}.log')
        result = run_one(system, workload, args.quick, args.timeout, log_path)
        result['repetition'] = repetition
        runs.append(result)
        if 'error' in result:
            print(f'FAILED ({result["error"].splitlines()[-1]}); log: {log_path}', flush=True)
        else:
            shown = ', '.join(f'{k}={_format_value(v)}' for k, v in result['metrics'].items())
            leaked = result.get('details', {}).get('leftover_pids')
            note = f'; LEFT {len(leaked)} PROCESSES BEHIND' if leaked else ''
            print(f'{shown} ({result["driver_wall_s"]:.1f} s{note})', flush=True)

    rows = build_table(runs, systems, args.workloads)
    print()
    if args.quick:
        print('QUICK MODE: tiny sizes and durations; these numbers are a smoke test, not a result.')
    print(format_table(rows, systems))

    report = {
        'created': datetime.datetime.now().isoformat(timespec='seconds'),
        'quick': args.quick,
        'repeat': args.repeat,
        'repo_commit': _repo_commit(),
        'host': {'cpus': os.cpu_count(), 'platform': platform.platform(),
                 'driver_python': platform.python_version()},
        'systems': {**{s.key: {'title': s.title, 'version': s.version, 'python': s.python,
                                'available': True} for s in systems},
                    **{k: {'available': False, 'reason': r} for k, r in skipped.items()}},
        'runs': runs,
        'table': rows,
    }
    with open(out_path, 'w') as f:
        json.dump(report, f, indent=2)
    print(f'\nwrote {out_path}')

    failures = [r for r in runs if 'error' in r]
    for r in failures:
        print(f'\n{r["workload"]} on {r["title"]} failed: {r["error"]}\n{r.get("log_tail", "")}')
    return 1 if failures or skipped else 0


if __name__ == '__main__':
    sys.exit(main())
