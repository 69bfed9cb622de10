"""Actor-learner: actors play CartPole with the current policy, a learner improves the policy.

Topology (N actors):

    actor/0 .. actor/N-1   each fetches the latest policy, plays one episode of CartPole with it,
         |    ^            sends the trajectory to the learner, and repeats
         v    |
    learner/0   a CourierNode: `params()` hands out the policy; `learn()` takes trajectories and
                makes a policy-gradient (REINFORCE) step for every --batch of them. Once it has
                seen --episodes episodes it answers each actor that it is done; when every actor
                has been told, it prints how the average return changed and stops the program.

CartPole (balance a pole on a cart by pushing it left or right; +1 reward per step, at most
--max_steps) is simulated with the classic cart-pole equations in numpy (cartpole.py, shared
with the dataflow examples); the policy is a linear softmax over the four state variables.
Actors may play with a slightly old policy while the learner updates: the updates are
asynchronous, as in the paper.

    python -m launchpad.launch --type=local_mp examples/actor_learner.py --actors=4
"""
from __future__ import annotations

import json
import os
import sys
import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np
from absl import app, flags

import launchpad as lp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cartpole import CartPole, action_probabilities, features  # noqa: E402  (beside this file)

_ACTORS = flags.DEFINE_integer('actors', 2, 'Number of actors.')
_EPISODES = flags.DEFINE_integer('episodes', 200, 'Episodes to learn from before stopping.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Episodes per policy update.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.1, 'Step size of the (Adam) updates.')
_MAX_STEPS = flags.DEFINE_integer('max_steps', 200, 'Longest episode (the best return).')
_SEED = flags.DEFINE_integer('seed', 0, 'Random seed.')
_RESULTS = flags.DEFINE_string('results', None, 'Also write every episode\'s return to this '
                                                'JSON file.')

_WINDOW = 20  # episodes averaged at the start and at the end for the summary


class Learner:
    """Serves the policy and improves it with REINFORCE on the trajectories actors send."""

    def __init__(self, episodes: int, batch: int, learning_rate: float, num_actors: int,
                 results_path: Optional[str]):
        self._episodes = episodes
        self._batch = batch
        self._learning_rate = learning_rate
        self._num_actors = num_actors
        self._results_path = results_path
        self._lock = threading.Lock()
        self._weights = np.zeros((2, 5))
        self._adam_m = np.zeros_like(self._weights)
        self._adam_v = np.zeros_like(self._weights)
        self._updates = 0
        self._pending: List[Tuple[np.ndarray, np.ndarray]] = []
        self._returns: List[float] = []
        self._actors_told = 0
        self._all_told = threading.Event()

    def params(self) -> np.ndarray:
        with self._lock:
            return self._weights

    def learn(self, inputs: np.ndarray, actions: np.ndarray) -> bool:
        """Takes one episode; returns False (once per actor) when the learner has had enough."""
        with self._lock:
            if len(self._returns) >= self._episodes:
                self._actors_told += 1
                if self._actors_told == self._num_actors:
                    self._all_told.set()
                return False
            self._returns.append(float(len(actions)))
            self._pending.append((inputs, actions))
            if len(self._pending) == self._batch:
                self._update(self._pending)
                self._pending = []
            return True

    def _update(self, episodes: List[Tuple[np.ndarray, np.ndarray]], discount: float = 0.99):
        returns_to_go = []
        for _, actions in episodes:
            steps = np.arange(len(actions))[::-1]  # steps left after each step
            returns_to_go.append((1 - discount ** (steps + 1)) / (1 - discount))
        every = np.concatenate(returns_to_go)
        mean, std = every.mean(), every.std() + 1e-8
        gradient = np.zeros_like(self._weights)
        for (inputs, actions), to_go in zip(episodes, returns_to_go):
            advantage = (to_go - mean) / std
            chosen = np.eye(2)[actions] - action_probabilities(self._weights, inputs)
            gradient += (chosen * advantage[:, None]).T @ inputs
        gradient /= len(every)
        self._updates += 1
        self._adam_m = 0.9 * self._adam_m + 0.1 * gradient
        self._adam_v = 0.999 * self._adam_v + 0.001 * gradient ** 2
        step = (self._adam_m / (1 - 0.9 ** self._updates)) / (
            np.sqrt(self._adam_v / (1 - 0.999 ** self._updates)) + 1e-8)
        self._weights = self._weights + self._learning_rate * step

    def run(self) -> None:
        """Waits until every actor has been told to finish, reports, and stops the program.

        Stopping only then means no actor is left calling a learner that is gone.
        """
        lp.register_stop_handler(self._all_told.set)  # or until a failure stops the program
        self._all_told.wait()
        if len(self._returns) < self._episodes:
            return
        with self._lock:
            returns, updates = list(self._returns), self._updates
        if self._results_path:
            with open(self._results_path, 'w') as f:
                json.dump({'returns': returns, 'updates': updates}, f)
        window = min(_WINDOW, len(returns))
        print(f'Average return rose from {np.mean(returns[:window]):.1f} (first {window} '
              f'episodes) to {np.mean(returns[-window:]):.1f} (last {window}) over {len(returns)} '
              f'episodes from {self._num_actors} actors and {updates} policy updates.', flush=True)
        lp.stop()


class Actor:
    """Plays episodes with the learner's latest policy and sends them to the learner."""

    def __init__(self, learner, seed: int, max_steps: int):
        self._learner = learner
        self._rng = np.random.default_rng(seed)
        self._env = CartPole(self._rng)
        self._max_steps = max_steps

    def run(self) -> None:
        while not lp.stop_event().is_set():
            inputs, actions = self._episode(self._learner.params())
            try:
                more = self._learner.learn(inputs, actions)
            except Exception:  # pylint: disable=broad-except
                if lp.wait_for_stop(5.0):
                    return  # the learner told the last actor to finish and stopped the program
                raise
            if not more:
                return

    def _episode(self, weights: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        state = self._env.reset()
        inputs, actions = [], []
        for _ in range(self._max_steps):
            x = features(state)
            action = int(self._rng.random() < action_probabilities(weights, x)[1])
            inputs.append(x)
            actions.append(action)
            state, done = self._env.step(action)
            if done:
                break
        return np.array(inputs), np.array(actions)


def make_program(num_actors: int, episodes: int, batch: int, learning_rate: float,
                 max_steps: int, seed: int, results_path: Optional[str]) -> lp.Program:
    program = lp.Program('actor_learner')
    learner = program.add_node(
        lp.CourierNode(Learner, episodes, batch, learning_rate, num_actors, results_path),
        label='learner')
    with program.group('actor'):
        for i in range(num_actors):
            program.add_node(lp.PyClassNode(Actor, learner, seed * 1000 + i, max_steps))
    return program


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if min(_ACTORS.value, _EPISODES.value, _BATCH.value, _MAX_STEPS.value) < 1:
        raise app.UsageError('--actors, --episodes, --batch and --max_steps must be at least 1.')
    lp.launch(make_program(_ACTORS.value, _EPISODES.value, _BATCH.value, _LEARNING_RATE.value,
                           _MAX_STEPS.value, _SEED.value, _RESULTS.value))


if __name__ == '__main__':
    app.run(main)
