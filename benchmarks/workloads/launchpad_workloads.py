"""Launchpad workloads, written once against dm-launchpad's public API.

Run it with the interpreter whose `launchpad` should be measured: ours (with the repository on
PYTHONPATH) or DeepMind's dm-launchpad from its own virtual environment. It finds out which one
it got and branches only where the two differ:

- dm-launchpad's Courier never completes a call that receives a numpy array (their issue 28), so
  the echo workload sends `array.tobytes()` to it and the server turns the bytes back into an
  array (returning arrays works);
- dm-launchpad's `lp.launch` returns a worker manager and its `lp.stop()` signals the launching
  process, so this script stops dm programs through the worker manager and never calls
  `lp.stop()`; ours returns a controller with `stop()` and `wait()`.

Every measurement happens inside a node (a process of the program, like a user's node); it
writes its result to a file that this launcher waits for, then the launcher stops the program.

    python launchpad_workloads.py --workload sync_calls --json
"""
from __future__ import annotations

import collections
import importlib.metadata
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, Tuple

import numpy as np

import bench_harness
import launchpad as lp


def _detect_system() -> Tuple[str, str]:
    """('dm-launchpad', version) when the imported `launchpad` is DeepMind's, else ours."""
    here = os.path.realpath(os.path.dirname(lp.__file__))
    try:
        dist = importlib.metadata.distribution('dm-launchpad')
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None and os.path.realpath(str(dist.locate_file('launchpad'))) == here:
        return 'dm-launchpad', dist.version
    return 'launchpad', str(getattr(lp, '__version__', 'dev'))


SYSTEM, VERSION = _detect_system()
IS_DM = SYSTEM == 'dm-launchpad'

Metrics = Dict[str, float]
Details = Dict[str, Any]


# ----- node classes and measurements (these run inside the program's processes) ---------------

class Echo:
    """The server under test: answers pings and returns what it is sent."""

    def ping(self, value: Any = None) -> Any:
        return value

    def echo(self, data: Any) -> Any:
        if isinstance(data, bytes):  # dm-launchpad cannot receive arrays (their issue 28)
            return np.frombuffer(data, dtype=np.uint8)
        return data

    def pid(self) -> int:
        return os.getpid()


class SleepyServer:
    """The paper's parameter server: every request costs `sleep_s` of server time."""

    def __init__(self, sleep_s: float):
        self._sleep_s = sleep_s

    def get(self) -> int:
        time.sleep(self._sleep_s)
        return 0


class Cacher:
    """The paper's plain-Python memoizing cacher: serves the server's last answer, refreshed
    at most every `refresh_s` seconds (dm-launchpad's CacherNode is not in its open release)."""

    def __init__(self, server: Any, refresh_s: float):
        self._server = server
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._value = None
        self._fetched_at = float('-inf')

    def get(self) -> Any:
        with self._lock:
            if time.monotonic() - self._fetched_at >= self._refresh_s:
                self._value = self._server.get()
                self._fetched_at = time.monotonic()
            return self._value


class Coordinator:
    """Starts every requester at one instant and adds up what they completed in one window."""

    def __init__(self, requesters: int, duration_s: float, result_path: str):
        self._requesters = requesters
        self._duration_s = duration_s
        self._result_path = result_path
        self._lock = threading.Lock()
        self._registered = 0
        self._start_at = None
        self._completed = []

    def register(self) -> None:
        with self._lock:
            self._registered += 1
            if self._registered == self._requesters:
                self._start_at = time.time() + 0.2  # every requester polls well within this

    def start_at(self) -> Any:
        return self._start_at

    def report(self, completed: int, error: Any = None) -> None:
        with self._lock:
            if error is not None:
                bench_harness.write_result(self._result_path, {'error': error})
                return
            self._completed.append(completed)
            if len(self._completed) == self._requesters:
                total = sum(self._completed)
                bench_harness.write_result(self._result_path, {
                    'metrics': {'qps': total / self._duration_s},
                    'details': {'queries': total, 'per_requester': sorted(self._completed)},
                })


def _measure_sync(server: Any, duration_s: float, warmup_s: float) -> Dict[str, Any]:
    server.ping(0)
    warm_end = time.perf_counter() + warmup_s
    while time.perf_counter() < warm_end:
        server.ping(1)
    latencies = []
    start = now = time.perf_counter_ns()
    end = start + int(duration_s * 1e9)
    while now < end:
        before = now
        server.ping(1)
        now = time.perf_counter_ns()
        latencies.append(now - before)
    elapsed = (now - start) / 1e9
    metrics = {'calls_per_s': len(latencies) / elapsed, **bench_harness.latency_summary(latencies)}
    return {'metrics': metrics, 'details': {'calls': len(latencies)}}


def _measure_futures(server: Any, duration_s: float, warmup_s: float,
                     in_flight: int) -> Dict[str, Any]:
    server.ping(0)

    def keep_in_flight(seconds: float) -> Tuple[int, float]:
        pending = collections.deque(server.futures.ping(1) for _ in range(in_flight))
        done = 0
        start = time.perf_counter()
        while True:
            pending.popleft().result()
            done += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
            pending.append(server.futures.ping(1))
        for future in pending:
            future.result()
        return done, elapsed

    keep_in_flight(warmup_s)
    done, elapsed = keep_in_flight(duration_s)
    return {'metrics': {'calls_per_s': done / elapsed}, 'details': {'calls': done}}


def _measure_echo(server: Any, nbytes: int, duration_s: float, min_rounds: int) -> Dict[str, Any]:
    array = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    payload = array.tobytes() if IS_DM else array
    first = server.echo(payload)
    if not np.array_equal(np.asarray(first).reshape(-1), array):
        raise AssertionError('the echoed array differs from the one sent')
    rounds = 0
    start = time.perf_counter()
    while True:
        returned = server.echo(payload)
        rounds += 1
        if returned.nbytes != nbytes:
            raise AssertionError(f'echo returned {returned.nbytes} bytes, sent {nbytes}')
        elapsed = time.perf_counter() - start
        if elapsed >= duration_s and rounds >= min_rounds:
            break
    return {'metrics': {'mb_per_s': nbytes * rounds / elapsed / 1e6},
            'details': {'rounds': rounds, 'sent_as': 'bytes' if IS_DM else 'ndarray'}}


def _measure_pings(nodes: Any) -> Dict[str, Any]:
    pending = list(nodes)
    while pending:
        unanswered = []
        for node in pending:
            try:
                node.ping()
            except Exception:  # not serving yet
                unanswered.append(node)
        pending = unanswered
        if pending:
            time.sleep(0.005)
    return {'answered_at': time.time()}


def _measure_idle(node: Any, settle_s: float) -> Dict[str, Any]:
    import psutil
    pid = node.pid()
    time.sleep(settle_s)
    proc = psutil.Process(pid)
    rss = proc.memory_info().rss
    uss = proc.memory_full_info().uss
    return {'metrics': {'rss_mib': rss / 2**20, 'uss_mib': uss / 2**20},
            'details': {'pid': pid, 'threads': proc.num_threads()}}


def _request(target: Any, coordinator: Any, duration_s: float) -> None:
    try:
        target.get()
        coordinator.register()
        start = coordinator.start_at()
        while start is None:
            time.sleep(0.01)
            start = coordinator.start_at()
        while time.time() < start:
            target.get()
        end = start + duration_s
        completed = 0
        while True:
            target.get()
            if time.time() >= end:
                break
            completed += 1
        coordinator.report(completed)
    except Exception:
        coordinator.report(0, traceback.format_exc())


# ----- the launcher side -----------------------------------------------------------------------

class NodeFailed(RuntimeError):
    """A node's measurement raised; the message carries its traceback."""


def _stop(launched: Any, details: Details) -> None:
    try:
        if IS_DM:
            launched.stop_and_wait()  # lp.stop() would SIGTERM this launching process
        else:
            launched.stop()
            launched.wait()
    except Exception as e:  # the measurement is done; report the stop problem, keep the numbers
        details['stop_error'] = f'{type(e).__name__}: {e}'
        print(traceback.format_exc(), file=sys.stderr)


def _run(session: bench_harness.Session, program: Any,
         result_path: str) -> Tuple[Dict[str, Any], Details]:
    """Launches `program` under local_mp, waits for the result file, stops the program."""
    details: Details = {}
    launched_at = time.time()
    launched = lp.launch(program, launch_type='local_mp', terminal='current_terminal')
    details['launch_call_s'] = round(time.time() - launched_at, 4)
    try:
        result = bench_harness.read_result(result_path, session.deadline - 15)
    finally:
        _stop(launched, details)
    if 'error' in result:
        raise NodeFailed(result['error'])
    result['launched_at'] = launched_at
    return result, details


def _client_server(session: bench_harness.Session, measure: Any,
                   *args: Any) -> Tuple[Metrics, Details]:
    """A program of one Echo server and one client node that runs `measure(server, *args)`."""
    path = session.path('result.json')
    program = lp.Program(session.workload.name)
    server = program.add_node(lp.CourierNode(Echo), label='server')
    program.add_node(lp.PyNode(bench_harness.guarded, path, measure, server, *args),
                     label='client')
    result, details = _run(session, program, path)
    return result['metrics'], {**result['details'], **details}


def sync_calls(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    p = session.params
    return _client_server(session, _measure_sync, p['duration_s'], p['warmup_s'])


def futures_calls(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    p = session.params
    return _client_server(session, _measure_futures, p['duration_s'], p['warmup_s'],
                          p['in_flight'])


def numpy_echo(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    p = session.params
    return _client_server(session, _measure_echo, p['nbytes'], p['duration_s'], p['min_rounds'])


def idle_rss(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    return _client_server(session, _measure_idle, session.params['settle_s'])


def launch(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    path = session.path('result.json')
    program = lp.Program(session.workload.name)
    with program.group('node'):
        handles = [program.add_node(lp.CourierNode(Echo)) for _ in range(session.params['nodes'])]
    program.add_node(lp.PyNode(bench_harness.guarded, path, _measure_pings, handles),
                     label='pinger')
    result, details = _run(session, program, path)
    return {'launch_s': result['answered_at'] - result['launched_at']}, details


def fanin(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    p = session.params
    path = session.path('result.json')
    program = lp.Program(session.workload.name)
    target = program.add_node(lp.CourierNode(SleepyServer, p['server_sleep_s']), label='server')
    if p['cached']:
        target = program.add_node(lp.CourierNode(Cacher, target, p['cache_refresh_s']),
                                  label='cacher')
    coordinator = program.add_node(
        lp.CourierNode(Coordinator, p['requesters'], p['duration_s'], path), label='coordinator')
    with program.group('requester'):
        for _ in range(p['requesters']):
            program.add_node(lp.PyNode(_request, target, coordinator, p['duration_s']))
    result, details = _run(session, program, path)
    return result['metrics'], {**result['details'], **details}


KINDS = {
    'sync_calls': sync_calls,
    'futures_calls': futures_calls,
    'numpy_echo': numpy_echo,
    'launch': launch,
    'fanin': fanin,
    'idle_rss': idle_rss,
}


def main() -> None:
    args = bench_harness.parse_args(__doc__.splitlines()[0])
    with bench_harness.Session(SYSTEM, VERSION, args) as session:
        metrics, details = KINDS[session.workload.kind](session)
        session.emit(metrics, details)


if __name__ == '__main__':
    main()
