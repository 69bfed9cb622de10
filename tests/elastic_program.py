"""The elastic actor/learner program the launcher tests run: actors send to a learner, which
broadcasts to every live actor through a group handle, while the group grows and shrinks.

`driver` grows the actors from 2 to 6 and back to 1 (or other sizes) from inside the program
(`lp.resize`) and checks, at each size, that the learner receives from every live actor and from
no other, and that its broadcasts reach exactly the live ones; it fails the program (with what it
saw) if not.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, List

import launchpad as lp

DEADLINE = 60.0  # seconds a size may take to be reached (a loaded machine, remote hosts)


class Actor:
    """Sends to the learner until it is stopped (removed, or the program stops)."""

    def __init__(self, learner):
        self._learner = learner
        self.params = 0

    def set_params(self, version: int) -> str:
        self.params = version
        return lp.get_context().node_name

    def run(self) -> None:
        name = lp.get_context().node_name
        stop = lp.stop_event()
        while not stop.is_set():
            try:
                self._learner.receive(name)
            except lp.NodeStoppedError:
                return  # the program stops
            stop.wait(0.02)


class Learner:
    """Records who sent what when; broadcasts a version to the live actors all the time."""

    def __init__(self, actors):
        self._actors = actors  # an lp.GroupClient
        self._lock = threading.Lock()
        self._received: List[tuple] = []   # (monotonic time, sender)
        self._answered: List[tuple] = []   # (monotonic time, names that answered a broadcast)
        self.broadcasts = 0

    def receive(self, name: str) -> int:
        with self._lock:
            self._received.append((time.monotonic(), name))
        return self.broadcasts

    def senders(self, seconds: float) -> List[str]:
        """Who sent in the last `seconds`."""
        since = time.monotonic() - seconds
        with self._lock:
            return sorted({name for at, name in self._received if at >= since})

    def answered(self, seconds: float) -> List[List[str]]:
        """The sets of actors that answered each broadcast of the last `seconds`."""
        since = time.monotonic() - seconds
        with self._lock:
            return [names for at, names in self._answered if at >= since]

    def members(self) -> List[str]:
        return self._actors.names()

    def run(self) -> None:
        stop = lp.stop_event()
        while not stop.is_set():
            self.broadcasts += 1
            try:
                answers = self._actors.call_all('set_params', self.broadcasts, timeout=30)
            except lp.NodeStoppedError:
                return  # the program stops
            with self._lock:
                self._answered.append((time.monotonic(), sorted(answers)))
            stop.wait(0.05)


def make_actor(learner):
    return lp.CourierNode(Actor, learner)


def build(make_node=None, *, driver: bool = True, sizes=(6, 1), stop: bool = True) -> lp.Program:
    """The program: a learner, two actors in elastic group 'actor', and (with `driver`) the node
    that resizes the group to each of `sizes` in turn, checks the learner, and then (with `stop`)
    stops the program."""
    program = lp.Program('elastic')
    learner_node = lp.CourierNode(Learner, program.group_handle('actor'))
    learner = program.add_node(learner_node, label='learner')
    factory = make_node or (lambda: make_actor(learner))
    with program.group('actor', elastic=lp.Elastic(make_node=factory, min_size=1, max_size=8)):
        for _ in range(2):
            program.add_node(factory())
    if driver:
        program.add_node(lp.PyNode(drive, learner, tuple(sizes), stop), label='driver')
    return program


def wait_for_actors(learner, expected: List[str], resize=None) -> Dict[str, object]:
    """Waits until the live actors are `expected`, the learner receives from exactly them and
    its broadcasts reach exactly them (after a settling second); raises AssertionError with
    what was seen otherwise. `resize()` first, if given. Returns what was seen."""
    if resize is not None:
        resize()
    deadline = time.monotonic() + DEADLINE
    seen: Dict[str, object] = {}
    while time.monotonic() < deadline:
        seen = {'members': learner.members(), 'senders': learner.senders(1.0),
                'answered': learner.answered(1.0)}
        # (The group lists its members oldest first: nodes added together, e.g. pods that start
        # at once, join in any order.)
        if (sorted(seen['members']) == expected and seen['senders'] == expected
                and seen['answered'] and all(a == expected for a in seen['answered'])):
            return seen
        time.sleep(0.2)
    raise AssertionError(f'Within {DEADLINE:g} s, the actors were not {expected}: the group '
                         f'lists {seen.get("members")}, the learner received in the last second '
                         f'from {seen.get("senders")} and its broadcasts reached '
                         f'{(seen.get("answered") or ["nobody"])[-3:]}.')


def drive(learner, sizes=(6, 1), stop: bool = True) -> None:
    """Grows the actors from 2 to sizes[0], then shrinks them to sizes[1], from inside the
    program, checking the learner at each; then stops the program (or returns)."""
    grow, shrink = sizes
    actors = [f'actor/{i}' for i in range(grow)]
    wait_for_actors(learner, actors[:2])
    started = time.monotonic()
    wait_for_actors(learner, actors, lambda: lp.resize('actor', grow))
    print(f'ELASTIC grew to {grow} in {time.monotonic() - started:.2f} s', flush=True)
    wait_for_actors(learner, actors[:shrink], lambda: lp.resize('actor', shrink))
    print(f'ELASTIC shrank to {shrink}', flush=True)
    if stop:
        lp.stop()
