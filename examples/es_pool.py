"""Evolution strategies as a pool map (Fiber's example): a plain script whose `lp.Pool` launches
worker nodes and scores every generation's perturbations on them with `pool.starmap`.

    script (the evolver)       lp.Pool(N) -- starmap(evaluate, pairs) --> pool/0 .. pool/N-1

The task (a point mass pushed to the origin by a tanh-linear policy) and the update are those of
evolution_strategies.py, whose flags this script shares (--evaluators aside: here --workers).
With --kill_worker_at=G, the first task of generation G SIGKILLs its worker the first time it
runs: the pool re-runs the worker's tasks on the others, the worker is restarted, and the
scores, hence the whole run, are the same as without the kill.

    python -m launchpad.launch --type=local_mp examples/es_pool.py --workers=4
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Optional, Sequence

import numpy as np
from absl import app, flags

import launchpad as lp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evolution_strategies  # noqa: E402,F401  (its flags: --generations, --population, ...)
from point_mass import DIM, centered_ranks, episode_return, perturbation  # noqa: E402

FLAGS = flags.FLAGS
_WORKERS = flags.DEFINE_integer('workers', 2, 'Number of pool workers.')
_KILL_AT = flags.DEFINE_integer('kill_worker_at', 0, 'Generation in which a worker is killed '
                                                     'mid-map (0: never).')


def evaluate(params: np.ndarray, seed: int, sigma: float, die_marker: Optional[str]) -> tuple:
    """The scores of one antithetic pair of perturbations."""
    if die_marker is not None:
        try:
            os.close(os.open(die_marker, os.O_CREAT | os.O_EXCL))  # only the first run dies
            os.kill(os.getpid(), signal.SIGKILL)
        except FileExistsError:
            pass
    return (episode_return(params + sigma * perturbation(seed)),
            episode_return(params - sigma * perturbation(seed)))


def evolve(pool: lp.Pool, generations: int, pairs: int, sigma: float, learning_rate: float,
           seed: int, kill_at: int, scratch: str) -> list:
    rng = np.random.default_rng(seed)
    params = np.zeros(DIM)
    scores = []
    for generation in range(1, generations + 1):
        seeds = [int(s) for s in rng.integers(2 ** 31, size=pairs)]
        marker = os.path.join(scratch, 'died') if generation == kill_at else None
        tasks = [(params, s, sigma, marker if i == 0 else None) for i, s in enumerate(seeds)]
        ranks = centered_ranks(np.array(pool.starmap(evaluate, tasks, chunksize=1)))
        gradient = sum((plus - minus) * perturbation(s) for s, (plus, minus) in zip(seeds, ranks))
        params = params + learning_rate / (pairs * sigma) * gradient
        scores.append(episode_return(params))
        if generation % 5 == 0 or generation == generations:
            print(f'generation {generation:3d}: score {scores[-1]:7.3f}', flush=True)
    return scores


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if FLAGS.population < 2 or FLAGS.population % 2 or min(_WORKERS.value, FLAGS.generations) < 1:
        raise app.UsageError('--population must be even and at least 2; --workers and '
                             '--generations at least 1.')
    scratch = tempfile.mkdtemp(prefix='es-pool-')
    try:
        with lp.Pool(_WORKERS.value, launch_type=lp.LAUNCH_TYPE.value) as pool:
            scores = evolve(pool, FLAGS.generations, FLAGS.population // 2, FLAGS.sigma,
                            FLAGS.learning_rate, FLAGS.seed, _KILL_AT.value, scratch)
            stats = dict(pool.stats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if FLAGS.history:
        with open(FLAGS.history, 'w') as f:
            json.dump({'initial_score': episode_return(np.zeros(DIM)), 'scores': scores,
                       'pool': stats}, f)
    print(f'Score improved from {episode_return(np.zeros(DIM)):.3f} to {scores[-1]:.3f} in '
          f'{FLAGS.generations} generations of {FLAGS.population} perturbations on '
          f'{_WORKERS.value} pool workers; {stats.get("lost", 0)} worker(s) lost, '
          f'{stats.get("requeued", 0)} task(s) re-run.', flush=True)


if __name__ == '__main__':
    app.run(main)
