"""How a detached program survives its supervisor, per launcher: seconds from the supervisor's
SIGKILL to a re-adopted program whose `status` answers, the longest gap in a node's served calls
meanwhile, and what detaching costs at launch.

It launches the program of tests/launch/detached_program.py (a caller node calling a counter node
all the time, and an idle worker), detached, --rounds times, and each time

  launch       seconds from `lp.launch(..., detach=True)` until it returned (every node runs);
               the same program launched attached (`lp.launch` without detach), until every node
               runs, is the baseline (attached local_mp forks nodes from its fork server; a
               detached program's nodes are fresh interpreters, which must not end with it);
  re-adoption  SIGKILL of the supervisor, then seconds until a new supervisor (started by the
               program's keeper) has registered and answered `node_status`;
  longest gap  the longest time between two calls the counter served, before the kill and over
               the kill and the re-adoption (the caller calls every 10 ms).

With --ssh it measures the same on the SSH test bed (as root; see benchmarks/ssh_bench.py), on
three hosts, the supervisor on the first: re-adoption until the new supervisor answers on its
host (its keeper started it there; its agents on the three hosts were reached again through
ssh), and until `status` answers on this machine (`lp.attach`'s controller, which opens a new
ssh tunnel to it). Slurm and Kubernetes are not measured here.

  python benchmarks/recover_bench.py [--rounds 3] [--ssh]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import courier  # pylint: disable=wrong-import-position
import launchpad as lp  # pylint: disable=wrong-import-position
from launchpad.observe import registry  # pylint: disable=wrong-import-position
from tests.launch.detached_program import Counter, make_program  # pylint: disable=wrong-import-position


def _all_running(controller) -> bool:
    return all(s.state is lp.NodeState.RUNNING for s in controller.status().values())


def attached_launch(directory: str) -> float:
    started = time.monotonic()
    controller = lp.launch(make_program(os.path.join(directory, 'attached.json'), 'attached'),
                           launch_type='local_mp', terminal='output_to_files')
    while not _all_running(controller):
        time.sleep(0.01)
    took = time.monotonic() - started
    controller.stop()
    return took


def readoption(program_id: str, old_pid: int, runtime_dir: str = '') -> float:
    """SIGKILLs supervisor `old_pid`; seconds until a new one answers (registered in
    `runtime_dir`, a host's registry, default this machine's)."""
    killed = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    while True:
        entry = next((e for e in registry.entries() if e.id == program_id), None)
        if runtime_dir:
            try:
                with open(os.path.join(runtime_dir, f'{program_id}.json')) as f:
                    entry = registry.Entry(**json.load(f))
            except (OSError, ValueError):
                entry = None
        if entry is not None and entry.pid != old_pid:
            try:
                courier.Client(entry.address, auth_token=entry.token, call_timeout=5,
                               wait_for_ready=False).node_status()
                return time.monotonic() - killed
            except courier.CourierError:
                pass
        time.sleep(0.005)


def served_over_readoption(controller, counter: str, runtime_dir: str = '') -> Dict[str, float]:
    """Kills the supervisor of `controller`'s program once its counter served two seconds of
    calls; the re-adoption's times, node restarts and the longest gaps in served calls."""
    while Counter.read(counter)['calls'] < 200:  # two seconds of calls
        time.sleep(0.05)
    before = Counter.read(counter)['longest_gap']
    killed = time.monotonic()
    took = readoption(controller.id, controller.supervisor['pid'], runtime_dir)
    restarts = sum(s.restarts for s in controller.status().values())
    answered = time.monotonic() - killed  # (this machine's `status`)
    time.sleep(1.0)  # calls go on; the counter writes every 50 ms
    return {'readoption': took, 'status': answered, 'gap_before': before,
            'gap_through': Counter.read(counter)['longest_gap'], 'restarts': restarts}


def round_(directory: str, index: int) -> Dict[str, float]:
    counter = os.path.join(directory, f'counter{index}.json')
    started = time.monotonic()
    controller = lp.launch(make_program(counter, f'recover{index}'), launch_type='local_mp',
                           detach=True)
    launch = time.monotonic() - started
    try:
        return {'launch': launch, **served_over_readoption(controller, counter)}
    finally:
        controller.stop()


def ssh_rounds(directory: str, rounds: int) -> Tuple[List[Dict[str, float]], List[float]]:
    """The rounds on the bed's three hosts (their registry in a directory of `directory`, which
    they share with this machine), and the attached launches."""
    from benchmarks.ssh_bench import bed_hosts  # pylint: disable=import-outside-toplevel
    runtime_dir = tempfile.mkdtemp(prefix='lpb-')  # (a short path: the sockets' are limited)
    rows: List[Dict[str, float]] = []
    attached: List[float] = []
    try:
        with bed_hosts(argparse.Namespace(hosts=None)) as hosts:
            hosts = [dataclasses.replace(host, env={**host.env, registry.ENV: runtime_dir})
                     for host in hosts]
            resources = {'counter': hosts[0], 'caller': hosts[1], 'worker': hosts[2]}
            for index in range(rounds):
                for how in ('attached', 'detached'):
                    counter = os.path.join(directory, f'{how}{index}.json')
                    started = time.monotonic()
                    controller = lp.launch(make_program(counter, how), launch_type='ssh',
                                           resources=resources, terminal='output_to_files',
                                           detach=how == 'detached')
                    while not _all_running(controller):
                        time.sleep(0.01)
                    launch = time.monotonic() - started
                    try:
                        if how == 'attached':
                            attached.append(launch)
                        else:
                            rows.append({'launch': launch, **served_over_readoption(
                                controller, counter, runtime_dir)})
                    finally:
                        controller.stop()
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
    return rows, attached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--ssh', action='store_true', help='measure ssh launches on the bed')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        os.environ.setdefault('LAUNCHPAD_LOGGING_DIR', os.path.join(directory, 'logs'))
        if args.ssh:
            rows, attached = ssh_rounds(directory, args.rounds)
        else:
            rows, attached = [], []
            for index in range(args.rounds):
                attached.append(attached_launch(directory))
                rows.append(round_(directory, index))
    median = lambda key: statistics.median(row[key] for row in rows)  # noqa: E731
    worst = lambda key: max(row[key] for row in rows)  # noqa: E731
    print(f'{"ssh, 3 hosts" if args.ssh else "local_mp"}, {args.rounds} rounds '
          '(median / worst):')
    print(f'  re-adoption after SIGKILL of the supervisor: {median("readoption"):.2f} s / '
          f'{worst("readoption"):.2f} s until the new one answered; `status` here answered '
          f'after {median("status"):.2f} s / {worst("status"):.2f} s; node restarts: '
          f'{sum(r["restarts"] for r in rows):g}')
    print(f'  longest gap in served calls: {median("gap_before") * 1e3:.0f} ms / '
          f'{worst("gap_before") * 1e3:.0f} ms before the kill, '
          f'{median("gap_through") * 1e3:.0f} ms / {worst("gap_through") * 1e3:.0f} ms over '
          'the kill and the re-adoption')
    print(f'  launch until every node runs: detached {median("launch"):.2f} s / '
          f'{worst("launch"):.2f} s, attached {statistics.median(attached):.2f} s / '
          f'{max(attached):.2f} s (ratio {median("launch") / statistics.median(attached):.2f})')


if __name__ == '__main__':
    main()
