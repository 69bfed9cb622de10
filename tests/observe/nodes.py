"""Nodes of the in-process programs the observe tests look at (importable by node processes)."""
from __future__ import annotations

import os

import launchpad as lp


class Learner:
    """Learns from whatever actors send; reports its loss and counts its steps."""

    def __init__(self):
        self.steps = 0

    def update(self, value: float) -> int:
        self.steps += 1
        lp.report(loss=1.0 / (1 + self.steps) ** 0.5)
        lp.count(learner_steps=1)
        return self.steps


def actor(learner, index: int) -> None:
    """Calls the learner about 20 times a second until the program stops."""
    episode = 0
    while not lp.wait_for_stop(0.05):
        learner.update(index)
        episode += 1
        lp.report(episode_return=float(episode % 40) * (index + 1))
        if episode % 20 == 0:
            print(f'actor {index}: episode {episode}', flush=True)


def flaky(trigger: str) -> None:
    """Fails once the file `trigger` exists."""
    print('waiting for the trigger', flush=True)
    while not lp.wait_for_stop(0.05):
        if os.path.exists(trigger):
            raise RuntimeError('lost the connection to the simulator')


def agent(trigger: str) -> lp.Program:
    program = lp.Program('agent')
    learner = program.add_node(lp.CourierNode(Learner), label='learner')
    with program.group('actor'):
        for index in range(2):
            program.add_node(lp.PyNode(actor, learner, index))
    program.add_node(lp.PyNode(flaky, trigger), label='simulator')
    return program
