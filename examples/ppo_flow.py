"""PPO as a dataflow: every round, all rollout workers sample at once (bulk synchronous); the
batches are concatenated up to a minimum size; the driver makes several epochs of clipped
surrogate steps on it and broadcasts the new weights.

Topology (N workers):

    worker/0 .. worker/N-1   CourierNodes (cartpole.RolloutWorker): sample() plays episodes of
         ^    |              CartPole with the weights it was last given
         |    v
    driver/0   the dataflow below; prints how the average return rose and stops the program

    python -m launchpad.launch --type=local_mp examples/ppo_flow.py --workers=2
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

import numpy as np
from absl import app, flags

import launchpad as lp
from launchpad.dataflow import ConcatBatches, ParallelRollouts, StandardMetricsReporting

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cartpole import (Adam, action_probabilities, advantages, report,  # noqa: E402
                      rollout_program)

_WORKERS = flags.DEFINE_integer('workers', 2, 'Number of rollout workers.')
_ROUNDS = flags.DEFINE_integer('rounds', 25, 'Training rounds before stopping.')
_BATCH = flags.DEFINE_integer('batch', 400, 'Minimum steps per training batch.')
_EPOCHS = flags.DEFINE_integer('epochs', 8, 'Surrogate steps on each batch.')
_CLIP = flags.DEFINE_float('clip', 0.2, 'PPO\'s clipping of the probability ratio.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.05, 'Step size of the (Adam) updates.')
_SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
_RESULTS = flags.DEFINE_string('results', None, 'Also write the metrics after every round to '
                                                'this JSON file.')


def surrogate_gradient(weights: np.ndarray, batch, clip: float) -> np.ndarray:
    """The gradient of PPO's clipped surrogate objective for a linear softmax policy."""
    probs = action_probabilities(weights, batch['inputs'])
    chosen = np.eye(2)[batch['actions']]
    ratio = (probs * chosen).sum(axis=1) / batch['probs']
    advantage = advantages(batch)
    clipped = ((advantage > 0) & (ratio > 1 + clip)) | ((advantage < 0) & (ratio < 1 - clip))
    scale = np.where(clipped, 0.0, ratio * advantage)
    return ((chosen - probs) * scale[:, None]).T @ batch['inputs'] / len(ratio)


def ppo(workers, learner: Adam, batch_size: int, epochs: int, clip: float):
    """The whole algorithm: sample in bulk, concatenate, train, broadcast."""
    def train(batch):
        for _ in range(epochs):
            learner.step(surrogate_gradient(learner.weights, batch, clip))
        for worker in workers:
            worker.set_weights(learner.weights)
        return len(batch['actions'])

    rollouts = ParallelRollouts(workers, mode='bulk_sync').combine(ConcatBatches(batch_size))
    return StandardMetricsReporting(rollouts.for_each(train), workers)


def driver(workers, rounds: int, batch_size: int, epochs: int, clip: float,
           learning_rate: float, results_path) -> None:
    learner = Adam(np.zeros((2, 5)), learning_rate)
    reports = ppo(workers, learner, batch_size, epochs, clip).take(rounds)
    report(reports, results_path,
           f'{rounds} rounds of at least {batch_size} steps from {len(workers)} workers')


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if min(_WORKERS.value, _ROUNDS.value, _BATCH.value, _EPOCHS.value) < 1:
        raise app.UsageError('--workers, --rounds, --batch and --epochs must be at least 1.')
    lp.launch(rollout_program('ppo_flow', _WORKERS.value, _SEED.value, driver, _ROUNDS.value,
                              _BATCH.value, _EPOCHS.value, _CLIP.value, _LEARNING_RATE.value,
                              _RESULTS.value))


if __name__ == '__main__':
    app.run(main)
