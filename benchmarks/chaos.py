"""Chaos: a learner, N actors and a replay node under injected faults; nothing lost, nothing twice.

    nice python benchmarks/chaos.py --minutes 10 --actors 4        # local_mp, then a table

The program (one process per node; every node restarts on any failure, `progress_deadline` 3 s):

    replay      CourierNode(Replay): per actor, the numbered items not yet consumed, and the
                number it expects next. It checkpoints both every 0.5 s and in its stop handler.
    actor/i     produces a batch every `--pace` s, as an environment would, into an outbox of
                at most `--outbox` items that a thread of its own flushes to the replay, so
                that an unreachable replay delays its items instead of stopping it. The replay
                numbers them: it accepts an insert that starts at the number it expects next,
                and answers every insert with that number, which the actor continues from.
                After an actor's restart, or the replay's (which forgets what came after its
                checkpoint), the actor produces those numbers again.
    learner     samples items numbered past what it has consumed, consumes them (counting
                duplicates: a number it consumed before, and gaps: numbers it never saw) and
                checkpoints what it consumed after every batch; the replay drops items only
                below the cursor the learner checkpointed, so a learner that crashes
                resumes where its checkpoint says, and consumes nothing twice.

Faults, one every `--interval` s at a random node, in turn: SIGKILL; SIGTERM (a preemption: its
stop handlers checkpoint, then it restarts); a hang (the node stops its heartbeat; the watchdog
restarts it after its deadline). The replay is never hung: serving calls is progress.

With `--launch_type ssh` the program runs on the SSH test bed (hosts lp-h1..3 in network
namespaces: needs root and tests/testbeds/install_packages.sh): the replay on lp-h1, the learner
on lp-h2, the actors round-robin on all three; a fourth fault joins the turn: a host cut off the
network for `--cut` s (its link to the bed's bridge goes down, inside the bed only).

Each round runs the program for `--minutes` without faults, then again with them, in this
invocation. Then the actors stop producing, the learner drains the replay, and the run counts:
items lost (acknowledged to an actor, never consumed), items consumed twice, throughput with
faults as a fraction of the fault-free run, seconds from each fault until the node runs
again (its restart, per kind of fault), and restarts for a missed progress deadline (injected
hangs and any other). It logs which host each cut strikes and its nodes, and splits what
throughput fell short by fault: each fault's segment runs until the next fault. `run()` is
what tests/benchmarks/test_chaos.py calls.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Optional, Tuple

import cloudpickle

import launchpad as lp

if __name__ != '__main__':  # imported by a test: nodes carry this module's code with them
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 20          # items an actor inserts per call
SAMPLE_LIMIT = 2000  # items the learner consumes per batch at most
DEADLINE = 3.0      # seconds of silence after which a node counts as hung (by default)
OUTBOX = 20_000     # items an actor may hold that the replay has not accepted (by default)
_HUNG: List[bool] = []  # in a node, [True] once SIGUSR2 told it to stop its heartbeat


def _hang_on_signal() -> None:
    signal.signal(signal.SIGUSR2, lambda signum, frame: _HUNG.append(True))


def _beat() -> None:
    """The node's heartbeat, until it is told to hang."""
    while _HUNG:
        time.sleep(1.0)
    lp.heartbeat()


class Replay:
    """Items per actor until the learner's checkpointed cursor passes them."""

    def __init__(self, actors: int):
        state = lp.load_checkpoint(default=None)
        if state is None:
            state = {'expected': [0] * actors, 'items': [[] for _ in range(actors)],
                     'cursors': [-1] * actors}
        self._lock = threading.Lock()
        self._state = state
        self._accepting = True
        lp.register_stop_handler(self._save)
        threading.Thread(target=self._save_often, daemon=True).start()

    def _save(self) -> None:
        with self._lock:
            lp.save_checkpoint(self._state)

    def _save_often(self) -> None:
        while not lp.wait_for_stop(0.5):
            self._save()

    def insert(self, actor: int, first: int, count: int) -> int:
        """Items first..first+count-1 of `actor`, if first is what it expects; the next one it
        expects."""
        with self._lock:
            expected = self._state['expected']
            if self._accepting and first == expected[actor]:
                self._state['items'][actor].extend(range(first, first + count))
                expected[actor] += count
            return expected[actor]

    def sample(self, cursors: List[int], limit: int) -> Dict[int, List[int]]:
        """Items past each actor's cursor (what the learner checkpointed); drops those below."""
        with self._lock:
            found, left = {}, limit
            for actor, cursor in enumerate(cursors):
                items = self._state['items'][actor]
                del items[:_first_above(items, cursor)]
                self._state['cursors'][actor] = cursor
                if left > 0 and items:
                    found[actor] = items[:left]
                    left -= len(found[actor])
            return found

    def drain(self) -> List[int]:
        """Accepts no more items; returns what it expects next from each actor."""
        with self._lock:
            self._accepting = False
            return list(self._state['expected'])

    def progress(self) -> Dict[str, List[int]]:
        with self._lock:
            return {'expected': list(self._state['expected']),
                    'cursors': list(self._state['cursors'])}


def _first_above(items: List[int], cursor: int) -> int:
    for index, item in enumerate(items):
        if item > cursor:
            return index
    return len(items)


class _Outbox:
    """An actor's items produced but not yet in the replay, at most `capacity` of them.

    The actor's loop produces into it at its own pace and a sender thread flushes it to the
    replay, so an unreachable replay (its host cut off, or restarting) delays the items instead of
    stopping production; when the outbox is full the actor produces nothing (as an environment
    waits for a full writer) but keeps its heartbeat. Items are numbered only when the replay
    accepts them: it answers each insert with the number it expects next, so an insert whose
    answer was lost, or a replay restored from an older checkpoint, never makes a number twice
    or skips one. What an actor holds when it dies was never acknowledged: it is not lost.
    """

    def __init__(self, replay, index: int, capacity: int, stop: threading.Event):
        self._replay = replay
        self._stop = stop
        self._index = index
        self._capacity = capacity
        self._ready = threading.Condition()
        self._pending = 0      # produced, not yet accepted by the replay
        self._unanswered = 0   # sent in the last insert whose answer never came
        self.first = 0         # the number the replay expects next, as far as we know
        self.acked = 0         # the highest answer: the replay held every number below it

    def put(self, count: int) -> int:
        """Adds up to `count` items, as many as there is room for; how many it added."""
        with self._ready:
            added = max(0, min(count, self._capacity - self._pending))
            self._pending += added
            self._ready.notify_all()
            return added

    @property
    def pending(self) -> int:
        return self._pending

    def flush_forever(self) -> None:
        """Sends what is pending, as one insert, whenever there is some, until the node stops."""
        while not self._stop.is_set():
            self.flush()

    def flush(self) -> None:
        """Sends what is pending as one insert (waiting up to 0.1 s for some)."""
        with self._ready:
            if not self._pending:
                self._ready.wait(0.1)
            first, count = self.first, self._pending
        if not count:
            return
        try:
            answer = self._replay.insert(self._index, first, count)
        except Exception:  # pylint: disable=broad-except
            self._unanswered = max(self._unanswered, count)
            self._stop.wait(0.05)  # unreachable or restarting; its handle finds it again
            return
        self._answered(first, count, answer)

    def _answered(self, first: int, count: int, answer: int) -> None:
        with self._ready:
            if answer == first + count:
                accepted = count
            elif answer > first:  # an earlier insert, whose answer was lost, was accepted
                accepted = min(answer - first, self._unanswered)
            else:  # the replay restarted from an older checkpoint: it forgot numbers
                accepted = 0
            self._pending -= min(accepted, self._pending)
            self._unanswered = 0
            self.first = answer
            self.acked = max(self.acked, answer)
            self._ready.notify_all()


def actor(replay, index: int, pace: float, results: str, outbox: int) -> None:
    _hang_on_signal()
    box = _Outbox(replay, index, max(outbox, BATCH), lp.stop_event())
    sender = threading.Thread(target=box.flush_forever, daemon=True)
    sender.start()
    while not lp.wait_for_stop(pace):
        _beat()
        box.put(BATCH)
    sender.join(timeout=5)
    with open(os.path.join(results, f'actor-{index}.json'), 'w') as f:
        json.dump({'acked': box.acked}, f)


def learner(replay, actors: int, results: str) -> None:
    _hang_on_signal()
    state = lp.load_checkpoint(default={'cursors': [-1] * actors, 'consumed': 0,
                                        'duplicates': 0, 'gaps': 0})
    while not lp.stop_event().is_set():
        _beat()
        try:
            batch = replay.sample(state['cursors'], SAMPLE_LIMIT)
        except Exception:  # pylint: disable=broad-except
            time.sleep(0.05)
            continue
        if not batch:
            time.sleep(0.01)
            continue
        for actor_index, items in batch.items():
            cursor = state['cursors'][int(actor_index)]
            for item in items:
                if item <= cursor:
                    state['duplicates'] += 1
                    continue
                state['gaps'] += item - cursor - 1
                state['consumed'] += 1
                cursor = item
            state['cursors'][int(actor_index)] = cursor
        lp.save_checkpoint(state)  # consumed is what the checkpoint says
    with open(os.path.join(results, 'learner.json'), 'w') as f:
        json.dump(state, f)


def make_program(actors: int, pace: float, results: str, deadline: float = DEADLINE,
                 outbox: int = OUTBOX):
    """The program, and the handle of its replay node."""
    program = lp.Program('chaos')
    policy = lp.RestartPolicy(max_restarts=10_000, window=None, backoff=0.1, max_backoff=0.5)
    with program.group('replay', restart=policy):
        replay = program.add_node(lp.CourierNode(Replay, actors))
    with program.group('learner', restart=policy, progress_deadline=deadline):
        program.add_node(lp.PyNode(learner, replay, actors, results))
    with program.group('actor', restart=policy, progress_deadline=deadline):
        for index in range(actors):
            program.add_node(lp.PyNode(actor, replay, index, pace, results, outbox))
    return program, replay


@dataclasses.dataclass
class Result:
    """What one run of the program measured."""
    seconds: float
    consumed: int          # items the learner consumed while faults were injected (or not)
    lost: int = 0          # acknowledged to an actor, never consumed
    duplicates: int = 0    # consumed twice
    gaps: int = 0          # numbers the learner skipped (lost on the way)
    recoveries: Dict[str, List[float]] = dataclasses.field(default_factory=dict)
    hung: int = 0          # restarts for a missed progress deadline (injected hangs or not)
    # (fault, seconds until the next fault or the end, items consumed meanwhile), in order; the
    # first is 'none', before any fault; a cut is named with its host: 'cut lp-h1'
    segments: List[Tuple[str, float, int]] = dataclasses.field(default_factory=list)
    cuts: List[Tuple[str, List[str]]] = dataclasses.field(default_factory=list)  # host, its nodes

    @property
    def throughput(self) -> float:
        return self.consumed / self.seconds

    def shortfall(self, fault_free: float) -> Dict[str, Tuple[int, float]]:
        """Per fault (a cut per host): how many, and the items its segments consumed fewer than
        `fault_free` items/s would have, as a fraction of what the whole run would have. They
        add up to 1 minus the throughput fraction; a fault whose backlog is consumed after the
        next fault struck counts in that fault's segment."""
        expected = fault_free * self.seconds
        found: Dict[str, Tuple[int, float]] = {}
        for fault, seconds, consumed in self.segments:
            count, share = found.get(fault, (0, 0.0))
            found[fault] = (count + 1, share + (fault_free * seconds - consumed) / expected)
        return found


def _wait_running(controller, name: str, restarts: int, timeout: float) -> Optional[float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        status = controller.status()[name]
        if status.restarts >= restarts and status.state is lp.NodeState.RUNNING:
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def _inject(controller, kind: str, name: str, deadline: float, cut=None,
            replay=None) -> Optional[float]:
    """Injects fault `kind` into node `name`; seconds until it runs again (None: it did not).
    A 'cut' takes `name`'s host off the network (`cut(host)` returns once it is back), and
    counts from then until every node runs and the learner consumed more."""
    before = controller.status()[name]
    if kind == 'cut':
        cut(before.host)
        back = time.monotonic()
        consumed = sum(_cursors(replay))
        while time.monotonic() - back < deadline * 4 + 30:
            if (all(s.state is lp.NodeState.RUNNING for s in controller.status().values())
                    and sum(_cursors(replay)) > consumed):
                return time.monotonic() - back
            time.sleep(0.05)
        return None
    sig = {'kill': signal.SIGKILL, 'hang': signal.SIGUSR2, 'term': signal.SIGTERM}[kind]
    os.kill(before.pid, sig)
    return _wait_running(controller, name, before.restarts + 1, timeout=deadline * 4 + 30)


def run(seconds: float, actors: int = 4, faults: bool = True, interval: float = 20.0,
        pace: float = 0.02, launch_type: str = 'local_mp', seed: int = 0,
        deadline: float = DEADLINE, hosts: Optional[List] = None, cut=None,
        outbox: int = OUTBOX) -> Result:
    """Runs the program for `seconds` (with faults every `interval` s if `faults`), drains it,
    and returns what it measured; `deadline` is the actors' and the learner's progress
    deadline, `outbox` the items each actor may hold while the replay is unreachable. On SSH,
    `hosts` are three `lp.SshHost`s and `cut(host_name)` takes a host off the network and
    returns once it is back (None: no cuts)."""
    results = tempfile.mkdtemp(prefix='lp-chaos-')
    try:
        return _run(results, seconds, actors, faults, interval, pace, launch_type, seed, deadline,
                    hosts, cut, outbox)
    finally:
        shutil.rmtree(results, ignore_errors=True)


def _run(results: str, seconds: float, actors: int, faults: bool, interval: float, pace: float,
         launch_type: str, seed: int, deadline: float, hosts, cut, outbox: int) -> Result:
    program, replay_handle = make_program(actors, pace, results, deadline, outbox)
    resources = None if hosts is None else {
        'replay': hosts[0], 'learner': hosts[1], 'actor': lp.SshHosts(hosts)}
    controller = lp.launch(program, launch_type=launch_type, notice_period=3.0,
                           resources=resources)
    try:
        names = ['replay/0', 'learner/0'] + [f'actor/{i}' for i in range(actors)]
        while not all(s.state is lp.NodeState.RUNNING for s in controller.status().values()):
            time.sleep(0.05)
        replay = replay_handle.dereference()  # a client, from this (the launching) process
        time.sleep(1.0)  # warm up
        start, consumed_before = time.monotonic(), sum(_cursors(replay))
        rng = random.Random(seed)
        recoveries = collections.defaultdict(list)
        # On SSH a cut comes first, and the fault after it strikes the host that was cut: its
        # launcher's connection must have survived the cut for the node to be restarted.
        kinds = (['cut'] if cut is not None else []) + ['kill', 'term', 'hang']
        cut_host = None
        count = 0
        marks = [('none', start, consumed_before)]  # (fault, when, consumed by then)
        cuts = []
        while time.monotonic() - start < seconds:
            next_fault = start + (count + 1) * interval
            time.sleep(max(0.0, min(next_fault, start + seconds) - time.monotonic()))
            if not faults or time.monotonic() - start >= seconds:
                continue
            kind = kinds[count % len(kinds)]
            candidates = names[1:] if kind == 'hang' else names
            if cut_host is not None:
                status = controller.status()
                candidates = [n for n in candidates if status[n].host == cut_host] or candidates
            name = rng.choice(candidates)
            status = controller.status()
            cut_host = status[name].host if kind == 'cut' else None
            fault = kind
            if kind == 'cut':
                fault = f'cut {cut_host}'
                on_host = sorted(n for n, s in status.items() if s.host == cut_host)
                cuts.append((cut_host, on_host))
                print(f'chaos: {time.monotonic() - start:7.1f} s  cut {cut_host} '
                      f'({", ".join(on_host)})', file=sys.stderr, flush=True)
            consumed_now = sum(_cursors(replay))
            marks.append((fault, time.monotonic(), consumed_now))
            took = _inject(controller, kind, name, deadline, cut, replay)
            recoveries[kind].append(float('inf') if took is None else took)
            count += 1
        elapsed = time.monotonic() - start
        consumed = sum(_cursors(replay)) - consumed_before
        ends = [when for _, when, _ in marks[1:]] + [start + elapsed]
        totals = [c for _, _, c in marks[1:]] + [consumed_before + consumed]
        segments = [(fault, end - when, total - before)
                    for (fault, when, before), end, total in zip(marks, ends, totals)]
        expected = replay.drain()
        drained_by = time.monotonic() + 60
        while _cursors(replay) != [e - 1 for e in expected] and time.monotonic() < drained_by:
            time.sleep(0.1)
        hung = sum(message.startswith('hung') for failures in
                   controller.coordinator.failures().values() for message, _ in failures)
    finally:
        controller.stop()
        controller.wait(timeout=60)
    with open(os.path.join(results, 'learner.json')) as f:
        final = json.load(f)
    acked = []
    for index in range(actors):
        with open(os.path.join(results, f'actor-{index}.json')) as f:
            acked.append(json.load(f)['acked'])
    lost = sum(max(0, a - 1 - c) for a, c in zip(acked, final['cursors'])) + final['gaps']
    return Result(elapsed, consumed, lost, final['duplicates'], final['gaps'],
                  dict(recoveries), hung, segments, cuts)


def _cursors(replay) -> List[int]:
    while True:
        try:
            return replay.progress()['cursors']
        except Exception:  # pylint: disable=broad-except
            time.sleep(0.05)  # it restarts


@contextlib.contextmanager
def _bed(launch_type: str) -> Iterator[Optional[List]]:
    """The SSH test bed's hosts for the run (None for the other launchers)."""
    if launch_type != 'ssh':
        yield None
        return
    sys.path.insert(0, REPO)
    from tests import testbeds  # pylint: disable=import-outside-toplevel
    with testbeds.ssh_hosts(3) as bed:
        yield bed_hosts(bed)


def bed_hosts(bed) -> List:
    """`lp.SshHost`s of the SSH test bed's hosts (tests/testbeds), running this checkout."""
    pythonpath = os.pathsep.join(filter(None, [os.environ.get('PYTHONPATH'), REPO]))
    return [lp.SshHost(h.name, python=h.python, ssh_options=['-F', h.ssh_config],
                       env={'PYTHONPATH': pythonpath}) for h in bed]


def cut_off(host: str, seconds: float) -> None:
    """Takes the SSH test bed's host `host` (lp-hN) off the bed's network for `seconds`: its
    link to the bridge goes down, so what it sends and what is sent to it is lost."""
    link = 'lpv' + host[len('lp-h'):]
    subprocess.run(['ip', 'link', 'set', link, 'down'], check=True)
    try:
        time.sleep(seconds)
    finally:
        subprocess.run(['ip', 'link', 'set', link, 'up'], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--minutes', type=float, default=1.0)
    parser.add_argument('--actors', type=int, default=4)
    parser.add_argument('--interval', type=float, default=20.0, help='seconds between faults')
    parser.add_argument('--pace', type=float, default=0.02,
                        help='seconds between an actor\'s batches of %d items' % BATCH)
    parser.add_argument('--launch_type', default='local_mp')
    parser.add_argument('--cut', type=float, default=10.0,
                        help='seconds an SSH host is cut off the network')
    parser.add_argument('--baseline_minutes', type=float, default=None,
                        help='minutes of the fault-free run (default: --minutes)')
    parser.add_argument('--outbox', type=int, default=OUTBOX,
                        help='items an actor may hold while the replay is unreachable (%d: none '
                             'beyond the batch in flight)' % BATCH)
    args = parser.parse_args()
    seconds = args.minutes * 60
    baseline = seconds if args.baseline_minutes is None else args.baseline_minutes * 60
    loads: List[float] = []
    sampling = threading.Event()
    threading.Thread(target=_sample_load, args=(loads, sampling), daemon=True).start()
    with _bed(args.launch_type) as hosts:
        cut = None if hosts is None else functools.partial(cut_off, seconds=args.cut)
        clean = run(baseline, args.actors, faults=False, pace=args.pace,
                    launch_type=args.launch_type, hosts=hosts, outbox=args.outbox)
        chaos = run(seconds, args.actors, faults=True, interval=args.interval, pace=args.pace,
                    launch_type=args.launch_type, hosts=hosts, cut=cut, outbox=args.outbox)
    sampling.set()
    print(f'{args.launch_type}, {args.actors} actors, {baseline / 60:g} min fault-free, '
          f'{args.minutes:g} min with a fault every {args.interval:g} s')
    print(f'  fault-free: {clean.throughput:8.0f} items/s   lost {clean.lost}   '
          f'twice {clean.duplicates}   restarts for a missed deadline {clean.hung}')
    print(f'  faults:     {chaos.throughput:8.0f} items/s   lost {chaos.lost}   '
          f'twice {chaos.duplicates}   throughput {chaos.throughput / clean.throughput:.1%} '
          'of fault-free')
    print(f'  restarts for a missed deadline: {chaos.hung} '
          f'(injected hangs: {len(chaos.recoveries.get("hang", []))})')
    for kind, seconds_taken in sorted(chaos.recoveries.items()):
        print(f'  {kind:<5} x{len(seconds_taken):<3} recovery: median '
              f'{statistics.median(seconds_taken):.2f} s, max {max(seconds_taken):.2f} s')
    print('  throughput short of fault-free, per fault (its segment: until the next fault):')
    for fault, (count, share) in sorted(chaos.shortfall(clean.throughput).items()):
        print(f'    {fault:<10} x{count:<3} {share:+.1%}')
    for host in sorted({host for host, _ in chaos.cuts}):
        on_host = sorted({', '.join(nodes) for h, nodes in chaos.cuts if h == host})
        print(f'  cuts of {host}: {sum(h == host for h, _ in chaos.cuts)}, its nodes: '
              + ' | '.join(on_host))
    print(f'  load average (1 min, every 30 s, both runs): min {min(loads):.1f}, '
          f'mean {statistics.mean(loads):.1f}, max {max(loads):.1f}; outbox {args.outbox} items')


def _sample_load(loads: List[float], done: threading.Event) -> None:
    while True:
        loads.append(os.getloadavg()[0])
        if done.wait(30):
            return


if __name__ == '__main__':
    main()
