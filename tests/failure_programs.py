"""Programs that fail, hang, restart and stop, run by the failure tests of every launcher.

No pytest here: the nodes import this module wherever they run (processes, SSH hosts, Slurm steps,
pods), so it must import as it is on all of them.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

import courier
import launchpad as lp


# --- A node killed with SIGKILL is restarted, and its clients reach the new instance ---------

class Worker:
    """Says which attempt it is; serves until the program stops. With `crash`, its first
    attempt raises once it has answered a call (threads cannot be killed from outside)."""

    def __init__(self, crash: bool = False):
        self._crash = crash
        self._answered = threading.Event()

    def whoami(self) -> tuple:
        self._answered.set()
        return lp.get_context().attempt, os.getpid(), socket.gethostname()

    def run(self) -> None:
        while not lp.wait_for_stop(0.05):
            lp.heartbeat()
            if self._crash and self._answered.is_set() and lp.get_context().attempt == 0:
                raise RuntimeError('worker crashed')


def probe(worker, limit: float = 120.0, stop: bool = True) -> None:
    """Calls `worker` until it answers from its second attempt (the test kills the first), then
    stops the program (unless not `stop`: then the test does). Calls in flight at the crash may fail; later ones must reach the new one."""
    first = worker.whoami()
    print(f'PROBE first answer {first}', flush=True)
    failed = 0
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            attempt, pid, host = worker.whoami()
        except courier.ServerUnavailableError as e:
            failed += 1
            print(f'PROBE call failed: {e}', flush=True)
            time.sleep(0.05)
            continue
        if attempt == 1:
            print(f'PROBE restarted: attempt {attempt}, pid {pid} on {host}, '
                  f'{failed} failed calls', flush=True)
            if stop:
                lp.stop()
            return
        time.sleep(0.02)
    raise TimeoutError(f'worker/0 did not come back within {limit:g} s')


def restart_program(crash: bool = False) -> lp.Program:
    """worker/0 (restarted up to twice) is killed by the test, or crashes by itself with
    `crash`; prober/0 calls it until it answers from its second attempt."""
    program = lp.Program('restarts')
    with program.group('worker', restart=lp.RestartPolicy(max_restarts=2, backoff=0.2)):
        worker = program.add_node(lp.CourierNode(Worker, crash))
    program.add_node(lp.PyNode(probe, worker), label='prober')
    return program


# --- Dropped, hung, and over its restart budget ----------------------------------------------

def fail_now() -> None:
    raise ValueError('dropped on purpose')


def stuck_in_a_loop() -> None:
    while True:
        time.sleep(0.05)


def hang_then_fail() -> None:
    if lp.get_context().attempt == 0:
        lp.heartbeat()
        stuck_in_a_loop()
    raise RuntimeError('the second attempt fails too')


class Steady:
    """Serves until the program stops."""

    def ping(self) -> str:
        return 'pong'


def failure_program(deadline: float = 2.0) -> lp.Program:
    """dropped/0 fails at once and is dropped; hung/0 hangs (found after `deadline` s), is
    restarted, and fails again: over its budget, it fails the program with both failures."""
    program = lp.Program('failures')
    program.add_node(lp.CourierNode(Steady), label='steady')
    with program.group('dropped', restart=lp.RestartPolicy(max_restarts=0, on_failure='drop')):
        program.add_node(lp.PyNode(fail_now))
    with program.group('hung', restart=lp.RestartPolicy(max_restarts=1, backoff=0.1),
                       progress_deadline=deadline):
        program.add_node(lp.PyNode(hang_then_fail))
    return program


# --- Hang detection counts only the time a node could have used -----------------------------

SILENT_FOR = 4.0  # seconds each patient node goes without progress, well past its deadline


class Slow:
    """Answers after a while, as a loaded, restarting or unreachable peer does."""

    def answer_after(self, seconds: float) -> str:
        time.sleep(seconds)
        return 'late'


def wait_on_a_call(slow) -> None:
    lp.heartbeat()
    assert slow.answer_after(SILENT_FOR) == 'late'
    lp.heartbeat()


def throttled_cgroup(root: str) -> str:
    """A new cgroup under `root` (cgroup v1's cpu controller or v2's root) whose processes run
    20 ms of each second between them: the rest of the time they wait for a CPU."""
    path = os.path.join(root, f'lp-starved-{os.getpid()}')
    os.mkdir(path)
    if os.path.exists(os.path.join(root, 'cgroup.controllers')):  # v2
        with open(os.path.join(path, 'cpu.max'), 'w') as f:
            f.write('20000 1000000')
    else:
        with open(os.path.join(path, 'cpu.cfs_period_us'), 'w') as f:
            f.write('1000000')
        with open(os.path.join(path, 'cpu.cfs_quota_us'), 'w') as f:
            f.write('20000')
    return path


def _join_cgroup(path: str, pid: int) -> None:
    with open(os.path.join(path, 'cgroup.procs'), 'w') as f:
        f.write(str(pid))


def remove_cgroup(path: str, parent: str) -> None:
    """Moves what is left in cgroup `path` to `parent`, then removes it."""
    for _ in range(50):
        with open(os.path.join(path, 'cgroup.procs')) as f:
            for pid in f.read().split():
                try:
                    _join_cgroup(parent, int(pid))
                except OSError:  # it ended meanwhile
                    pass
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)
    os.rmdir(path)


# Run by a helper process, so that the starved node never waits on a cgroup file itself (moving
# a process can take a kernel the better part of a second under load): it moves the node and
# itself into the cgroup, spins for SILENT_FOR s, then moves both back.
_STARVER = f"""
import os, sys, time
cgroup, parent, node = sys.argv[1], sys.argv[2], sys.argv[3]
def join(path, pid):
    with open(os.path.join(path, 'cgroup.procs'), 'w') as f:
        f.write(pid)
for pid in (node, '0'):
    join(cgroup, pid)
end = time.monotonic() + {SILENT_FOR!r}
while time.monotonic() < end:
    pass
for pid in (node, '0'):
    join(parent, pid)
"""


def starve(cgroup: str, parent: str) -> None:
    """Beats every 10 ms while it and a busy loop share `cgroup`'s 20 ms of CPU a second: its
    heartbeats come about a second apart, though it never stops beating."""
    lp.heartbeat()
    starver = subprocess.Popen([sys.executable, '-c', _STARVER, cgroup, parent, str(os.getpid())])
    try:
        while starver.poll() is None:
            lp.heartbeat()
            time.sleep(0.01)
    finally:
        starver.kill()
        starver.wait()
    assert starver.returncode == 0, starver.returncode
    lp.heartbeat()


def patience_program(deadline: float, cgroup: Optional[str], parent: Optional[str]) -> lp.Program:
    """caller/0 waits SILENT_FOR s for slow/0's answer, starved/0 (with a cgroup) beats on under
    a throttled CPU: neither is hung. hung/0 stops beating: it is, and is dropped."""
    program = lp.Program('patience')
    slow = program.add_node(lp.CourierNode(Slow), label='slow')
    drop = lp.RestartPolicy(max_restarts=0, on_failure='drop')
    with program.group('caller', progress_deadline=deadline):
        program.add_node(lp.PyNode(wait_on_a_call, slow))
    if cgroup is not None:
        with program.group('starved', progress_deadline=deadline):
            program.add_node(lp.PyNode(starve, cgroup, parent))
    with program.group('hung', restart=drop, progress_deadline=deadline):
        program.add_node(lp.PyNode(stuck_in_a_loop))
    return program


# --- Stopping: nodes that do not cooperate end at once, those that do are never killed --------

class Learner:
    """Acme's learner shape: a loop that never looks at the stop, and a served method."""

    def __init__(self):
        self.steps = 0

    def update(self, value: int) -> int:
        return self.steps + value

    def run(self) -> None:
        while True:  # no stop handler, no lp.wait_for_stop: it ends when the program stops
            self.steps += 1
            time.sleep(0.01)


def act(learner) -> None:
    """Acme's actor shape: calls the learner in a loop, never looks at the stop."""
    while True:
        learner.update(1)


class Counter:
    def __init__(self):
        self.total = 0
        self.lock = threading.Lock()

    def add(self, n: int) -> int:
        with self.lock:
            self.total += n
            return self.total


def count(counter, index: int, calls: int) -> None:
    """A cooperating actor: its stop handler flushes to the counter (which may be gone by then),
    its loop ends at the stop; actor 0 stops the program after `calls` calls."""
    done = threading.Event()

    def flush():
        try:
            counter.add(0)
        except courier.ServerUnavailableError:
            pass  # the counter stopped first: the call fails at once rather than waiting
        done.set()

    lp.register_stop_handler(flush)
    made = 0
    while not done.is_set():
        try:
            counter.add(1)
        except courier.ServerUnavailableError:
            if lp.stop_event().is_set():
                break
            raise
        made += 1
        if index == 0 and made == calls:
            lp.stop()


def stop_program(actors: int = 2, counting: int = 4, calls: int = 200) -> lp.Program:
    """A learner loop without a stop handler and actors calling it (Acme's DQN), and counting
    actors with stop handlers calling a counter, one of which stops the program."""
    program = lp.Program('stopping')
    learner = program.add_node(lp.CourierNode(Learner), label='learner')
    with program.group('actor'):
        for _ in range(actors):
            program.add_node(lp.PyNode(act, learner))
    counter = program.add_node(lp.CourierNode(Counter), label='counter')
    with program.group('counting'):
        for i in range(counting):
            program.add_node(lp.PyNode(count, counter, i, calls))
    return program


# --- Processes a node starts end with it ------------------------------------------------------

def spawn(seconds: int, crash: bool) -> None:
    """Starts `sleep SECONDS` three times: a plain child, a child in a session of its own, and an
    orphan (its shell exits at once); then crashes, or serves until the program stops."""
    subprocess.Popen(['sleep', str(seconds)])
    subprocess.Popen(['sleep', str(seconds)], start_new_session=True)
    subprocess.Popen(['sh', '-c', f'sleep {seconds} >/dev/null 2>&1 &']).wait()
    print(f'SPAWNED sleep {seconds}', flush=True)
    if crash:
        raise ValueError('crashed, leaving its children behind')
    lp.wait_for_stop()


def spawning_program(seconds: int) -> lp.Program:
    """spawner/0 starts three `sleep SECONDS` and crashes (dropped: the program goes on);
    spawner/1 starts three `sleep SECONDS+1` and waits for the stop."""
    program = lp.Program('spawning')
    with program.group('spawner', restart=lp.RestartPolicy(max_restarts=0, on_failure='drop')):
        program.add_node(lp.PyNode(spawn, seconds, True))
        program.add_node(lp.PyNode(spawn, seconds + 1, False))
    return program


def sleepers(seconds: int) -> list:
    """This machine's `sleep SECONDS` processes (containers' included: same kernel)."""
    import psutil  # pylint: disable=import-outside-toplevel
    found = []
    for process in psutil.process_iter(['cmdline', 'status']):
        if (process.info['cmdline'] == ['sleep', str(seconds)]
                and process.info['status'] != psutil.STATUS_ZOMBIE):
            found.append(process.pid)
    return found
