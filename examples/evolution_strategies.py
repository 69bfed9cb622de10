"""Evolution strategies: an Evolver improves a policy by scoring perturbations on N Evaluators.

Topology (N evaluators):

    evolver/0  each generation draws P/2 random seeds, sends each evaluator its share through
        |      futures (as processes, all evaluators work at once), turns the scores into a
        |      gradient estimate and steps the policy; it prints progress and stops the program
        v
    evaluator/0 .. evaluator/N-1   rebuild each perturbation from its seed and score the policy
                                   with it added and subtracted (antithetic pairs)

Only seeds and scores travel, never the perturbations (the shared-seed trick of Salimans et al.,
2017). The task is a 2-D point mass that a tanh-linear policy must push to the origin and hold
there, from four starting points; the score is minus the time-integrated squared distance (0 is
perfect; a policy that does nothing scores -5). The dynamics are a few lines of numpy
(point_mass.py, shared with es_pool.py).

    python -m launchpad.launch --type=local_mp examples/evolution_strategies.py --evaluators=4
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import List, Optional, Sequence

import numpy as np
from absl import app, flags

import launchpad as lp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from point_mass import DIM, centered_ranks, episode_return, perturbation  # noqa: E402

_EVALUATORS = flags.DEFINE_integer('evaluators', 2, 'Number of evaluator nodes.')
_GENERATIONS = flags.DEFINE_integer('generations', 30, 'Number of generations.')
_POPULATION = flags.DEFINE_integer('population', 32, 'Perturbations per generation (even).')
_SIGMA = flags.DEFINE_float('sigma', 0.1, 'Standard deviation of the perturbations.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.1, 'Step size of the policy update.')
_SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
_HISTORY = flags.DEFINE_string('history', None,
                               'Also write every generation\'s score and, for each evaluation, when '
                               'its request was sent, it started, it ended and its result was '
                               'received (wall clock), to this JSON file.')

class Evaluator:
    """Scores antithetic pairs of perturbations of the policy."""

    def __init__(self, index: int):
        self._index = index

    def evaluate(self, params: np.ndarray, seeds: List[int], sigma: float) -> dict:
        start = time.time()
        scores = [(episode_return(params + sigma * perturbation(seed)),
                   episode_return(params - sigma * perturbation(seed))) for seed in seeds]
        return {'evaluator': self._index, 'scores': scores, 'start': start, 'end': time.time()}


def _overlapped(evaluations: Sequence[dict]) -> bool:
    """True if some two evaluations were in progress at the same moment."""
    return max(e['start'] for e in evaluations) < min(e['end'] for e in evaluations)


class Evolver:
    """Runs the generations; each one asks every evaluator at once and waits for all."""

    def __init__(self, evaluators: Sequence, generations: int, population: int, sigma: float,
                 learning_rate: float, seed: int, history_path: Optional[str]):
        self._evaluators = list(evaluators)
        self._generations = generations
        self._pairs = population // 2
        self._sigma = sigma
        self._learning_rate = learning_rate
        self._rng = np.random.default_rng(seed)
        self._history_path = history_path

    def run(self) -> None:
        params = np.zeros(DIM)
        first = episode_return(params)
        history = []
        for generation in range(1, self._generations + 1):
            seeds = [int(s) for s in self._rng.integers(2 ** 31, size=self._pairs)]
            shares = [seeds[i::len(self._evaluators)] for i in range(len(self._evaluators))]
            futures, sent = [], []
            for evaluator, share in zip(self._evaluators, shares):
                if share:
                    futures.append(evaluator.futures.evaluate(params, share, self._sigma))
                    sent.append(time.time())
            evaluations = [dict(future.result(), sent=at, received=time.time())
                           for future, at in zip(futures, sent)]
            used = [seed for e, share in zip(evaluations, shares) for seed in share]
            scores = np.array([pair for e in evaluations for pair in e['scores']])
            ranks = centered_ranks(scores)
            gradient = sum((r_plus - r_minus) * perturbation(seed)
                           for seed, (r_plus, r_minus) in zip(used, ranks))
            params = params + self._learning_rate / (len(used) * self._sigma) * gradient
            score = episode_return(params)
            history.append({'generation': generation, 'score': score,
                            'evaluations': [{key: e[key] for key in
                                             ('evaluator', 'sent', 'start', 'end', 'received')}
                                            for e in evaluations]})
            if generation % 5 == 0 or generation == self._generations:
                print(f'generation {generation:3d}: score {score:7.3f}', flush=True)
        if self._history_path:
            with open(self._history_path, 'w') as f:
                json.dump({'initial_score': first, 'history': history}, f)
        overlapped = sum(_overlapped(entry['evaluations']) for entry in history)
        print(f'Score improved from {first:.3f} to {history[-1]["score"]:.3f} in '
              f'{self._generations} generations of {2 * self._pairs} perturbations on '
              f'{len(self._evaluators)} evaluators; evaluations ran concurrently in '
              f'{overlapped} of {self._generations} generations.', flush=True)
        lp.stop()


def make_program(num_evaluators: int, generations: int, population: int, sigma: float,
                 learning_rate: float, seed: int, history_path: Optional[str]) -> lp.Program:
    program = lp.Program('evolution_strategies')
    with program.group('evaluator'):
        evaluators = [program.add_node(lp.CourierNode(Evaluator, i)) for i in range(num_evaluators)]
    program.add_node(lp.PyClassNode(Evolver, evaluators, generations, population, sigma,
                                    learning_rate, seed, history_path), label='evolver')
    return program


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if _POPULATION.value < 2 or _POPULATION.value % 2:
        raise app.UsageError('--population must be an even number, at least 2.')
    if _EVALUATORS.value < 1 or _GENERATIONS.value < 1:
        raise app.UsageError('--evaluators and --generations must be at least 1.')
    lp.launch(make_program(_EVALUATORS.value, _GENERATIONS.value, _POPULATION.value,
                           _SIGMA.value, _LEARNING_RATE.value, _SEED.value, _HISTORY.value))


if __name__ == '__main__':
    app.run(main)
