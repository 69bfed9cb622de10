"""What courier's call counting (courier/metrics.py) costs on the same-host call rate.

Each round runs the same measurements twice, alternating which comes first: counting on in
both processes, and counting off (COURIER_METRICS=off in the server process, and
courier.metrics.set_enabled(False) in this one, the client). A courier server runs in a child
process, as in courier_bench.py, and this process calls it:

  sync      calls/s of back-to-back blocking calls of a no-op method, and the CPU time
            (user + system) each call took in the client and in the server process
  futures   calls/s with 64 calls in flight through client.futures

It prints the median of each over the rounds and the ratio on/off (1.00: free). On a busy
machine calls/s move with the load; CPU time per call moves much less.

Usage: python benchmarks/metrics_cost.py [--seconds 2] [--rounds 5] [--transports uds tcp]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from typing import Dict, Iterator, List

import psutil

import courier
from courier import metrics

import courier_bench

MEASURES = {'sync': 'sync calls/s', 'futures': 'futures calls/s',
            'client_cpu_us': 'sync: client CPU us/call', 'server_cpu_us': 'sync: server CPU us/call'}


@contextlib.contextmanager
def _counting(enabled: bool) -> Iterator[None]:
    """Counting on or off here, and in server processes started inside the block."""
    before = os.environ.get('COURIER_METRICS')
    os.environ['COURIER_METRICS'] = 'on' if enabled else 'off'
    metrics.set_enabled(enabled)
    try:
        yield
    finally:
        metrics.set_enabled(True)
        if before is None:
            del os.environ['COURIER_METRICS']
        else:
            os.environ['COURIER_METRICS'] = before


def measure(transport: str, enabled: bool, seconds: float) -> Dict[str, float]:
    """calls/s of sync and futures calls to a server in another process, and the CPU
    microseconds per sync call on each side."""
    with tempfile.TemporaryDirectory(prefix='courier-metrics-') as scratch, _counting(enabled):
        address = 'localhost:0' if transport == 'tcp' else f'unix:{scratch}/bench.sock'
        with courier_bench._server_process(courier_bench._serve_courier,  # pylint: disable=protected-access
                                           address) as served_at:
            server = psutil.Process().children()[-1]
            client = courier.Client(served_at, call_timeout=600)
            for _ in range(200):
                client.noop()
            client_cpu, server_cpu = time.process_time(), sum(server.cpu_times()[:2])
            started = time.perf_counter()
            sync = courier_bench._time_sync(client.noop, seconds)  # pylint: disable=protected-access
            calls = sync['calls_per_s'] * (time.perf_counter() - started)
            client_cpu = (time.process_time() - client_cpu) / calls * 1e6
            server_cpu = (sum(server.cpu_times()[:2]) - server_cpu) / calls * 1e6
            futures = courier_bench._time_futures(  # pylint: disable=protected-access
                client.futures.noop, seconds)
    return {'sync': sync['calls_per_s'], 'futures': futures['calls_per_s'],
            'client_cpu_us': client_cpu, 'server_cpu_us': server_cpu}


def run(transports: List[str], seconds: float, rounds: int) -> Dict[str, Dict[str, Dict]]:
    """{transport: {'on'|'off': {measure: [calls/s per round]}}}."""
    results: Dict[str, Dict[str, Dict]] = {}
    for transport in transports:
        runs = results[transport] = {counting: {name: [] for name in MEASURES}
                                     for counting in ('on', 'off')}
        for index in range(rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            for enabled in order:
                for name, value in measure(transport, enabled, seconds).items():
                    runs['on' if enabled else 'off'][name].append(value)
    return results


def print_table(results: Dict[str, Dict[str, Dict]]) -> None:
    print(f'{"":6} {"":24} {"counting on":>12} {"off":>12} {"on/off":>7}')
    for transport, runs in results.items():
        for name, label in MEASURES.items():
            on, off = statistics.median(runs['on'][name]), statistics.median(runs['off'][name])
            print(f'{transport:6} {label:24} {on:12,.1f} {off:12,.1f} {on / off:7.3f}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seconds', type=float, default=2.0, help='time per measurement')
    parser.add_argument('--rounds', type=int, default=5, help='rounds; medians are reported')
    parser.add_argument('--transports', nargs='+', choices=['uds', 'tcp'], default=['uds'])
    args = parser.parse_args()
    print_table(run(args.transports, args.seconds, args.rounds))


if __name__ == '__main__':
    main()
