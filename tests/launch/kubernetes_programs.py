"""Programs the Kubernetes tests run in pods (no pytest here: pods import this module)."""
from __future__ import annotations

import hashlib
import time

import courier
import launchpad as lp


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:16]


class Queue:
    """A courier service collecting numbers."""

    def __init__(self):
        self._items = []

    def put(self, item: int) -> None:
        self._items.append(item)

    def items(self) -> list:
        return list(self._items)


def produce(queue, count: int, payload: bytes = b'') -> None:
    for i in range(count):
        queue.put(i)
    print(f'produced {count}, payload {digest(payload)}, over {queue.protocol}', flush=True)


def consume(queue, total: int) -> None:
    while len(queue.items()) < total:
        time.sleep(0.05)
    print(f'consumed {total} items summing to {sum(queue.items())}', flush=True)
    lp.stop()


def producer_consumer(producers: int = 2, count: int = 5, payload: bytes = b'') -> lp.Program:
    """Producers fill a queue, the consumer stops the program; the first producer carries
    `payload` (to test large executables)."""
    program = lp.Program('producer-consumer')
    queue = program.add_node(lp.CourierNode(Queue), label='queue')
    with program.group('producer'):
        for i in range(producers):
            program.add_node(lp.PyNode(produce, queue, count, payload if i == 0 else b''))
    program.add_node(lp.PyNode(consume, queue, producers * count), label='consumer')
    return program


class Learner:
    """Learns from actors' trajectories; stops the program after `steps` updates (or ends when
    the program is stopped)."""

    def __init__(self, steps: int):
        self._steps = steps
        self._weights = 0.0
        self._updates = 0

    def weights(self) -> float:
        return self._weights

    def learn(self, trajectory: list) -> None:
        self._weights += sum(trajectory) / len(trajectory)
        self._updates += 1

    def run(self) -> None:
        while self._updates < self._steps and not lp.stop_event().is_set():
            time.sleep(0.05)
        print(f'learner: {self._updates} updates, weights {self._weights:g}', flush=True)
        lp.stop()


class Actor:
    def __init__(self, learner, actor_id: int):
        self._learner = learner
        self._id = actor_id

    def run(self) -> None:
        # Pods start in any order, and the learner's clients wait 1 s for it to serve: the
        # first call is tried again until it serves (a minute at most).
        deadline = time.monotonic() + 60
        while True:
            try:
                self._learner.weights()
                break
            except courier.ServerUnreachableTimeoutError:
                if time.monotonic() > deadline or lp.stop_event().is_set():
                    raise
        episodes = 0
        while not lp.stop_event().is_set():
            try:
                self._learner.weights()  # fetch the latest parameters, as a real actor would
                self._learner.learn([self._id + step for step in range(4)])
            except Exception:  # pylint: disable=broad-except
                if lp.stop_event().is_set():
                    break  # the learner has stopped serving
                raise
            episodes += 1
            time.sleep(0.02)
        print(f'actor {self._id}: {episodes} episodes', flush=True)


def actor_learner(actors: int = 2, steps: int = 20) -> lp.Program:
    program = lp.Program('actor-learner')
    learner = program.add_node(
        lp.CourierNode(Learner, steps, courier_client_kwargs={'call_timeout': 1.0}),
        label='learner')
    with program.group('actor'):
        for i in range(actors):
            program.add_node(lp.PyClassNode(Actor, learner, i))
    return program


def fail(message: str) -> None:
    raise ValueError(message)


def failing() -> lp.Program:
    """A queue serving until the program stops, and a node that fails."""
    program = lp.Program('failing')
    program.add_node(lp.CourierNode(Queue), label='queue')
    program.add_node(lp.PyNode(fail, 'the reward went negative'), label='broken')
    return program


def print_digest(blob: bytes) -> None:
    print(f'checksum {digest(blob)}', flush=True)


def checksum(blob: bytes) -> lp.Program:
    """A one-node program whose executable carries `blob` (to test large executables)."""
    program = lp.Program('checksum')
    program.add_node(lp.PyNode(print_digest, blob), label='checker')
    return program


class Member:
    """A member of an elastic group: says its name."""

    def name(self) -> str:
        return lp.get_context().node_name


def _member() -> lp.CourierNode:
    return lp.CourierNode(Member)


def resize_then_probe(members, worker) -> None:
    """Grows group member to 2 (`lp.resize`) and shrinks it to 1, each time until exactly the
    live members answer; then `failure_programs.probe(worker)`; then calls worker/0 until the
    program stops, saying every second how many calls it answered so far (`CALLS n`), and
    failed (the test kills the coordinator meanwhile: calls between nodes go on)."""
    from tests import failure_programs  # pylint: disable=import-outside-toplevel
    for size in (2, 1):
        lp.resize('member', size)
        deadline = time.monotonic() + 120
        while True:
            answers = members.call_all('name', return_exceptions=True, timeout=10)
            named = sorted(value for value in answers.values() if isinstance(value, str))
            if len(named) == size:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f'group member did not reach {size} nodes: {answers}')
            time.sleep(0.2)
        print(f'RESIZED {size}: {named}', flush=True)
    failure_programs.probe(worker, stop=False)
    answered = failed = 0
    said = time.monotonic()
    while not lp.stop_event().is_set():
        try:
            worker.whoami()
            answered += 1
        except Exception:  # pylint: disable=broad-except  (counted: the test checks none)
            failed += 1
        if time.monotonic() - said >= 1.0:
            print(f'CALLS {answered} answered, {failed} failed', flush=True)
            said = time.monotonic()
        time.sleep(0.02)


def detached_program() -> lp.Program:
    """`failure_programs.restart_program(crash=True)` with an elastic group, member, that its
    prober grows and shrinks before probing worker/0; it runs until stopped."""
    from tests import failure_programs  # pylint: disable=import-outside-toplevel
    program = lp.Program('detached')
    with program.group('worker', restart=lp.RestartPolicy(max_restarts=2, backoff=0.2)):
        worker = program.add_node(lp.CourierNode(failure_programs.Worker, True))
    with program.group('member', elastic=lp.Elastic(make_node=_member, max_size=2)):
        program.add_node(_member())
    program.add_node(lp.PyNode(resize_then_probe, program.group_handle('member'), worker),
                     label='prober')
    return program
