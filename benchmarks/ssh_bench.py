"""Measures the ssh launcher side by side with local_mp on this machine.

  launch      seconds from `lp.launch` until all 12 nodes (3 hosts x 4 nodes; local_mp: 12
              processes) run, and from `stop()` until every node has ended (median of runs);
  sync        courier calls/s of back-to-back blocking no-op calls from a node on one host to a
              server on another (local_mp: between two processes over a Unix socket);
  futures     the same with 64 calls in flight through client.futures.

By default it brings up the SSH test bed (hosts lp-h1..3 in network namespaces; needs root and
the packages of tests/testbeds/install_packages.sh) and takes it down at the end. To measure
real machines instead, name three hosts that run this launchpad:

  sudo python benchmarks/ssh_bench.py [--runs 3] [--seconds 3]
  python benchmarks/ssh_bench.py --hosts a,b,c --python /opt/venv/bin/python
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import launchpad as lp  # pylint: disable=wrong-import-position

FUTURES_IN_FLIGHT = 64


def idle() -> None:
    lp.wait_for_stop()


class Sink:
    def noop(self) -> None:
        return None


def call_rates(sink, seconds: float) -> None:
    """Prints the sync and pipelined call rates to `sink`, then stops the program."""
    for _ in range(200):  # warm up the connection
        sink.noop()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sink.noop()
        calls += 1
    sync = calls / (time.perf_counter() - start)
    in_flight = [sink.futures.noop() for _ in range(FUTURES_IN_FLIGHT)]
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        in_flight.pop(0).result()
        in_flight.append(sink.futures.noop())
        calls += 1
    futures = calls / (time.perf_counter() - start)
    for future in in_flight:
        future.result()
    print('RESULT ' + json.dumps({'sync': sync, 'futures': futures}), flush=True)
    lp.stop()


def measure_launch(launch_type: str, resources: Optional[Dict], runs: int) -> Dict[str, float]:
    starts, stops = [], []
    for _ in range(runs):
        program = lp.Program('launch_bench')
        with program.group('node'):
            for _ in range(12):
                program.add_node(lp.PyNode(idle))
        began = time.perf_counter()
        controller = lp.launch(program, launch_type=launch_type, resources=resources)
        while not all(s.state is lp.NodeState.RUNNING for s in controller.status().values()):
            if controller.done:
                controller.wait()  # raises the failure
                raise RuntimeError('the program ended before all its nodes ran')
            time.sleep(0.01)
        starts.append(time.perf_counter() - began)
        began = time.perf_counter()
        controller.stop()
        stops.append(time.perf_counter() - began)
    return {'start': statistics.median(starts), 'stop': statistics.median(stops)}


def measure_rpc(launch_type: str, resources: Optional[Dict], seconds: float) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as logs:
        os.environ['LAUNCHPAD_LOGGING_DIR'] = logs
        program = lp.Program('rpc_bench')
        sink = program.add_node(lp.CourierNode(Sink), label='server')
        program.add_node(lp.PyNode(call_rates, sink, seconds), label='client')
        controller = lp.launch(program, launch_type=launch_type, resources=resources,
                               terminal='output_to_files')
        controller.wait()
        log = next(pathlib.Path(logs).glob('rpc_bench-*/client_0.log')).read_text()
        del os.environ['LAUNCHPAD_LOGGING_DIR']
    return json.loads(log.split('RESULT ', 1)[1].splitlines()[0])


@contextlib.contextmanager
def bed_hosts(args) -> Iterator[List[lp.SshHost]]:
    """The hosts to measure: --hosts, or the SSH test bed for the duration."""
    if args.hosts:
        yield [lp.SshHost(name, python=args.python, env=args.env) for name in args.hosts]
        return
    from tests import testbeds  # pylint: disable=import-outside-toplevel
    with testbeds.ssh_hosts(3) as bed:
        pythonpath = os.pathsep.join(filter(None, [os.environ.get('PYTHONPATH'), str(REPO)]))
        yield [lp.SshHost(h.name, python=h.python, ssh_options=['-F', h.ssh_config],
                          env={'PYTHONPATH': pythonpath}) for h in bed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--hosts', type=lambda s: s.split(','), help='three ssh hosts, a,b,c')
    parser.add_argument('--python', default='python3', help='interpreter on --hosts')
    parser.add_argument('--pythonpath', help='PYTHONPATH on --hosts')
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=3.0)
    args = parser.parse_args()
    args.env = {'PYTHONPATH': args.pythonpath} if args.pythonpath else {}

    with bed_hosts(args) as hosts:
        if len(hosts) < 3:
            parser.error('--hosts needs three hosts')
        ssh_launch = measure_launch('ssh', {'node': lp.SshHosts(hosts[:3])}, args.runs)
        local_launch = measure_launch('local_mp', None, args.runs)
        ssh_rpc = measure_rpc('ssh', {'server': hosts[0], 'client': hosts[1]}, args.seconds)
        local_rpc = measure_rpc('local_mp', None, args.seconds)

    print(f'{"":28} {"ssh":>10} {"local_mp":>10} {"ssh/local_mp":>13}')
    rows = [('launch 12 nodes: start (s)', ssh_launch['start'], local_launch['start']),
            ('launch 12 nodes: stop (s)', ssh_launch['stop'], local_launch['stop']),
            ('rpc sync (calls/s)', ssh_rpc['sync'], local_rpc['sync']),
            (f'rpc {FUTURES_IN_FLIGHT} in flight (calls/s)', ssh_rpc['futures'],
             local_rpc['futures'])]
    for name, ssh_value, local_value in rows:
        print(f'{name:28} {ssh_value:10.2f} {local_value:10.2f} {ssh_value / local_value:13.2f}')


if __name__ == '__main__':
    main()
