"""A3C as a dataflow (RLlib Flow's Listing A1): rollout workers compute policy gradients on their
own samples, asynchronously; the driver applies each gradient as it comes and sends the new
weights back to the worker that computed it.

Topology (N workers):

    worker/0 .. worker/N-1   CourierNodes (cartpole.RolloutWorker): sample() plays an episode of
         ^    |              CartPole with the worker's weights; compute_gradients(batch) is the
         |    v              policy gradient of that episode
    driver/0   the dataflow below; prints how the average return rose and stops the program

    python -m launchpad.launch --type=local_mp examples/a3c_flow.py --workers=2
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

import numpy as np
from absl import app, flags

import launchpad as lp
from launchpad.dataflow import ParallelRollouts, StandardMetricsReporting

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cartpole import Adam, report, rollout_program  # noqa: E402  (beside this file)

_WORKERS = flags.DEFINE_integer('workers', 2, 'Number of rollout workers.')
_UPDATES = flags.DEFINE_integer('updates', 150, 'Gradients to apply before stopping.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.05, 'Step size of the (Adam) updates.')
_SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
_RESULTS = flags.DEFINE_string('results', None, 'Also write the metrics after every update to '
                                                'this JSON file.')


def a3c(workers, learner: Adam):
    """The whole algorithm: a dozen lines of dataflow."""
    for worker in workers:
        worker.set_weights(learner.weights)
    grads = ParallelRollouts(workers, mode='raw').par_for_each('compute_gradients').gather_async()
    apply_op = grads.zip_with_source_actor().for_each(
        lambda pair: pair[0].set_weights(learner.step(pair[1])))
    return StandardMetricsReporting(apply_op, workers)


def driver(workers, updates: int, learning_rate: float, results_path) -> None:
    learner = Adam(np.zeros((2, 5)), learning_rate)
    reports = a3c(workers, learner).take(updates)
    report(reports, results_path, f'{updates} asynchronous updates from {len(workers)} workers')


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if min(_WORKERS.value, _UPDATES.value) < 1:
        raise app.UsageError('--workers and --updates must be at least 1.')
    lp.launch(rollout_program('a3c_flow', _WORKERS.value, _SEED.value, driver, _UPDATES.value,
                              _LEARNING_RATE.value, _RESULTS.value))


if __name__ == '__main__':
    app.run(main)
