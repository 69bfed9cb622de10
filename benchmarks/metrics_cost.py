"""What courier's call counting (courier/metrics.py), or its list of calls in flight
(courier/inflight.py, with --feature inflight), costs on the same-host call rate.

Each round runs the same measurements twice, alternating which comes first: the feature on in
both processes, and off (COURIER_METRICS=off, or COURIER_INFLIGHT=off, in the server process, and
set_enabled(False) of its module in this one, the client). A courier server runs in a child
process, as in courier_bench.py, and this process calls it:

  sync      calls/s of back-to-back blocking calls of a no-op method, and the CPU time
            (user + system) each call took in the client and in the server process
  futures   calls/s with 64 calls in flight through client.futures

  paths     the CPU time of courier's own code for one no-op call, without a socket: the client
            against a transport that answers at once (sync calls, and futures), and the server's
            call handling; counting
            on and off alternate in one process, so the difference is what counting adds

It prints the median of each over the rounds and the ratio on/off (1.00: free). On a busy
machine calls/s move with the load; CPU time per call moves less, and the code paths least.

Usage: python benchmarks/metrics_cost.py [--seconds 2] [--rounds 5] [--transports uds tcp]
                                         [--feature counting|inflight]
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
from courier import inflight
from courier import metrics
from courier import serialization
from courier import wire
from courier.transport import _base

import courier_bench

MEASURES = {'sync': 'sync calls/s', 'futures': 'futures calls/s',
            'client_cpu_us': 'sync: client CPU us/call', 'server_cpu_us': 'sync: server CPU us/call',
            'client_path_us': 'client code us/call', 'server_path_us': 'server code us/call',
            'futures_path_us': 'client futures us/call'}
SOCKET_MEASURES = ('sync', 'futures', 'client_cpu_us', 'server_cpu_us')
PATH_ROUNDS_PER_ROUND = 20


# What --feature turns on and off: (its environment variable, its module).
FEATURES = {'counting': ('COURIER_METRICS', metrics), 'inflight': ('COURIER_INFLIGHT', inflight)}
_feature = 'counting'


@contextlib.contextmanager
def _counting(enabled: bool) -> Iterator[None]:
    """The measured feature on or off here, and in server processes started inside the block."""
    variable, module = FEATURES[_feature]
    before = os.environ.get(variable)
    os.environ[variable] = 'on' if enabled else 'off'
    module.set_enabled(enabled)
    try:
        yield
    finally:
        module.set_enabled(True)
        if before is None:
            del os.environ[variable]
        else:
            os.environ[variable] = before


def _server_process() -> psutil.Process:
    """The newest server process courier_bench spawned (not multiprocessing's tracker)."""
    spawned = [child for child in psutil.Process().children()
               if 'resource_tracker' not in ' '.join(child.cmdline())]
    return max(spawned, key=lambda child: child.create_time())


def measure(transport: str, enabled: bool, seconds: float) -> Dict[str, float]:
    """calls/s of sync and futures calls to a server in another process, and the CPU
    microseconds per sync call on each side."""
    with tempfile.TemporaryDirectory(prefix='courier-metrics-') as scratch, _counting(enabled):
        address = 'localhost:0' if transport == 'tcp' else f'unix:{scratch}/bench.sock'
        with courier_bench._server_process(courier_bench._serve_courier,  # pylint: disable=protected-access
                                           address) as served_at:
            server = _server_process()
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


class _Instant:
    """A client transport that answers every call at once with a None result."""

    address = 'unix:/instant'

    def __init__(self):
        self._result = serialization.dumps(None, 'the result')

    def call(self, method, data, buffers, timeout):
        del method, data, buffers, timeout
        return wire.Response(wire.OK, self._result[0], list(self._result[1]))

    def call_async(self, method, data, buffers, timeout, finish):
        future = _base.CallFuture()
        future.resolve(finish, self.call(method, data, buffers, timeout))
        return future


def measure_paths(rounds: int, calls: int = 2000) -> Dict[str, Dict[str, List[float]]]:
    """CPU microseconds of courier's client and server code per no-op call, counting on and off
    (see the module docstring): {'on'|'off': {'client_path_us'|'server_path_us': [...]}}. Many
    short rounds, on and off in turn, so that both see the same load."""
    from courier import transport  # pylint: disable=import-outside-toplevel
    arguments = memoryview(serialization.dumps(((), {}), 'the arguments', ('args', 'kwargs'))[0])
    sides = {}
    with tempfile.TemporaryDirectory(prefix='courier-metrics-') as scratch:
        connect, transport.connect = transport.connect, lambda *args, **kwargs: _Instant()
        try:
            for enabled in (True, False):
                with _counting(enabled):
                    client = courier.Client(_Instant.address)
                    client.noop()  # connects now, counting as set
                    server = courier.Server(address=f'unix:{scratch}/{enabled}.sock')
                    server.Bind('noop', lambda: None)
                    server.Start()
                sides['on' if enabled else 'off'] = (client, server)
            results = {counting: {'client_path_us': [], 'server_path_us': [],
                                  'futures_path_us': []} for counting in sides}
            for index in range(rounds):
                for counting in (('on', 'off') if index % 2 == 0 else ('off', 'on')):
                    client, server = sides[counting]
                    handle = server._handle_call  # pylint: disable=protected-access
                    started = time.process_time()
                    for _ in range(calls):
                        client.noop()
                    middle = time.process_time()
                    for _ in range(calls):
                        handle('noop', arguments, [])
                    ended = time.process_time()
                    start_future = client.futures.noop
                    for _ in range(calls):
                        start_future().result()
                    futures_ended = time.process_time()
                    results[counting]['client_path_us'].append((middle - started) / calls * 1e6)
                    results[counting]['server_path_us'].append((ended - middle) / calls * 1e6)
                    results[counting]['futures_path_us'].append(
                        (futures_ended - ended) / calls * 1e6)
        finally:
            transport.connect = connect
            for _, server in sides.values():
                server.Stop()
    return results


def run(transports: List[str], seconds: float, rounds: int) -> Dict[str, Dict[str, Dict]]:
    """{transport or 'paths': {'on'|'off': {measure: [a number per round]}}}."""
    results: Dict[str, Dict[str, Dict]] = {'paths': measure_paths(PATH_ROUNDS_PER_ROUND * rounds)}
    for transport in transports:
        runs = results[transport] = {counting: {name: [] for name in SOCKET_MEASURES}
                                     for counting in ('on', 'off')}
        for index in range(rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            for enabled in order:
                for name, value in measure(transport, enabled, seconds).items():
                    runs['on' if enabled else 'off'][name].append(value)
    return results


def print_table(results: Dict[str, Dict[str, Dict]]) -> None:
    """Medians, their ratio, and the spread of the rounds' own on/off ratios (their middle
    half, 25th to 75th percentile): the noise floor a ratio must stand out of."""
    print(f'{"":6} {"":24} {"on":>12} {"off":>12} {"on/off":>7} {"rounds 25-75%":>14}')
    for transport, runs in results.items():
        for name in runs['on']:
            on, off = statistics.median(runs['on'][name]), statistics.median(runs['off'][name])
            # CPU is counted in clock ticks: a short round on a busy machine may count none.
            ratios = [a / b for a, b in zip(runs['on'][name], runs['off'][name]) if b]
            if not off or not ratios:
                print(f'{transport:6} {MEASURES[name]:24} {on:12,.2f} {off:12,.2f} '
                      f'{"-":>7} {"(none counted off)":>14}')
                continue
            low, _, high = (statistics.quantiles(ratios, n=4) if len(ratios) > 1
                            else ratios * 3)
            print(f'{transport:6} {MEASURES[name]:24} {on:12,.2f} {off:12,.2f} {on / off:7.3f} '
                  f'{low:6.3f}-{high:.3f}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seconds', type=float, default=2.0, help='time per measurement')
    parser.add_argument('--rounds', type=int, default=5, help='rounds; medians are reported')
    parser.add_argument('--transports', nargs='+', choices=['uds', 'tcp'], default=['uds'])
    parser.add_argument('--feature', choices=sorted(FEATURES), default='counting',
                        help='what is turned on and off (default: counting)')
    args = parser.parse_args()
    global _feature  # pylint: disable=global-statement
    _feature = args.feature
    print(f'{args.feature} on vs off')
    print_table(run(args.transports, args.seconds, args.rounds))


if __name__ == '__main__':
    main()
