"""Courier between two hosts, side by side: ours (framed, TLS, gRPC) and dm-launchpad's C++ Courier.

Makes its own hosts: network namespaces lpbench-s (the server, 10.209.0.2), lpbench-c1 and
lpbench-c2 (clients, 10.209.0.3 and .4) joined by a bridge lpbench0 that has no address in
this namespace, no route out and no NAT, so traffic stays between them. They are removed
at the end, even when a run fails or is interrupted, and at the start if a killed run left
them. A server runs in lpbench-s, a client in lpbench-c1, each a process of its own:

  raw        a bare pickle ping-pong over a TCP socket: the floor for Python on both sides;
  ours       courier.Client(server.address): courier's framed protocol over TCP;
  ours-tls   the same with mutual TLS (Python's ssl);
  ours-grpc  the same server, the client speaking gRPC (relayed to the server's gRPC service);
  dmlp       dm-launchpad 0.5.2 (its interpreter: LAUNCHPAD_BENCH_DMLP_PYTHON).

Workloads: sync (blocking no-op calls, calls/s and p50), futures (64 in flight, calls/s),
echo_1mib (a 1 MiB uint8 array there and back: MB/s of array bytes per round trip; dm-launchpad
echoes bytes, since it never completes a call receiving an array), echo_64mib and echo_1gib
(ours: an array of that size there and back), and fanin (64 clients, 16 threads in each of two
processes on each of lpbench-c1 and lpbench-c2, each thread its own client, calling a method
that sleeps 1 ms: queries/s over a common window). Each run measures every system back to
back; the table shows medians of the runs and the ratios ours/dm-launchpad.

  sudo LAUNCHPAD_BENCH_DMLP_PYTHON=... python benchmarks/hosts_bench.py [--runs 3] [--seconds 3]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
BRIDGE = 'lpbench0'
SUBNET = '10.209.0'
HOSTS = {'lpbench-s': 2, 'lpbench-c1': 3, 'lpbench-c2': 4}  # namespace -> last byte of its IP
SERVER_HOST = 'lpbench-s'
IN_FLIGHT = 64
FANIN_PROCESSES, FANIN_THREADS = 2, 16  # per client host: 2 hosts x 2 x 16 = 64 clients
SYSTEMS = ('raw', 'ours', 'ours-tls', 'ours-grpc', 'dmlp')


# --- the roles, each run as a process inside a namespace ----------------------------------------

def _tls_configs(directory: str):
    import courier  # pylint: disable=import-outside-toplevel
    read = lambda name: pathlib.Path(directory, name).read_bytes()  # noqa: E731
    server = courier.TLSConfig(certificate_chain=read('server.pem'),
                               private_key=read('server.key'), root_certificates=read('ca.pem'))
    client = courier.TLSConfig(certificate_chain=read('client.pem'),
                               private_key=read('client.key'), root_certificates=read('ca.pem'))
    return server, client


def role_serve(system: str, tls_dir: str) -> None:
    """Serves noop, echo, sleep_1ms until stdin closes; prints the port first."""
    if system == 'raw':
        _serve_raw()
        return
    import courier  # pylint: disable=import-outside-toplevel
    if system == 'dmlp':
        server = courier.Server(port=None)
    else:
        tls = _tls_configs(tls_dir)[0] if system == 'ours-tls' else None
        server = courier.Server(host='0.0.0.0', port=0, tls=tls)
    server.Bind('noop', lambda: None)
    server.Bind('echo', lambda value: value)
    server.Bind('sleep_1ms', lambda: time.sleep(0.001))
    server.Start()
    print('PORT', server.port, flush=True)
    sys.stdin.read()
    server.Stop()


def _serve_raw() -> None:
    import pickle  # pylint: disable=import-outside-toplevel
    import socket  # pylint: disable=import-outside-toplevel
    listener = socket.socket()
    listener.bind(('0.0.0.0', 0))
    listener.listen(8)
    print('PORT', listener.getsockname()[1], flush=True)

    def serve(sock):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = sock.makefile('rb')
        while True:
            head = stream.read(8)
            if len(head) < 8:
                return
            value = pickle.loads(stream.read(int.from_bytes(head, 'little')))
            data = pickle.dumps(value, protocol=5)
            sock.sendall(len(data).to_bytes(8, 'little') + data)

    def accept():
        while True:
            sock, _ = listener.accept()
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()


class _RawClient:
    def __init__(self, address: str):
        import socket  # pylint: disable=import-outside-toplevel
        host, port = address.rsplit(':', 1)
        self._sock = socket.create_connection((host, int(port)))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._stream = self._sock.makefile('rb')

    def _call(self, value):
        import pickle  # pylint: disable=import-outside-toplevel
        data = pickle.dumps(value, protocol=5)
        self._sock.sendall(len(data).to_bytes(8, 'little') + data)
        head = self._stream.read(8)
        return pickle.loads(self._stream.read(int.from_bytes(head, 'little')))

    def noop(self):
        return self._call(None)

    def echo(self, value):
        return self._call(value)


def _client(system: str, address: str, tls_dir: str):
    if system == 'raw':
        return _RawClient(address)
    import courier  # pylint: disable=import-outside-toplevel
    tls = _tls_configs(tls_dir)[1] if system == 'ours-tls' else None
    return courier.Client(address, tls=tls, protocol='grpc' if system == 'ours-grpc' else None)


def role_call(system: str, address: str, seconds: float, tls_dir: str) -> None:
    """Prints the sync, futures and echo figures of one client as JSON."""
    client = _client(system, address, tls_dir)
    for _ in range(200):
        client.noop()
    result = {}
    latencies: List[int] = []
    clock = time.perf_counter_ns
    start = now = clock()
    end = start + int(seconds * 1e9)
    while now < end:
        client.noop()
        after = clock()
        latencies.append(after - now)
        now = after
    latencies.sort()
    result['sync'] = len(latencies) / ((now - start) / 1e9)
    result['sync_p50_us'] = latencies[len(latencies) // 2] / 1e3
    if system != 'raw':
        result['futures'] = _futures_rate(client, seconds)
    result['echo_1mib'] = _echo_rate(client, system, 1 << 20, seconds)
    if system in ('ours', 'ours-tls', 'dmlp'):
        result['echo_64mib'] = _echo_rate(client, system, 64 << 20, seconds, at_least=3)
    if system == 'ours':
        result['echo_1gib'] = _echo_rate(client, system, 1 << 30, 0, at_least=1)
    print('RESULT ' + json.dumps(result), flush=True)


def _futures_rate(client, seconds: float) -> float:
    in_flight: collections.deque = collections.deque(
        client.futures.noop() for _ in range(IN_FLIGHT))
    calls = 0
    start = time.perf_counter()
    while True:
        in_flight.popleft().result()
        in_flight.append(client.futures.noop())
        calls += 1
        if calls % IN_FLIGHT == 0 and time.perf_counter() - start >= seconds:
            break
    elapsed = time.perf_counter() - start
    for future in in_flight:
        future.result()
    return calls / elapsed


def _echo_rate(client, system: str, size: int, seconds: float, at_least: int = 1) -> float:
    """MB/s of payload per round trip (1 MB = 10^6 bytes)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    pattern = np.random.default_rng(0).integers(0, 255, min(size, 1 << 20), dtype=np.uint8)
    array = np.tile(pattern, size // pattern.size)
    value = array.tobytes() if system in ('dmlp', 'raw') else array
    back = client.echo(value)  # warm up, and check
    if len(back) != size or bytes(memoryview(back)[-64:]) != array[-64:].tobytes():
        raise AssertionError(f'{system}: the echo of {size} bytes came back wrong')
    del back
    calls, start = 0, time.perf_counter()
    while calls < at_least or time.perf_counter() - start < seconds:
        client.echo(value)
        calls += 1
    return size * calls / (time.perf_counter() - start) / 1e6


def role_fanin(system: str, address: str, threads: int) -> None:
    """Runs ``threads`` clients calling sleep_1ms; counts calls that end inside the window the
    driver sends on stdin ('start end', wall-clock seconds)."""
    clients = [_client(system, address, '') for _ in range(threads)]
    for client in clients:
        client.sleep_1ms()
    print('READY', flush=True)
    start, end = map(float, sys.stdin.readline().split())
    counts = [0] * threads

    def work(index: int) -> None:
        client = clients[index]
        while time.time() < start:
            time.sleep(0.0005)
        while True:
            client.sleep_1ms()
            now = time.time()
            if now > end:
                return
            counts[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print('COUNT', sum(counts), flush=True)


# --- the hosts --------------------------------------------------------------------------------

def _ip(namespace: str) -> str:
    return f'{SUBNET}.{HOSTS[namespace]}'


def _run(*argv: str, check: bool = True) -> None:
    subprocess.run(argv, check=check, capture_output=True, text=True)


def hosts_down() -> None:
    """Removes the namespaces (ending what runs in them) and the bridge; quiet if absent."""
    for namespace in HOSTS:
        pids = subprocess.run(['ip', 'netns', 'pids', namespace], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _run('ip', 'netns', 'del', namespace, check=False)
    _run('ip', 'link', 'del', BRIDGE, check=False)


def hosts_up() -> None:
    hosts_down()
    _run('ip', 'link', 'add', BRIDGE, 'type', 'bridge')
    _run('ip', 'link', 'set', BRIDGE, 'up')
    for namespace in HOSTS:
        veth = 'lpb' + namespace.rsplit('-', 1)[1]
        _run('ip', 'netns', 'add', namespace)
        _run('ip', 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns',
             namespace)
        _run('ip', 'link', 'set', veth, 'master', BRIDGE, 'up')
        _run('ip', '-n', namespace, 'addr', 'add', f'{_ip(namespace)}/24', 'dev', 'eth0')
        _run('ip', '-n', namespace, 'link', 'set', 'eth0', 'up')
        _run('ip', '-n', namespace, 'link', 'set', 'lo', 'up')


# --- the driver -------------------------------------------------------------------------------

class Driver:
    """Starts roles in the namespaces, with the interpreter and path of the system measured."""

    def __init__(self, dmlp_python: Optional[str], tls_dir: str, scratch: str):
        self._dmlp = dmlp_python
        self.tls_dir = tls_dir
        self._scratch = scratch
        self._processes: List[subprocess.Popen] = []

    def start(self, namespace: str, system: str, *args: str) -> subprocess.Popen:
        python = self._dmlp if system == 'dmlp' else sys.executable
        env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
        if system != 'dmlp':  # dm-launchpad's courier has the same name as ours
            env['PYTHONPATH'] = str(REPO)
        env.update(MALLOC_TOP_PAD_='67108864', TF_CPP_MIN_LOG_LEVEL='3',
                   GRPC_VERBOSITY='ERROR')
        process = subprocess.Popen(
            ['ip', 'netns', 'exec', namespace, python, '-u', __file__, 'role', *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=self._scratch, env=env)
        self._processes.append(process)
        return process

    def end_all(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        self._processes.clear()

    def serve(self, system: str) -> tuple:
        server = self.start(SERVER_HOST, system, 'serve', system, self.tls_dir)
        line = _line_starting(server, 'PORT', 120)
        return server, f'{_ip(SERVER_HOST)}:{line.split()[1]}'

    def measure(self, system: str, seconds: float) -> Dict[str, float]:
        server, address = self.serve(system)
        try:
            client = self.start('lpbench-c1', system, 'call', system, address, str(seconds),
                                self.tls_dir)
            line = _line_starting(client, 'RESULT', 600)
            return json.loads(line[len('RESULT '):])
        finally:
            server.stdin.close()
            self.end_all()

    def fanin(self, system: str, seconds: float) -> float:
        server, address = self.serve('ours' if system == 'ours-grpc' else system)
        try:
            clients = [self.start(host, system, 'fanin', system, address, str(FANIN_THREADS))
                       for host in ('lpbench-c1', 'lpbench-c2')
                       for _ in range(FANIN_PROCESSES)]
            for client in clients:
                _line_starting(client, 'READY', 180)
            start = time.time() + 0.5
            for client in clients:
                client.stdin.write(f'{start} {start + seconds}\n')
                client.stdin.flush()
            total = sum(int(_line_starting(client, 'COUNT', 120).split()[1])
                        for client in clients)
            return total / seconds
        finally:
            server.stdin.close()
            self.end_all()


def _line_starting(process: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The first line of ``process``'s output starting with ``prefix`` (others are skipped)."""
    result: List[str] = []

    def read():
        for line in process.stdout:
            if line.startswith(prefix):
                result.append(line.strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not result:
        process.kill()
        raise RuntimeError(f'no {prefix} line from {process.args[3:]}; stderr:\n'
                           f'{process.stderr.read()[-3000:]}')
    return result[0]


def _write_certificates(directory: str) -> None:
    sys.path.insert(0, str(REPO))
    from tests.pki import Pki  # pylint: disable=import-outside-toplevel
    pki = Pki(ips=[_ip(SERVER_HOST)])
    for name, data in (('ca.pem', pki.ca_pem), ('server.pem', pki.server_pem),
                       ('server.key', pki.server_key), ('client.pem', pki.client_pem),
                       ('client.key', pki.client_key)):
        pathlib.Path(directory, name).write_bytes(data)


ROWS = [  # (label, system key in the results, metric, unit)
    ('sync calls/s', 'sync', '{:,.0f}'),
    ('sync p50, us', 'sync_p50_us', '{:,.0f}'),
    ('futures calls/s, 64 in flight', 'futures', '{:,.0f}'),
    ('1 MiB echo, MB/s', 'echo_1mib', '{:,.0f}'),
    ('64 MiB echo, MB/s', 'echo_64mib', '{:,.0f}'),
    ('1 GiB echo, MB/s', 'echo_1gib', '{:,.0f}'),
    ('64 clients on 2 hosts, 1 ms method, queries/s', 'fanin', '{:,.0f}'),
]


def table(runs: List[Dict[str, Dict[str, float]]]) -> str:
    systems = [s for s in SYSTEMS if any(s in run for run in runs)]
    lines = ['| between two hosts | ' + ' | '.join(systems) + ' | ours / dmlp | ours-tls / dmlp |'
             ' TLS / plaintext |',
             '|---|' + '---:|' * (len(systems) + 3)]
    for label, metric, fmt in ROWS:
        medians = {}
        for system in systems:
            values = [run[system][metric] for run in runs
                      if metric in run.get(system, {})]
            if values:
                medians[system] = statistics.median(values)
        if not medians:
            continue
        cells = [fmt.format(medians[s]) if s in medians else '-' for s in systems]

        def ratio(a, b):
            return f'{medians[a] / medians[b]:.2f}x' if a in medians and b in medians else '-'

        lines.append(f'| {label} | ' + ' | '.join(cells) +
                     f' | {ratio("ours", "dmlp")} | {ratio("ours-tls", "dmlp")} |'
                     f' {ratio("ours-tls", "ours")} |')
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--systems', default=','.join(SYSTEMS))
    parser.add_argument('--no-fanin', action='store_true')
    parser.add_argument('--json', help='also write every run here')
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit('hosts_bench.py makes network namespaces: run it as root')
    systems = args.systems.split(',')
    dmlp = os.environ.get('LAUNCHPAD_BENCH_DMLP_PYTHON')
    if 'dmlp' in systems and not dmlp:
        print('dm-launchpad skipped: LAUNCHPAD_BENCH_DMLP_PYTHON is not set', file=sys.stderr)
        systems.remove('dmlp')
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the hosts come down
    load = os.getloadavg()[0]
    scratch = tempfile.mkdtemp(prefix='hosts-bench-')
    runs: List[Dict[str, Dict[str, float]]] = []
    driver = Driver(dmlp, scratch, scratch)
    try:
        _write_certificates(scratch)
        hosts_up()
        for number in range(args.runs):
            run: Dict[str, Dict[str, float]] = {}
            for system in systems:
                print(f'run {number + 1}/{args.runs}: {system} ...', file=sys.stderr, flush=True)
                run[system] = driver.measure(system, args.seconds)
                if not args.no_fanin and system in ('ours', 'dmlp'):
                    run[system]['fanin'] = driver.fanin(system, args.seconds)
            runs.append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
    finally:
        driver.end_all()
        hosts_down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f'load average before: {load:.2f}; medians of {len(runs)} runs, '
          f'{args.seconds:g} s per figure')
    print(table(runs))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == '__main__':
    if sys.argv[1:2] == ['role']:
        role, *rest = sys.argv[2:]
        if role == 'serve':
            role_serve(rest[0], rest[1])
        elif role == 'call':
            role_call(rest[0], rest[1], float(rest[2]), rest[3])
        else:
            role_fanin(rest[0], rest[1], int(rest[2]))
    else:
        main()
