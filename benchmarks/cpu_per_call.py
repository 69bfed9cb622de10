"""CPU time a blocking call costs on each side, on one host: ours, dm-launchpad, raw pickle.

The CPU a call takes (user plus system time, from ``os.times()`` in the client and the
server process's own counters read around the same calls; "of it kernel": the system time
of both) depends less on how loaded the machine is than calls/s do. For each system a server process serves a no-op and a client
process makes 20,000 blocking calls of it after a warm-up:

  raw        a bare pickle ping-pong over a TCP socket on loopback (hosts_bench.py's);
  ours-unix  courier on a Unix socket (what nodes of one host use);
  ours-tcp   courier's framed protocol over TCP on loopback;
  dmlp       dm-launchpad 0.5.2's C++ Courier on loopback (its interpreter:
             LAUNCHPAD_BENCH_DMLP_PYTHON, benchmarks/README.md; skipped without it).

Usage: python benchmarks/cpu_per_call.py [--calls 20000] [--systems raw ours-unix ...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Dict, Optional, Sequence

import psutil

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
SYSTEMS = ('raw', 'ours-unix', 'ours-tcp', 'dmlp')
_WARM_UP = 1000


def role_serve(system: str, address: str) -> None:
    """Serves ``noop`` until stdin closes; prints the address to call first."""
    import hosts_bench  # pylint: disable=import-outside-toplevel
    if system == 'raw':
        hosts_bench._serve_raw()  # pylint: disable=protected-access  (prints PORT)
        return
    import courier  # pylint: disable=import-outside-toplevel
    if system == 'dmlp':
        server = courier.Server(port=None)
    elif system == 'ours-unix':
        server = courier.Server(address=address)
    else:
        server = courier.Server(port=0)
    server.Bind('noop', lambda: None)
    server.Start()
    print('ADDRESS', address if system == 'ours-unix' else f'localhost:{server.port}', flush=True)
    sys.stdin.read()
    server.Stop()


def role_call(system: str, address: str, calls: int) -> None:
    """Warms up, says READY, waits for a line, makes ``calls`` calls and prints its CPU."""
    if system == 'raw':
        import hosts_bench  # pylint: disable=import-outside-toplevel
        client = hosts_bench._RawClient(address)  # pylint: disable=protected-access
    else:
        import courier  # pylint: disable=import-outside-toplevel
        client = courier.Client(address)
    for _ in range(_WARM_UP):
        client.noop()
    print('READY', flush=True)
    sys.stdin.readline()
    before, start = os.times(), time.perf_counter()
    for _ in range(calls):
        client.noop()
    after, wall = os.times(), time.perf_counter() - start
    print(json.dumps({'user': after.user - before.user, 'system': after.system - before.system,
                      'wall': wall}), flush=True)


def end_all(processes: Sequence[subprocess.Popen], timeout: float = 10.0) -> None:
    """Ends role processes, which exit once their stdin closes; kills any that has not
    after ``timeout`` seconds."""
    for process in processes:
        process.stdin.close()
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def measure(system: str, python: str, calls: int) -> Dict[str, float]:
    env = dict(os.environ)
    if system == 'dmlp':  # dm-launchpad's courier has our package's name: keep ours off its path.
        env.pop('PYTHONPATH', None)
    else:
        env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO), env.get('PYTHONPATH')]))
    with tempfile.TemporaryDirectory(prefix='cpu-call-') as scratch:
        server = subprocess.Popen(
            [python, __file__, '--role', 'serve', '--system', system, '--address',
             f'unix:{scratch}/s'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env, cwd=scratch)
        client = None
        try:
            while True:
                line = server.stdout.readline()
                if not line:
                    raise RuntimeError(f'the {system} server ended before serving')
                if line.startswith(('ADDRESS', 'PORT')):
                    break
            word, value = line.split()
            address = f'localhost:{value}' if word == 'PORT' else value
            client = subprocess.Popen(
                [python, __file__, '--role', 'call', '--system', system, '--address', address,
                 '--calls', str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, env=env, cwd=scratch)
            assert client.stdout.readline().strip() == 'READY'
            served = psutil.Process(server.pid)
            before = served.cpu_times()
            client.stdin.write('go\n')
            client.stdin.flush()
            numbers = json.loads(client.stdout.readline())
            after = served.cpu_times()
        finally:
            end_all([process for process in (client, server) if process is not None])
    server_cpu = (after.user - before.user) + (after.system - before.system)
    client_cpu = numbers['user'] + numbers['system']
    kernel = numbers['system'] + (after.system - before.system)
    return {'client_us': 1e6 * client_cpu / calls, 'server_us': 1e6 * server_cpu / calls,
            'both_us': 1e6 * (client_cpu + server_cpu) / calls,
            'both_kernel_us': 1e6 * kernel / calls,
            'calls_per_s': calls / numbers['wall']}


def _python(system: str) -> Optional[str]:
    return os.environ.get('LAUNCHPAD_BENCH_DMLP_PYTHON') if system == 'dmlp' else sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--calls', type=int, default=20000)
    parser.add_argument('--systems', nargs='+', choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument('--role', choices=('serve', 'call'), help=argparse.SUPPRESS)
    parser.add_argument('--system', help=argparse.SUPPRESS)
    parser.add_argument('--address', help=argparse.SUPPRESS)
    parser.add_argument('--json', help='also write the numbers to this file')
    args = parser.parse_args()
    if args.role == 'serve':
        role_serve(args.system, args.address)
        return
    if args.role == 'call':
        role_call(args.system, args.address, args.calls)
        return
    results = {}
    print(f'{"":10} {"client us":>10} {"server us":>10} {"both us":>8} {"of it kernel":>13} '
          f'{"calls/s":>9}  (CPU per call)')
    for system in args.systems:
        python = _python(system)
        if not python:
            results[system] = 'skipped: LAUNCHPAD_BENCH_DMLP_PYTHON is not set'
            print(f'{system:10} {results[system]}')
            continue
        numbers = results[system] = measure(system, python, args.calls)
        print(f'{system:10} {numbers["client_us"]:10.1f} {numbers["server_us"]:10.1f} '
              f'{numbers["both_us"]:8.1f} {numbers["both_kernel_us"]:13.1f} '
              f'{numbers["calls_per_s"]:9,.0f}', flush=True)
    dm = results.get('dmlp')
    if isinstance(dm, dict):
        for system in ('ours-unix', 'ours-tcp', 'raw'):
            if isinstance(results.get(system), dict):
                print(f'{system} / dmlp, CPU per call (both sides): '
                      f'{results[system]["both_us"] / dm["both_us"]:.2f}')
    if args.json:
        with open(args.json, 'w') as out:
            json.dump(results, out, indent=2)


if __name__ == '__main__':
    main()
