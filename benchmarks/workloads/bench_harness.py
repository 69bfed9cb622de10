"""What every workload script shares: arguments, one JSON result on stdout, a time bound, cleanup.

A workload script's nodes print freely (launchers decorate and forward their output), so the
session moves everything the process and its children write on stdout to stderr and keeps the
original stdout for the single result line. Node code (which runs in other processes) uses only
`write_result`, `read_result`, `guarded` and `latency_summary`: importing this module there has
no side effects.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, Optional, Sequence

import bench_catalog
import bench_cleanup

WORKLOADS_DIR = os.path.dirname(os.path.abspath(__file__))


def parse_args(description: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--workload', required=True, choices=sorted(bench_catalog.WORKLOADS),
                        help='which workload to run (see bench_catalog.py)')
    parser.add_argument('--json', action='store_true',
                        help='print the result as one JSON object instead of text')
    parser.add_argument('--quick', action='store_true',
                        help='tiny sizes and durations: a smoke run, not a measurement')
    parser.add_argument('--timeout', type=float, default=None,
                        help="seconds after which the run is abandoned (default: the workload's)")
    return parser.parse_args(argv)


# ----- used inside nodes -------------------------------------------------------------------

def write_result(path: str, payload: Dict[str, Any]) -> None:
    """Writes `payload` as JSON so that a reader never sees a partial file."""
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w') as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def read_result(path: str, deadline: float, poll_s: float = 0.02) -> Dict[str, Any]:
    """Waits until `path` exists (or `deadline`, a time.time() value, passes) and returns it."""
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f'no result appeared at {path} before the deadline')
        time.sleep(poll_s)
    with open(path) as f:
        return json.load(f)


def guarded(path: str, fn: Callable[..., Dict[str, Any]], *args: Any) -> None:
    """Runs a node's measurement and writes its result, or its error, to `path`."""
    try:
        payload = fn(*args)
    except BaseException:  # the launcher must hear about any failure, not time out
        payload = {'error': traceback.format_exc()}
    write_result(path, payload)


def latency_summary(latencies_ns: Sequence[int]) -> Dict[str, float]:
    """p50 and p99 of per-call latencies, in microseconds (nearest-rank percentiles)."""
    ordered = sorted(latencies_ns)
    if not ordered:
        raise ValueError('no latencies were recorded')

    def rank(q: float) -> float:
        index = min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))
        return ordered[index] / 1000.0

    return {'p50_us': rank(0.50), 'p99_us': rank(0.99)}


# ----- used by the workload script's own process ------------------------------------------

class Session:
    """One workload run: owns the result stream, the temp dir, the time bound and the cleanup.

    Use as a context manager around the measurement; call `emit` once with the metrics.
    """

    def __init__(self, system: str, version: str, args: argparse.Namespace):
        self.system = system
        self.version = version
        self.workload = bench_catalog.get(args.workload)
        self.quick = bool(args.quick)
        self.params = self.workload.params(self.quick)
        self.timeout_s = float(args.timeout or self.workload.timeout_s)
        self.as_json = bool(args.json)
        self.deadline = time.time() + self.timeout_s
        self._started = time.time()
        self._emitted = False
        self._emit_lock = threading.Lock()

        sys.stdout.flush()
        self._result_fd = os.dup(1)
        os.dup2(2, 1)  # node output, inherited fd 1, now lands on stderr

        # Every process started from here on inherits the marker, and can import these helpers.
        self.marker = os.environ.setdefault(bench_cleanup.MARKER_ENV, bench_cleanup.new_marker())
        path = os.environ.get('PYTHONPATH', '')
        os.environ['PYTHONPATH'] = os.pathsep.join(p for p in (WORKLOADS_DIR, path) if p)

        self.tmpdir = tempfile.mkdtemp(prefix='lpbench-')
        self._watchdog = threading.Timer(self.timeout_s, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def path(self, name: str) -> str:
        return os.path.join(self.tmpdir, name)

    def emit(self, metrics: Dict[str, float], details: Optional[Dict[str, Any]] = None,
             error: Optional[str] = None) -> None:
        """Prints the one result of this run (later calls are ignored).

        Call it after the system under test was stopped: any process of this run still alive
        5 s later was left behind by the system; it is ended and its pid reported as a leak.
        """
        with self._emit_lock:
            if self._emitted:
                return
            self._emitted = True
        details = dict(details or {})
        leaked = bench_cleanup.kill_marked_processes(self.marker, exit_wait_s=5.0)
        if leaked:
            details['leftover_pids'] = leaked
        unknown = set(metrics) - set(bench_catalog.METRICS)
        if unknown:
            raise ValueError(f'metrics {sorted(unknown)} are not declared in bench_catalog.METRICS')
        result = {
            'system': self.system,
            'version': self.version,
            'python': platform.python_version(),
            'workload': self.workload.name,
            'quick': self.quick,
            'params': self.params,
            'metrics': {k: float(v) for k, v in metrics.items()},
            'details': details,
            'wall_s': round(time.time() - self._started, 3),
        }
        if error:
            result['error'] = error
        if self.as_json:
            text = json.dumps(result) + '\n'
        else:
            lines = [f'{self.system} {self.version} / {self.workload.name} {self.params}']
            lines += [f'  {k}: {v:.6g} {bench_catalog.METRICS[k].unit}'
                      for k, v in result['metrics'].items()]
            lines += [f'  {k}: {v}' for k, v in result['details'].items()]
            if error:
                lines.append(f'  ERROR: {error}')
            text = '\n'.join(lines) + '\n'
        os.write(self._result_fd, text.encode())

    def close(self) -> None:
        """Ends every process this run started and removes its temp dir.

        The watchdog stays armed: launchers run exit hooks (dm-launchpad waits for its nodes)
        after this, and those are bounded too.
        """
        bench_cleanup.kill_marked_processes(self.marker)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _expire(self) -> None:
        message = f'run exceeded its time bound of {self.timeout_s:.0f} s'
        print(f'bench: {message}', file=sys.stderr)
        try:
            self.emit({}, error=message)
            self.close()
        finally:
            os._exit(3)

    def __enter__(self) -> 'Session':
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.emit({}, error=f'{exc_type.__name__}: {exc}')
        self.close()
        return False  # the exception, if any, goes on to print its traceback and exit non-zero
