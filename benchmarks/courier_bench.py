"""Measures courier call rates, latencies and array throughput.

For each transport (TCP on loopback, Unix domain socket) a courier server runs
in a separate process and this process calls it:

  sync        calls/s of back-to-back blocking calls of a no-op method, with the
              median (p50) and 99th percentile (p99) latency of one call;
  futures     calls/s with 64 calls in flight through client.futures;
  echo N MiB  MB/s of a float32 numpy array of N MiB echoed back: array bytes
              per second in each direction (a call moves the array there and back).

Usage: python benchmarks/courier_bench.py [--seconds 3] [--transports tcp uds]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing
import statistics
import tempfile
import time
from typing import Dict, Iterator, List

import numpy as np

import courier

FUTURES_IN_FLIGHT = 64


def _serve(address: str, ready, stop) -> None:
    """Server process: serves a no-op and an echo until ``stop`` is set."""
    server = courier.Server(address=address, thread_pool_size=16)
    server.Bind('noop', lambda: None)
    server.Bind('echo', lambda value: value)
    server.Start()
    ready.put(server.address)
    stop.wait()
    server.Stop()


@contextlib.contextmanager
def _server_process(address: str) -> Iterator[str]:
    """Runs a server in a child process; always stops and reaps it."""
    context = multiprocessing.get_context('spawn')
    ready, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve, args=(address, ready, stop), daemon=True)
    process.start()
    try:
        yield ready.get(timeout=60)
    finally:
        stop.set()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
        ready.close()
        ready.join_thread()


def _time_sync(client: courier.Client, seconds: float) -> Dict[str, float]:
    latencies: List[int] = []
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    start = clock()
    now = start
    while now < deadline:
        client.noop()
        after = clock()
        latencies.append(after - now)
        now = after
    elapsed = (now - start) / 1e9
    latencies.sort()
    return {'calls_per_s': len(latencies) / elapsed,
            'p50_us': latencies[len(latencies) // 2] / 1e3,
            'p99_us': latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e3}


def _time_futures(client: courier.Client, seconds: float) -> Dict[str, float]:
    in_flight: collections.deque = collections.deque()
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        while len(in_flight) < FUTURES_IN_FLIGHT:
            in_flight.append(client.futures.noop())
        in_flight.popleft().result()
        calls += 1
        if calls % FUTURES_IN_FLIGHT == 0 and time.perf_counter() >= deadline:
            break
    while in_flight:
        in_flight.popleft().result()
        calls += 1
    return {'calls_per_s': calls / (time.perf_counter() - start)}


def _time_echo(client: courier.Client, mebibytes: int, seconds: float) -> Dict[str, float]:
    array = np.random.default_rng(0).random(mebibytes * 2**20 // 4, dtype=np.float32)
    client.echo(array)  # Warm up.
    calls = 0
    start = time.perf_counter()
    while True:
        result = client.echo(array)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 3:
            break
    assert result.shape == array.shape
    return {'mb_per_s': array.nbytes * calls / elapsed / 1e6, 'calls': calls}


def run(transports: List[str], seconds: float, sizes: List[int]) -> Dict[str, Dict]:
    """Runs every measurement; returns {transport: {metric: numbers}}."""
    results = {}
    with tempfile.TemporaryDirectory(prefix='courier-bench-') as scratch:
        for transport in transports:
            address = 'localhost:0' if transport == 'tcp' else f'unix:{scratch}/bench.sock'
            with _server_process(address) as served_at:
                client = courier.Client(served_at, call_timeout=120)
                for _ in range(200):  # Warm up the connection and code paths.
                    client.noop()
                numbers = {'sync': _time_sync(client, seconds),
                           'futures': _time_futures(client, seconds)}
                for size in sizes:
                    numbers[f'echo_{size}MiB'] = _time_echo(client, size, seconds)
                results[transport] = numbers
    return results


def _print_table(results: Dict[str, Dict]) -> None:
    for transport, numbers in results.items():
        sync = numbers['sync']
        print(f'{transport:4} sync         {sync["calls_per_s"]:9,.0f} calls/s   '
              f'p50 {sync["p50_us"]:7.0f} us   p99 {sync["p99_us"]:7.0f} us')
        print(f'{transport:4} futures x{FUTURES_IN_FLIGHT}  '
              f'{numbers["futures"]["calls_per_s"]:9,.0f} calls/s')
        for metric, value in numbers.items():
            if metric.startswith('echo_'):
                size = metric[len('echo_'):]
                print(f'{transport:4} echo {size:>7} {value["mb_per_s"]:9,.0f} MB/s each way')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seconds', type=float, default=3.0,
                        help='time spent on each measurement')
    parser.add_argument('--transports', nargs='+', choices=['tcp', 'uds'],
                        default=['tcp', 'uds'])
    parser.add_argument('--sizes-mib', nargs='+', type=int, default=[1, 64],
                        help='array sizes for the echo measurement')
    parser.add_argument('--repeat', type=int, default=1,
                        help='run everything this many times; reports the median of each number')
    parser.add_argument('--json', help='also write the numbers to this file')
    args = parser.parse_args()
    runs = [run(args.transports, args.seconds, args.sizes_mib) for _ in range(args.repeat)]
    results = _median_of(runs)
    _print_table(results)
    if args.json:
        with open(args.json, 'w') as out:
            json.dump(results, out, indent=2)


def _median_of(runs: List[Dict]) -> Dict:
    if isinstance(runs[0], dict):
        return {key: _median_of([run[key] for run in runs]) for key in runs[0]}
    return statistics.median(runs)


if __name__ == '__main__':
    main()
