"""The program the detach tests and `benchmarks/recover_bench.py` run: a caller calls a counter
node all the time (calls between nodes), and an elastic group of idle workers grows and shrinks.

The counter writes what it served to a file (`Counter.read`): how many calls, and the longest
gap between two of them, so that a test or a benchmark sees from outside that calls went on
while the program's supervisor was dead.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict

import launchpad as lp

SERVED = 'SERVED '  # starts what a counter without a path prints

class Counter:
    """Counts the calls it serves; writes {'calls', 'longest_gap'} to `path` every 50 ms, or
    with no `path` prints it (`SERVED` and its JSON) every 0.5 s, for a node whose files the
    launching machine cannot read (in a Kubernetes pod)."""

    def __init__(self, path: str):
        self._path = path
        self._lock = threading.Lock()
        self._calls = 0
        self._last = None
        self._longest_gap = 0.0

    def bump(self) -> int:
        with self._lock:
            now = time.monotonic()
            if self._last is not None:
                self._longest_gap = max(self._longest_gap, now - self._last)
            self._last = now
            self._calls += 1
            return self._calls

    def run(self) -> None:
        printed = 0.0
        while not lp.wait_for_stop(0.05):
            with self._lock:
                state = {'calls': self._calls, 'longest_gap': self._longest_gap}
            if not self._path:
                if time.monotonic() - printed >= 0.5:
                    print(f'{SERVED}{json.dumps(state)}', flush=True)
                    printed = time.monotonic()
                continue
            with open(self._path + '.tmp', 'w') as f:
                json.dump(state, f)
            os.replace(self._path + '.tmp', self._path)

    @staticmethod
    def read(path: str) -> Dict[str, Any]:
        """What the counter at `path` served so far ({'calls': 0, ...} before it wrote)."""
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {'calls': 0, 'longest_gap': 0.0}

    @staticmethod
    def parse(output: str) -> Dict[str, Any]:
        """What a counter without a path said it served last in its `output`."""
        said = [line.split(SERVED, 1)[1] for line in output.splitlines() if SERVED in line]
        return json.loads(said[-1]) if said else {'calls': 0, 'longest_gap': 0.0}


def call_forever(counter) -> None:
    while not lp.wait_for_stop(0.01):
        counter.bump()


def idle() -> None:
    lp.wait_for_stop()


def make_program(path: str, name: str = 'detached') -> lp.Program:
    """The counter at `path` ('': printing), its caller, and one worker of elastic group
    'worker' (1 to 3)."""
    program = lp.Program(name)
    counter = program.add_node(lp.CourierNode(Counter, path), label='counter')
    program.add_node(lp.PyNode(call_forever, counter), label='caller')
    with program.group('worker', elastic=lp.Elastic(make_node=lambda: lp.PyNode(idle),
                                                    min_size=1, max_size=3)):
        program.add_node(lp.PyNode(idle))
    return program
