"""What keeping a run in its SQLite file costs (launchpad/observe/runstore.py).

Writes SECONDS samples of a NODES-node program (each node: the five numbers the observer adds and
VALUES reported values, every second) as the recorder's thread does, then reads them back as the
dashboard does: the whole run thinned to 600 points a series, the last 10 s (its live poll each
second) and a 100 s zoom. The writes run on the recorder's thread of the launching process, never
on a node's. Prints the times and the file's size.

    python benchmarks/runstore_cost.py [--nodes 32] [--seconds 1800] [--values 5]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

from launchpad.observe import runstore


def _sample(second: int, nodes: int, values: int) -> dict:
    rows = [{'name': f'actor/{i}', 'state': 'running', 'host': 'h', 'pid': i, 'restarts': 0,
             'error': None, 'calls_per_s': 100.0 + second % 7, 'errors_per_s': 0.0,
             'cpu_percent': 50.0 + second % 5, 'rss_bytes': 3e8, 'threads': 8.0}
            for i in range(nodes)]
    reported = {f'actor/{i}': {f'value_{j}': ['gauge', float(second * j), float(second)]
                               for j in range(values)} for i in range(nodes)}
    return {'time': float(second), 'ended': False, 'stop_reason': None, 'nodes': rows,
            'edges': [], 'values': reported, 'failures': {}, 'scaling': []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nodes', type=int, default=32)
    parser.add_argument('--seconds', type=int, default=1800)
    parser.add_argument('--values', type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = pathlib.Path(scratch) / 'run'
        writer = runstore.RunWriter(directory, {
            'id': 'run', 'name': 'bench', 'launch_type': 'local_mp', 'host': 'h', 'pid': 1,
            'started': 0.0, 'nodes': [], 'edges': []})
        spent = 0.0
        for second in range(args.seconds):
            sample = _sample(second, args.nodes, args.values)
            began = time.perf_counter()
            writer.write([sample])
            spent += time.perf_counter() - began
        writer.close()
        path = directory / runstore.FILE
        rows = args.seconds * args.nodes * (len(runstore.NODE_METRICS) + args.values)
        print(f'{args.nodes} nodes, {args.seconds} s, {rows} metric rows, '
              f'{os.path.getsize(path) / 1e6:.1f} MB; load average {os.getloadavg()[0]:.1f}')
        print(f'write one sample (the recorder thread): {spent / args.seconds * 1e3:.2f} ms')
        connection = runstore.connect(path)
        end = float(args.seconds - 1)
        for what, start, stop, points in (('the whole run, 600 points a series', None, None, 600),
                                          ('the last 10 s, every row (live poll)', end - 10,
                                           None, 0),
                                          ('a 100 s zoom, 800 points', end / 2, end / 2 + 100,
                                           800)):
            began = time.perf_counter()
            runstore.read_series(connection, start, stop, points)
            print(f'read {what}: {(time.perf_counter() - began) * 1e3:.0f} ms')
        connection.close()


if __name__ == '__main__':
    main()
