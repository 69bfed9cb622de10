"""Elastic actors: the number of CartPole actors follows the learner's progress (MinionsRL).

Topology (an elastic group of actors, 1 to --max_actors):

    learner/0   a PyNode training in on-policy rounds, as MinionsRL does: each round it sends the
         |      policy to every live actor, has each play --episodes episodes (`call_all` on the
         v      actors' group handle: whoever is a member now), makes one REINFORCE step on all of
    actor/*     them, and reports its progress (`lp.report(avg_return=...)`)
                CourierNodes serving cartpole.RolloutWorker (set_weights, sample)

The launcher asks the scaling policy every --interval seconds for the actors' size:
`lp.ProgressPerActorPolicy` grows the actors while the learner's progress (the growth of its
average return) per actor improves and shrinks them when it does not, within [1, --max_actors]
and a --budget of actor-seconds. The learner stops the program once the average return of the
last rounds reaches --target (or after --rounds rounds); then the script writes a plot of the
actors and the average return over time (--plot; needs matplotlib, from the plot extra:
pip install 'launchpad-ml[plot]') and prints the scaling decisions.

    python -m launchpad.launch --type=local_mp examples/elastic_actors.py --plot=elastic.png
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
from cartpole import Adam, RolloutWorker, policy_gradient  # noqa: E402  (beside this file)

_ACTORS = flags.DEFINE_integer('actors', 1, 'Actors at the start.')
_MAX_ACTORS = flags.DEFINE_integer('max_actors', 6, 'Most actors the policy may start.')
_EPISODES = flags.DEFINE_integer('episodes', 2, 'Episodes each actor plays per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 1000, 'Most training rounds.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.03, 'Step size of the (Adam) updates.')
_STEP_MS = flags.DEFINE_float('step_ms', 0.3, 'Milliseconds an environment step takes (numpy '
                              'CartPole takes microseconds; real simulators take longer).')
_TARGET = flags.DEFINE_float('target', 190.0, 'Average return (last 5 rounds) that ends training.')
_INTERVAL = flags.DEFINE_float('interval', 0.5, 'Seconds between two asks of the scaling policy.')
_ROUND = flags.DEFINE_float('policy_round', 1.5, 'Seconds over which the policy measures progress.')
_BUDGET = flags.DEFINE_float('budget', None, 'Actor-seconds the actors may use in all.')
_SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
_RESULTS = flags.DEFINE_string('results', None, 'Write the timeline and decisions to this JSON.')
_PLOT = flags.DEFINE_string('plot', None, 'Write the plot of actors and return to this PNG.')

_WINDOW = 5  # rounds averaged for the average return


class Actor(RolloutWorker):
    """A rollout worker whose environment steps take `step_ms` milliseconds each."""

    def __init__(self, seed: int, episodes: int, step_ms: float):
        super().__init__(seed, episodes)
        self._step_seconds = step_ms / 1000

    def sample(self):
        batch = super().sample()
        time.sleep(len(batch['actions']) * self._step_seconds)
        return batch


def learner(actors, episodes: int, rounds: int, learning_rate: float, target: float,
            results_path: Optional[str]) -> None:
    """Trains in rounds on whichever actors are members; records (time, actors, return)."""
    adam = Adam(np.zeros((2, 5)), learning_rate=learning_rate)
    returns: List[float] = []
    timeline = []
    started = time.monotonic()
    stop = lp.stop_event()
    for round_index in range(rounds):
        if stop.is_set():
            return
        weights = adam.weights
        actors.call_all('set_weights', weights)
        batches = actors.call_all('sample')  # {actor name: batch} from the live actors
        if not batches:
            stop.wait(0.1)  # no actor yet (or all left): wait for the group to grow
            continue
        gradients = [policy_gradient(weights, b) for b in batches.values()]
        adam.step(np.mean(gradients, axis=0))
        returns.append(float(np.mean([len(b['actions']) for b in batches.values()])) / episodes)
        average = float(np.mean(returns[-_WINDOW:]))
        lp.report(avg_return=average, actors=len(batches))
        timeline.append((time.monotonic() - started, len(batches), average))
        if average >= target and len(returns) >= _WINDOW:
            break
    print(f'Average return {np.mean(returns[:_WINDOW]):.1f} in the first {_WINDOW} rounds, '
          f'{np.mean(returns[-_WINDOW:]):.1f} in the last {_WINDOW}, after {len(returns)} rounds '
          f'and {timeline[-1][0]:.1f} s, with 1 to {max(n for _, n, _ in timeline)} actors.',
          flush=True)
    if results_path:
        with open(results_path, 'w') as f:
            json.dump({'timeline': timeline}, f)
    lp.stop()


def make_program(actors: int, max_actors: int, episodes: int, step_ms: float, rounds: int,
                 learning_rate: float, target: float, budget: Optional[float],
                 policy_round: float, interval: float, seed: int,
                 results_path: Optional[str]) -> lp.Program:
    program = lp.Program('elastic_actors')
    seeds = iter(range(seed * 1000, seed * 1000 + 1000))

    def make_actor():
        return lp.CourierNode(Actor, next(seeds), episodes, step_ms)

    elastic = lp.Elastic(make_node=make_actor, min_size=1, max_size=max_actors, budget=budget)
    with program.group('actor', elastic=elastic):
        for _ in range(actors):
            program.add_node(make_actor())
    program.add_node(lp.PyNode(learner, program.group_handle('actor'), episodes, rounds,
                               learning_rate, target, results_path), label='learner')
    program.set_scaling_policy(lp.ProgressPerActorPolicy(
        actors='actor', learner='learner', metric='avg_return', round=policy_round),
        interval=interval)
    return program


def check_plotting() -> None:
    """--plot needs matplotlib, which only the `plot` extra installs: say so before the run."""
    try:
        import matplotlib  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as error:
        sys.exit(f"--plot needs matplotlib ({error}); install it with "
                 "pip install 'launchpad-ml[plot]' (or drop --plot).")


def plot(path: str, timeline, decisions) -> None:
    """Actors and average return against time, with the policy's decisions."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    times = [t for t, _, _ in timeline]
    figure, left = plt.subplots(figsize=(8, 4.5))
    left.step(times, [n for _, n, _ in timeline], where='post', color='tab:blue',
              label='actors in the round')
    for decision in decisions:
        left.axvline(decision.time, color='tab:blue', alpha=0.15)
    left.set_xlabel('seconds since launch')
    left.set_ylabel('actors', color='tab:blue')
    right = left.twinx()
    right.plot(times, [r for _, _, r in timeline], color='tab:orange',
               label='average return (learner progress)')
    right.set_ylabel('average return', color='tab:orange')
    left.set_title('Elastic actors: ProgressPerActorPolicy on CartPole (faint lines: decisions)')
    left.yaxis.get_major_locator().set_params(integer=True)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles, [h.get_label() for h in handles], loc='upper left')
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if not 1 <= _ACTORS.value <= _MAX_ACTORS.value:
        raise app.UsageError('--actors must be between 1 and --max_actors.')
    if _PLOT.value:
        check_plotting()
    results = _RESULTS.value or (os.path.splitext(_PLOT.value)[0] + '.json' if _PLOT.value
                                 else None)
    program = make_program(_ACTORS.value, _MAX_ACTORS.value, _EPISODES.value, _STEP_MS.value,
                           _ROUNDS.value, _LEARNING_RATE.value, _TARGET.value, _BUDGET.value,
                           _ROUND.value, _INTERVAL.value, _SEED.value,
                           os.path.abspath(results) if results else None)
    controller = lp.launch(program)
    controller.wait()
    decisions = controller.scaling_log
    for d in decisions:
        print(f'  at {d.time:5.1f} s: actors {d.size} -> {d.target} (asked {d.wanted}'
              f'{", " + d.reason if d.reason else ""}; {d.spent:.0f} actor-s used)')
    if results:
        with open(results) as f:
            data = json.load(f)
        data['decisions'] = [vars(d) for d in decisions]
        with open(results, 'w') as f:
            json.dump(data, f)
        if _PLOT.value:
            plot(_PLOT.value, data['timeline'], decisions)
            print(f'Wrote {_PLOT.value}.')


if __name__ == '__main__':
    app.run(main)
