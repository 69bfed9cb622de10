"""Parameter server: requesters query parameters from P server partitions, optionally via cachers.

Topology (R requesters, P partitions; requester i asks partition i % P):

    server/0 .. server/P-1     each holds one slice of the parameters and spends --sleep_ms
         ^                     on every request, like a server doing real work
         |  (optional) cacher/0 .. cacher/P-1 in front of each server:
         |     --cacher=class  the paper's plain-Python memoizing `Cacher` in a CourierNode
         |     --cacher=node   lp.CacherNode
         |
    requester/0 .. requester/R-1   query get_params() as fast as they can for --seconds
         ^
    driver/0   starts every requester at the same moment through futures, adds up what they
               did, asks the servers how many requests reached them, prints the queries per
               second and stops the program.

    python -m launchpad.launch --type=local_mp examples/parameter_server.py \\
        --requesters=8 --partitions=2 --cacher=class
"""
from __future__ import annotations

import json
import math
import threading
import time
from typing import Optional, Sequence

import numpy as np
from absl import app, flags

import launchpad as lp

_REQUESTERS = flags.DEFINE_integer('requesters', 4, 'Number of requesters.')
_PARTITIONS = flags.DEFINE_integer('partitions', 1, 'Number of server partitions.')
_CACHER = flags.DEFINE_enum('cacher', 'none', ['none', 'class', 'node'],
                            'What stands between requesters and servers: nothing, the paper\'s '
                            'Cacher class in a CourierNode, or lp.CacherNode.')
_SECONDS = flags.DEFINE_float('seconds', 1.0, 'How long the requesters query.')
_SLEEP_MS = flags.DEFINE_float('sleep_ms', 1.0, 'Work a server does per request, in milliseconds.')
_REFRESH_MS = flags.DEFINE_integer('refresh_ms', 100,
                                   'How long a cacher answers from its copy before refreshing it.')
_SIZE = flags.DEFINE_integer('size', 1000, 'Number of parameters, split across the partitions.')
_RESULTS = flags.DEFINE_string('results', None, 'Also write the measurements to this JSON file.')


def _partition(size: int, partitions: int, index: int) -> np.ndarray:
    return np.array_split(np.arange(size, dtype=np.float64), partitions)[index]


class Server:
    """Holds one partition of the parameters and counts the requests that reach it."""

    def __init__(self, size: int, partitions: int, index: int, sleep_ms: float):
        self._params = _partition(size, partitions, index)
        self._sleep = sleep_ms / 1000
        self._lock = threading.Lock()
        self._served = 0

    def get_params(self) -> np.ndarray:
        time.sleep(self._sleep)
        with self._lock:
            self._served += 1
        return self._params

    def served(self) -> int:
        with self._lock:
            return self._served


class Cacher:
    """The paper's cacher: plain Python that remembers the server's answer for `refresh_ms`.

    Concurrent requests during a refresh wait for it, so each refresh reaches the server once.
    """

    def __init__(self, server, refresh_ms: int):
        self._server = server
        self._refresh = refresh_ms / 1000
        self._lock = threading.Lock()
        self._params: Optional[np.ndarray] = None
        self._fetched_at = -math.inf

    def get_params(self) -> np.ndarray:
        with self._lock:
            if time.monotonic() - self._fetched_at >= self._refresh:
                self._params = self._server.get_params()
                self._fetched_at = time.monotonic()
            return self._params


class Requester:
    """Queries its source for parameters in a loop and checks every answer."""

    def __init__(self, source, expected_sum: float):
        self._source = source
        self._expected_sum = expected_sum

    def ready(self) -> int:
        """Connects to the source with one query, so that the timed queries do not pay for it."""
        self._check(self._source.get_params())
        return 1

    def query(self, start_at: float, seconds: float) -> dict:
        """Waits until wall-clock time `start_at`, then queries for `seconds`."""
        time.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        queries = wrong = 0
        while time.time() < end:
            wrong += not self._check(self._source.get_params())
            queries += 1
        return {'queries': queries, 'wrong': wrong}

    def _check(self, params: np.ndarray) -> bool:
        return float(np.sum(params)) == self._expected_sum


def drive(requesters: Sequence, servers: Sequence, seconds: float, results_path: Optional[str],
          description: str) -> None:
    """Starts all requesters at once, reports the queries per second, stops the program."""
    warmups = sum(requester.ready() for requester in requesters)
    start_at = time.time() + 0.2
    futures = [requester.futures.query(start_at, seconds) for requester in requesters]
    per_requester = [future.result() for future in futures]
    served = [server.served() for server in servers]
    queries = sum(result['queries'] for result in per_requester)
    wrong = sum(result['wrong'] for result in per_requester)
    qps = queries / seconds
    if results_path:
        with open(results_path, 'w') as f:
            json.dump({'qps': qps, 'queries': queries, 'wrong': wrong, 'warmups': warmups,
                       'seconds': seconds, 'per_requester': per_requester, 'served': served}, f)
    correct = 'every answer correct' if wrong == 0 else f'{wrong} WRONG answers'
    print(f'{description}: {queries:,} queries in {seconds:g} s = {qps:,.0f} queries/s; '
          f'{sum(served):,} reached the servers; {correct}.', flush=True)
    lp.stop()


def make_program(requesters: int, partitions: int, cacher: str, seconds: float, sleep_ms: float,
                 refresh_ms: int, size: int, results_path: Optional[str]) -> lp.Program:
    program = lp.Program('parameter_server')
    with program.group('server'):
        servers = [program.add_node(lp.CourierNode(Server, size, partitions, p, sleep_ms))
                   for p in range(partitions)]
    sources = servers
    if cacher == 'class':
        with program.group('cacher'):
            sources = [program.add_node(lp.CourierNode(Cacher, server, refresh_ms))
                       for server in servers]
    elif cacher == 'node':
        with program.group('cacher'):
            sources = [program.add_node(lp.CacherNode(server, refresh_interval_ms=refresh_ms,
                                                      stale_after_ms=10 * refresh_ms))
                       for server in servers]
    with program.group('requester'):
        handles = []
        for i in range(requesters):
            expected = float(np.sum(_partition(size, partitions, i % partitions)))
            handles.append(program.add_node(lp.CourierNode(Requester, sources[i % partitions],
                                                           expected)))
    description = (f'{requesters} requesters, {partitions} partition{"s" * (partitions > 1)}'
                   + ('' if cacher == 'none' else f', cacher={cacher}'))
    program.add_node(lp.PyNode(drive, handles, servers, seconds, results_path, description),
                     label='driver')
    return program


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if _REQUESTERS.value < 1 or _PARTITIONS.value < 1:
        raise app.UsageError('--requesters and --partitions must be at least 1.')
    if _CACHER.value == 'node' and not hasattr(lp, 'CacherNode'):
        raise SystemExit('--cacher=node needs lp.CacherNode, which this version of launchpad does '
                         'not have; use --cacher=class.')
    lp.launch(make_program(_REQUESTERS.value, _PARTITIONS.value, _CACHER.value, _SECONDS.value,
                           _SLEEP_MS.value, _REFRESH_MS.value, _SIZE.value, _RESULTS.value))


if __name__ == '__main__':
    app.run(main)
