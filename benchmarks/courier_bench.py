"""Measures courier call rates, latencies and array throughput.

For each transport (TCP on loopback, Unix domain socket; TCP with TLS if asked for) a
courier server runs in a separate process and this process calls it:

  sync        calls/s of back-to-back blocking calls of a no-op method, with the
              median (p50) and 99th percentile (p99) latency of one call;
  futures     calls/s with 64 calls in flight through client.futures;
  echo N MiB  MB/s of a float32 numpy array of N MiB echoed back: array bytes
              per second in each direction (a call moves the array there and back).

With --baseline, the same measurements also run against a bare grpcio server
moving the same bytes without courier (no pickling, no framing), and the table
shows courier's numbers as a ratio of those: what courier itself costs.

Usage: python benchmarks/courier_bench.py [--seconds 3] [--transports tcp uds tls]
           [--repeat 3] [--baseline] [--json results.json]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import importlib.util
import json
import multiprocessing
import pathlib
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

import courier

FUTURES_IN_FLIGHT = 64
_BARE_METHOD = '/bench.Bare/Echo'


def _serve_courier(address: str, ready, stop, tls: Optional[courier.TLSConfig] = None) -> None:
    """Server process: serves a no-op and an echo until ``stop`` is set."""
    server = courier.Server(address=address, thread_pool_size=16, tls=tls)
    server.Bind('noop', lambda: None)
    server.Bind('echo', lambda value: value)
    server.Start()
    ready.put(server.address)
    stop.wait()
    server.Stop()


def _serve_bare_grpc(address: str, ready, stop) -> None:
    """Server process: a grpcio server echoing raw bytes, as courier configures gRPC."""
    import grpc  # pylint: disable=import-outside-toplevel
    from courier import transport  # pylint: disable=import-outside-toplevel
    from courier.transport import grpc as grpc_transport  # pylint: disable=import-outside-toplevel
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(16),
                         options=grpc_transport.SERVER_OPTIONS)
    service, method = _BARE_METHOD.strip('/').split('/')
    server.add_registered_method_handlers(
        service, {method: grpc.unary_unary_rpc_method_handler(lambda request, context: request)})
    target = transport.parse_address(address).grpc_target
    port = server.add_insecure_port(target)
    server.start()
    ready.put(target if target.startswith('unix:') else f'localhost:{port}')
    stop.wait()
    server.stop(None).wait()


class _BareGrpcClient:
    """Calls the bare server with what courier would send: the no-op or the array's bytes."""

    def __init__(self, address: str):
        import grpc  # pylint: disable=import-outside-toplevel
        from courier.transport import grpc as transport  # pylint: disable=import-outside-toplevel
        channel = grpc.insecure_channel(
            address, options=transport.CHANNEL_OPTIONS)
        self._call = channel.unary_unary(_BARE_METHOD, _registered_method=True)

    def noop(self) -> bytes:
        return self._call(b'', wait_for_ready=True)

    def submit_noop(self):
        return self._call.future(b'', wait_for_ready=True)

    def echo(self, array: np.ndarray) -> np.ndarray:
        reply = self._call(array.tobytes(), wait_for_ready=True)
        return np.frombuffer(reply, dtype=array.dtype)


@contextlib.contextmanager
def _server_process(serve: Callable[..., None], address: str, *args: Any) -> Iterator[str]:
    """Runs a server in a child process; always stops and reaps it."""
    context = multiprocessing.get_context('spawn')
    ready, stop = context.Queue(), context.Event()
    process = context.Process(target=serve, args=(address, ready, stop, *args), daemon=True)
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


def _time_sync(call: Callable[[], Any], seconds: float) -> Dict[str, float]:
    latencies: List[int] = []
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    start = clock()
    now = start
    while now < deadline:
        call()
        after = clock()
        latencies.append(after - now)
        now = after
    elapsed = (now - start) / 1e9
    latencies.sort()
    return {'calls_per_s': len(latencies) / elapsed,
            'p50_us': latencies[len(latencies) // 2] / 1e3,
            'p99_us': latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e3}


def _time_futures(submit: Callable[[], Any], seconds: float) -> Dict[str, float]:
    in_flight: collections.deque = collections.deque()
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        while len(in_flight) < FUTURES_IN_FLIGHT:
            in_flight.append(submit())
        in_flight.popleft().result()
        calls += 1
        if calls % FUTURES_IN_FLIGHT == 0 and time.perf_counter() >= deadline:
            break
    while in_flight:
        in_flight.popleft().result()
        calls += 1
    return {'calls_per_s': calls / (time.perf_counter() - start)}


def _time_echo(echo: Callable[[np.ndarray], np.ndarray], mebibytes: int,
               seconds: float) -> Dict[str, float]:
    array = np.random.default_rng(0).random(mebibytes * 2**20 // 4, dtype=np.float32)
    echo(array)  # Warm up.
    calls = 0
    start = time.perf_counter()
    while True:
        result = echo(array)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= 3:
            break
    assert result.shape == array.shape
    return {'mb_per_s': array.nbytes * calls / elapsed / 1e6}


def _measure(client: Any, submit: Callable[[], Any], seconds: float,
             sizes: List[int]) -> Dict[str, Dict[str, float]]:
    for _ in range(200):  # Warm up the connection and code paths.
        client.noop()
    numbers = {'sync': _time_sync(client.noop, seconds),
               'futures': _time_futures(submit, seconds)}
    for size in sizes:
        numbers[f'echo_{size}MiB'] = _time_echo(client.echo, size, seconds)
    return numbers


def run(transports: List[str], seconds: float, sizes: List[int],
        baseline: bool = False) -> Dict[str, Dict]:
    """Runs every measurement; returns {'courier tcp': {metric: numbers}, ...}."""
    results = {}
    with tempfile.TemporaryDirectory(prefix='courier-bench-') as scratch:
        for transport in transports:
            address = 'localhost:0' if transport != 'uds' else f'unix:{scratch}/bench.sock'
            server_tls, client_tls = _tls_configs() if transport == 'tls' else (None, None)
            with _server_process(_serve_courier, address, server_tls) as served_at:
                client = courier.Client(served_at, call_timeout=600, tls=client_tls)
                results[f'courier {transport}'] = _measure(client, client.futures.noop,
                                                           seconds, sizes)
            if baseline and transport != 'tls':
                with _server_process(_serve_bare_grpc, address) as served_at:
                    client = _BareGrpcClient(served_at)
                    results[f'grpcio {transport}'] = _measure(client, client.submit_noop,
                                                              seconds, sizes)
    return results


def _tls_configs():
    """A server's and its client's TLS configurations, with certificates made now."""
    # Loaded by its path: the repository's root on sys.path would also shadow the courier
    # that this process and its servers import (an installed one, or another checkout's).
    path = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'pki.py'
    spec = importlib.util.spec_from_file_location('courier_bench_pki', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pki = module.Pki()
    return (courier.TLSConfig(certificate_chain=pki.server_pem, private_key=pki.server_key),
            courier.TLSConfig(root_certificates=pki.ca_pem))


def _print_table(results: Dict[str, Dict]) -> None:
    print(f'{"":12} {"sync calls/s":>12} {"p50 us":>7} {"p99 us":>7} '
          f'{"futures x" + str(FUTURES_IN_FLIGHT) + " calls/s":>20}  echo MB/s each way')
    for system, numbers in results.items():
        sync = numbers['sync']
        echoes = '  '.join(f'{metric[5:]} {value["mb_per_s"]:,.0f}'
                           for metric, value in numbers.items() if metric.startswith('echo_'))
        print(f'{system:12} {sync["calls_per_s"]:12,.0f} {sync["p50_us"]:7.0f} '
              f'{sync["p99_us"]:7.0f} {numbers["futures"]["calls_per_s"]:20,.0f}  {echoes}')
    for system, numbers in results.items():
        bare = results.get(system.replace('courier', 'grpcio'))
        if system.startswith('courier') and bare:
            ratios = [f'{metric} {_headline(numbers[metric]) / _headline(bare[metric]):.2f}'
                      for metric in numbers]
            print(f'{system} / bare grpcio: ' + ', '.join(ratios))


def _headline(numbers: Dict[str, float]) -> float:
    return numbers.get('calls_per_s', numbers.get('mb_per_s'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seconds', type=float, default=3.0,
                        help='time spent on each measurement')
    parser.add_argument('--transports', nargs='+', choices=['tcp', 'uds', 'tls'],
                        default=['tcp', 'uds'], help='tls: TCP with TLS (no grpcio baseline)')
    parser.add_argument('--sizes-mib', nargs='+', type=int, default=[1, 64],
                        help='array sizes for the echo measurement')
    parser.add_argument('--repeat', type=int, default=1,
                        help='run everything this many times; reports the median of each number')
    parser.add_argument('--baseline', action='store_true',
                        help='also measure a bare grpcio server, and print ratios')
    parser.add_argument('--json', help='also write the numbers to this file')
    args = parser.parse_args()
    runs = [run(args.transports, args.seconds, args.sizes_mib, args.baseline)
            for _ in range(args.repeat)]
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
