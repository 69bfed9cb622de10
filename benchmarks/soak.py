"""Soak: a long run of mixed courier traffic on local_mp, watching every process's resources.

The program (local_mp, one process per node):

    service     CourierNode(Service): echo, sleep, a 1 MiB array             never restarts
    flaky       MultiProcessingColocation([CourierNode(Service, crash=True)],
                num_retries_on_failure=...): the same methods, but its process
                exits now and then (every 10-40 s) and the colocation restarts it
    driver/0..1 PyNode(drive): threads that, until the program stops,
                  - make blocking calls to service,
                  - start futures, cancelling some and letting some time out,
                  - churn clients: a new client every few calls, closed or just dropped,
                  - call flaky through its restarts (its failures are counted, not fatal),
                  - echo arrays now and then.

This process samples, every ``--interval`` seconds, the resident memory (RSS), open file
descriptors and threads of every process of the program (each node names itself in a
pid file), and writes a CSV and a plot of the three over time (the plot needs matplotlib:
pip install -e '.[plot]'). After a warm-up, flat lines mean no leak: connections, threads and
memory are released as fast as they are made.

    nice python benchmarks/soak.py --minutes 30 --out docs/soak   # docs/soak.csv, docs/soak.png
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import csv
import os
import pickle
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Dict, List

import numpy as np
import psutil

import courier
import launchpad as lp


def _name_process(pid_dir: str, role: str) -> None:
    with open(os.path.join(pid_dir, str(os.getpid())), 'w') as out:
        out.write(role)


class Service:
    """What both servers serve; with ``crash``, the process exits after 10-40 s."""

    def __init__(self, pid_dir: str, role: str, crash: bool = False):
        _name_process(pid_dir, role)
        self._crash = crash
        self._array = np.ones(1 << 18, dtype=np.float32)  # 1 MiB.

    def echo(self, value):
        return value

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def array(self):
        return self._array

    def run(self) -> None:
        if not self._crash:
            lp.wait_for_stop()
            return
        if lp.wait_for_stop(random.uniform(10, 40)):
            return
        os._exit(3)  # pylint: disable=protected-access  (a crash: no cleanup at all)


def drive(service: courier.Client, flaky: courier.Client, pid_dir: str, index: int) -> None:
    """Sends the mix of calls until the program stops; prints its counts every minute."""
    _name_process(pid_dir, f'driver/{index}')
    counts: Dict[str, int] = collections.Counter()
    stop = threading.Event()
    rng = random.Random(index)

    def blocking() -> None:
        while not stop.is_set():
            assert service.echo(7) == 7
            counts['blocking'] += 1
            stop.wait(0.002)

    def futures() -> None:
        while not stop.is_set():
            batch = [service.futures.echo(i) for i in range(32)]
            slow = [service.futures.sleep(0.05) for _ in range(4)]
            for future in batch[::4] + slow[:2]:
                counts['cancelled'] += future.cancel()
            concurrent.futures.wait(batch + slow, timeout=30)
            counts['futures'] += sum(f.done() and not f.cancelled() for f in batch + slow)
            hurried = _with_timeout(service, 0.01)
            try:
                hurried.sleep(0.05)
            except courier.CallTimeoutError:
                counts['timed out'] += 1
            hurried.close()
            stop.wait(0.02)

    def churn() -> None:
        while not stop.is_set():
            client = pickle.loads(pickle.dumps(service))  # A new client of the same server.
            assert client.echo('x') == 'x'
            assert client.futures.echo('y').result(timeout=30) == 'y'
            if rng.random() < 0.5:
                client.close()
            del client  # Otherwise dropped: collected, it releases what it holds.
            counts['clients'] += 1
            stop.wait(0.01)

    def through_restarts() -> None:
        while not stop.is_set():
            try:
                flaky.echo(1)
                flaky.futures.sleep(0.01).result(timeout=30)
                counts['flaky ok'] += 1
            except courier.CourierError:
                counts['flaky failed'] += 1
            stop.wait(0.005)

    def arrays() -> None:
        while not stop.is_set():
            assert service.array().nbytes == 1 << 20
            counts['arrays'] += 1
            stop.wait(0.05)

    threads = [threading.Thread(target=_forever(work, stop), daemon=True)
               for work in (blocking, blocking, futures, churn, through_restarts, arrays)]
    for thread in threads:
        thread.start()
    while not lp.wait_for_stop(60):
        print(f'driver/{index}: {dict(counts)}', flush=True)
    stop.set()
    end = time.monotonic() + 5
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    print(f'driver/{index} done: {dict(counts)}', flush=True)


def _forever(work, stop: threading.Event):
    def run() -> None:
        while not stop.is_set():
            try:
                work()
            except Exception as error:  # pylint: disable=broad-except
                print(f'soak: {work.__name__} failed: {error!r}', flush=True)
                stop.wait(1)
    return run


def _with_timeout(client: courier.Client, seconds: float) -> courier.Client:
    """A client of the same server whose calls time out after ``seconds``."""
    return courier.Client(**dict(client.__getstate__(), call_timeout=seconds))


def make_program(pid_dir: str) -> lp.Program:
    program = lp.Program('soak')
    service = program.add_node(lp.CourierNode(Service, pid_dir, 'service',
                                              courier_client_kwargs={'call_timeout': 60}),
                               label='service')
    flaky_node = lp.CourierNode(Service, pid_dir, 'flaky', crash=True,
                                courier_client_kwargs={'call_timeout': 5})
    flaky = flaky_node.create_handle()
    program.add_node(lp.MultiProcessingColocation([flaky_node], num_retries_on_failure=100_000),
                     label='flaky')
    with program.group('driver'):
        for index in range(2):
            program.add_node(lp.PyNode(drive, service, flaky, pid_dir, index))
    return program


def sample(pid_dir: str, start: float) -> List[dict]:
    """One row per process of the program: its role, RSS, fds and threads now."""
    rows = []
    me = psutil.Process()
    for process in [me] + me.children(recursive=True):
        try:
            with process.oneshot():
                role = _role(pid_dir, process)
                rows.append({'seconds': round(time.monotonic() - start, 1), 'role': role,
                             'pid': process.pid, 'rss_mb': process.memory_info().rss / 2**20,
                             'fds': process.num_fds(), 'threads': process.num_threads()})
        except psutil.Error:
            pass  # Ended meanwhile (a flaky crash).
    return rows


def _role(pid_dir: str, process: psutil.Process) -> str:
    if process.pid == os.getpid():
        return 'launcher'
    try:
        with open(os.path.join(pid_dir, str(process.pid))) as named:
            return named.read()
    except OSError:
        return 'other (fork server, colocation parent)'


def plot(rows: List[dict], path: str, minutes: float) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    by_role: Dict[str, List[dict]] = collections.defaultdict(list)
    for row in rows:
        by_role[row['role']].append(row)
    figure, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for ax, (key, label) in zip(axes, [('rss_mb', 'RSS (MiB)'), ('fds', 'open fds'),
                                       ('threads', 'threads')]):
        for role in sorted(by_role):
            points = by_role[role]
            ax.plot([p['seconds'] / 60 for p in points], [p[key] for p in points], '.',
                    markersize=2, label=role)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc='upper left', fontsize=8, ncol=3, markerscale=5)
    axes[0].set_title(f'courier soak on local_mp, {minutes:g} min: every process of the program')
    axes[-1].set_xlabel('minutes')
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--minutes', type=float, default=30.0)
    parser.add_argument('--interval', type=float, default=5.0, help='seconds between samples')
    parser.add_argument('--out', default='soak', help='writes OUT.csv and OUT.png')
    args = parser.parse_args()
    pid_dir = tempfile.mkdtemp(prefix='lp-soak-')
    rows: List[dict] = []
    start = time.monotonic()
    controller = lp.launch(make_program(pid_dir), launch_type='local_mp')
    try:
        end = start + 60 * args.minutes
        while time.monotonic() < end and not controller.done:
            rows.extend(sample(pid_dir, start))
            time.sleep(args.interval)
        failed = controller.done
    finally:
        controller.stop()
        shutil.rmtree(pid_dir, ignore_errors=True)
    with open(args.out + '.csv', 'w', newline='') as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out + '.png', args.minutes)
    print(f'wrote {args.out}.csv and {args.out}.png ({len(rows)} samples)')
    if failed:
        print('the program ended before the soak did', file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()
