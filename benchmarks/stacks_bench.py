"""How fast `python -m launchpad.launch stacks` answers for a 32-node local_mp program, and what
answering costs the nodes.

Launches a program of N PyNodes (default 32) in a launching process of its own, with a private
registry, half of them spinning in Python (each counting its loop's rounds with `lp.report`),
half blocked waiting for the stop; once every node has fetched a probe, it measures:

  probe      seconds from asking the observer for every node's stacks to having them all
             (courier round trip to the observer included), over --repeat asks: median, max
  command    wall seconds of the whole `python -m launchpad.launch stacks PROGRAM` (an
             interpreter's start and imports included), median of a few
  live       how many nodes answered live in each ask (all, unless the machine is swamped)
  slowing    the spinning nodes' loop rate while stacks are asked back to back, over their rate
             while nobody asks (1.00: no slowing); rounds alternate
  idle cpu   CPU % of one blocked node's process over a few seconds (its probe thread, metric
             reports and stop watch together)

    python benchmarks/stacks_bench.py [--nodes 32] [--repeat 20]

Numbers move with the load of the machine; the ratio and the medians move least.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]

PROGRAM = '''
import sys, time
import launchpad as lp

def spin():
    rounds = 0
    while not lp.wait_for_stop(0):
        for _ in range(2000):
            pass
        rounds += 1
        if rounds % 50 == 0:
            lp.count(rounds=50)

def rest():
    lp.wait_for_stop()

program = lp.Program('stacks-bench')
for i in range(int(sys.argv[1])):
    program.add_node(lp.PyNode(spin if i % 2 == 0 else rest), label='spin' if i % 2 == 0 else 'rest')
lp.launch(program, launch_type='local_mp')
'''


def _rounds(client) -> float:
    """The spinning nodes' rounds so far, as last reported."""
    values = client.sample()['values']
    return sum(reported['rounds'][1] for reported in values.values() if 'rounds' in reported)


def _rate(client, seconds: float, asking: bool) -> float:
    """Rounds per second of all spinning nodes over `seconds`, with stacks asked back to back
    meanwhile if `asking`."""
    time.sleep(1.2)  # a fresh report
    before, started = _rounds(client), time.monotonic()
    while time.monotonic() - started < seconds:
        if asking:
            client.probe(['stacks'])
        else:
            time.sleep(0.05)
    time.sleep(1.2)
    return (_rounds(client) - before) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--nodes', type=int, default=32)
    parser.add_argument('--repeat', type=int, default=20)
    args = parser.parse_args()
    import courier  # pylint: disable=import-outside-toplevel
    from launchpad.observe import registry  # pylint: disable=import-outside-toplevel
    runtime = tempfile.mkdtemp(prefix='lp-stacks-bench-')
    os.environ[registry.ENV] = runtime
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
        filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))}
    script = pathlib.Path(runtime) / 'program.py'
    script.write_text(PROGRAM)
    launcher = subprocess.Popen([sys.executable, str(script), str(args.nodes)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        while not registry.entries():
            time.sleep(0.2)
        entry = registry.entries()[0]
        client = courier.Client(entry.address, auth_token=entry.token, call_timeout=60)
        while not all(answer.get('live') for answer in client.probe(['stacks'])['nodes'].values()):
            time.sleep(0.5)
        times, live = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            probed = client.probe(['stacks'])
            times.append(time.perf_counter() - started)
            live.append(sum(bool(answer.get('live')) for answer in probed['nodes'].values()))
        commands = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([sys.executable, '-m', 'launchpad.launch', 'stacks', entry.id],
                           env=env, stdout=subprocess.DEVNULL, check=True)
            commands.append(time.perf_counter() - started)
        ratios = []
        for index in range(4):
            order = (True, False) if index % 2 == 0 else (False, True)
            rates = {asking: _rate(client, 3.0, asking) for asking in order}
            ratios.append(rates[True] / rates[False])
        rest = next(row['pid'] for row in client.view()['nodes'] if row['name'] == 'rest/1')
        process = psutil.Process(rest)
        before, started = sum(process.cpu_times()[:2]), time.monotonic()
        time.sleep(5)
        idle = (sum(process.cpu_times()[:2]) - before) / (time.monotonic() - started) * 100
        print(f'{args.nodes} nodes, local_mp, {os.cpu_count()} cores, load '
              f'{os.getloadavg()[0]:.1f}')
        print(f'probe of all stacks: median {statistics.median(times):.3f} s, max '
              f'{max(times):.3f} s over {len(times)}; nodes live per probe: min {min(live)} '
              f'of {args.nodes}')
        print(f'`stacks` command, whole (interpreter start included): median '
              f'{statistics.median(commands):.2f} s')
        print(f'spinning nodes, rate while stacks are asked back to back / rate without: '
              f'{" ".join(f"{r:.3f}" for r in ratios)} (median {statistics.median(ratios):.3f})')
        print(f'idle node CPU: {idle:.2f} %')
        client.stop('the benchmark')
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait()
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == '__main__':
    main()
