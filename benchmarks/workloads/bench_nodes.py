"""The services and measurement loops every system's workloads run, written once.

They talk to other services only through the courier call shape: `peer.method(...)` blocks and
returns the result, `peer.futures.method(...)` returns an object whose `result()` blocks. Launchpad
clients have that shape; the Ray script wraps actor handles into it. This module is imported by
name inside node processes and actors (the workload session puts its folder on PYTHONPATH).
"""
from __future__ import annotations

import collections
import os
import threading
import time
import traceback
from typing import Any, Callable, Dict, Tuple

import numpy as np

import bench_harness


class Echo:
    """The server under test: answers pings and returns what it is sent."""

    def ping(self, value: Any = None) -> Any:
        return value

    def echo(self, data: Any) -> Any:
        if isinstance(data, bytes):  # a system that cannot receive arrays gets bytes
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


def measure_sync(server: Any, duration_s: float, warmup_s: float) -> Dict[str, Any]:
    """Blocking pings with a small argument, one at a time: calls/s and p50/p99 latency."""
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


def measure_futures(server: Any, duration_s: float, warmup_s: float,
                    in_flight: int) -> Dict[str, Any]:
    """Pings through futures, `in_flight` outstanding at all times: calls/s."""
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


def measure_echo(server: Any, nbytes: int, duration_s: float, min_rounds: int,
                 send_bytes: bool = False) -> Dict[str, Any]:
    """Echo round trips of an `nbytes` array; `send_bytes` sends `array.tobytes()` instead."""
    array = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    payload = array.tobytes() if send_bytes else array
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
            'details': {'rounds': rounds, 'sent_as': 'bytes' if send_bytes else 'ndarray'}}


def measure_pings(nodes: Any) -> Dict[str, Any]:
    """Pings every node until all have answered once; returns when that happened (time.time())."""
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


def measure_idle(node: Any, settle_s: float) -> Dict[str, Any]:
    """Memory of the process serving `node` after one call and `settle_s` of idleness."""
    import psutil
    pid = node.pid()
    time.sleep(settle_s)
    proc = psutil.Process(pid)
    rss = proc.memory_info().rss
    uss = proc.memory_full_info().uss
    return {'metrics': {'rss_mib': rss / 2**20, 'uss_mib': uss / 2**20},
            'details': {'pid': pid, 'threads': proc.num_threads()}}


def request_in_window(target: Any, coordinator: Any, duration_s: float) -> None:
    """One requester of a fan-in: calls `target.get()` back to back and reports to
    `coordinator` how many calls completed inside the common window."""
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


# Workload kinds measured by a client node calling one Echo server.
CLIENT_SERVER_KINDS = ('sync_calls', 'futures_calls', 'numpy_echo', 'idle_rss')


def client_measurement(kind: str, params: Dict[str, Any],
                       send_bytes: bool = False) -> Tuple[Callable[..., Dict[str, Any]], tuple]:
    """The measurement loop for a client-server workload `kind` and its arguments after the
    server; `send_bytes` is for systems that cannot receive numpy arrays."""
    if kind == 'sync_calls':
        return measure_sync, (params['duration_s'], params['warmup_s'])
    if kind == 'futures_calls':
        return measure_futures, (params['duration_s'], params['warmup_s'], params['in_flight'])
    if kind == 'numpy_echo':
        return measure_echo, (params['nbytes'], params['duration_s'], params['min_rounds'],
                              send_bytes)
    if kind == 'idle_rss':
        return measure_idle, (params['settle_s'],)
    raise ValueError(f'{kind!r} is not a client-server workload; those are {CLIENT_SERVER_KINDS}')
