"""CartPole in numpy, a linear softmax policy, and a rollout worker node: what the RL examples
share (actor_learner.py, a3c_flow.py, ppo_flow.py). No ML framework needed.

A batch is a dict of numpy arrays, one row per step: 'inputs' (state features), 'actions',
'returns' (discounted return from that step to the episode's end) and 'probs' (the probability
the sampling policy gave the chosen action).
"""
from __future__ import annotations

import json
import math
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

Batch = Dict[str, np.ndarray]
DISCOUNT = 0.99


class CartPole:
    """The classic cart-pole: 4-D state (x, x', angle, angle'), two actions (push left/right)."""

    GRAVITY, CART_MASS, POLE_MASS, HALF_POLE, FORCE, DT = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._state = np.zeros(4)

    def reset(self) -> np.ndarray:
        self._state = self._rng.uniform(-0.05, 0.05, size=4)
        return self._state

    def step(self, action: int) -> Tuple[np.ndarray, bool]:
        """Advances 20 ms; returns the new state and whether the pole fell or the cart left."""
        x, speed, angle, spin = self._state
        total_mass = self.CART_MASS + self.POLE_MASS
        cos, sin = math.cos(angle), math.sin(angle)
        push = (self.FORCE if action == 1 else -self.FORCE)
        temp = (push + self.POLE_MASS * self.HALF_POLE * spin ** 2 * sin) / total_mass
        spin_acc = (self.GRAVITY * sin - cos * temp) / (
            self.HALF_POLE * (4 / 3 - self.POLE_MASS * cos ** 2 / total_mass))
        acc = temp - self.POLE_MASS * self.HALF_POLE * spin_acc * cos / total_mass
        self._state = np.array([x + self.DT * speed, speed + self.DT * acc,
                                angle + self.DT * spin, spin + self.DT * spin_acc])
        done = abs(self._state[0]) > 2.4 or abs(self._state[2]) > math.radians(12)
        return self._state, done


def features(state: np.ndarray) -> np.ndarray:
    return np.append(state, 1.0)


def action_probabilities(weights: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    logits = inputs @ weights.T
    logits = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=-1, keepdims=True)


def returns_to_go(length: int, discount: float = DISCOUNT) -> np.ndarray:
    """The discounted return from each step of an episode of `length` steps (+1 per step)."""
    steps = np.arange(length)[::-1]  # steps left after each step
    return (1 - discount ** (steps + 1)) / (1 - discount)


def play(env: CartPole, weights: np.ndarray, rng: np.random.Generator, max_steps: int) -> Batch:
    """One episode with the policy `weights`, as a batch."""
    state = env.reset()
    inputs, actions, probs = [], [], []
    for _ in range(max_steps):
        x = features(state)
        p_right = action_probabilities(weights, x)[1]
        action = int(rng.random() < p_right)
        inputs.append(x)
        actions.append(action)
        probs.append(p_right if action else 1 - p_right)
        state, done = env.step(action)
        if done:
            break
    return {'inputs': np.array(inputs), 'actions': np.array(actions),
            'returns': returns_to_go(len(actions)), 'probs': np.array(probs)}


def advantages(batch: Batch) -> np.ndarray:
    """Returns normalized over the batch: a simple baseline."""
    returns = batch['returns']
    return (returns - returns.mean()) / (returns.std() + 1e-8)


def policy_gradient(weights: np.ndarray, batch: Batch) -> np.ndarray:
    """The REINFORCE gradient of the expected return, per step of the batch."""
    chosen = np.eye(2)[batch['actions']] - action_probabilities(weights, batch['inputs'])
    return (chosen * advantages(batch)[:, None]).T @ batch['inputs'] / len(batch['actions'])


class Adam:
    """Adam steps of gradient ascent on a weight matrix."""

    def __init__(self, weights: np.ndarray, learning_rate: float):
        self.weights = weights
        self._learning_rate = learning_rate
        self._m = np.zeros_like(weights)
        self._v = np.zeros_like(weights)
        self._steps = 0

    def step(self, gradient: np.ndarray) -> np.ndarray:
        self._steps += 1
        self._m = 0.9 * self._m + 0.1 * gradient
        self._v = 0.999 * self._v + 0.001 * gradient ** 2
        m_hat = self._m / (1 - 0.9 ** self._steps)
        v_hat = self._v / (1 - 0.999 ** self._steps)
        self.weights = self.weights + self._learning_rate * m_hat / (np.sqrt(v_hat) + 1e-8)
        return self.weights


class RolloutWorker:
    """A rollout worker node: plays CartPole with the weights it was last given.

    `sample()` plays `episodes` episodes; `compute_gradients(batch)` is the policy gradient of a
    batch; `metrics()` returns the returns of the episodes finished since its last call.
    """

    def __init__(self, seed: int, episodes: int = 1, max_steps: int = 200):
        self._rng = np.random.default_rng(seed)
        self._env = CartPole(self._rng)
        self._episodes, self._max_steps = episodes, max_steps
        self._weights = np.zeros((2, 5))
        self._finished: List[float] = []
        self._lock = threading.Lock()

    def set_weights(self, weights: np.ndarray) -> None:
        self._weights = weights

    def sample(self) -> Batch:
        episodes = [play(self._env, self._weights, self._rng, self._max_steps)
                    for _ in range(self._episodes)]
        with self._lock:
            self._finished.extend(float(len(e['actions'])) for e in episodes)
        return {key: np.concatenate([e[key] for e in episodes]) for key in episodes[0]}

    def compute_gradients(self, batch: Batch) -> np.ndarray:
        return policy_gradient(self._weights, batch)

    def metrics(self) -> List[float]:
        with self._lock:
            finished, self._finished = self._finished, []
        return finished


def rollout_program(name: str, num_workers: int, seed: int, driver: Callable[..., None],
                    *driver_args: Any) -> Any:
    """A program of `num_workers` RolloutWorker nodes (group 'worker') and a driver node that runs
    `driver(workers, *driver_args)`."""
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    program = lp.Program(name)
    with program.group('worker'):
        workers = [program.add_node(lp.CourierNode(RolloutWorker, seed * 1000 + i))
                   for i in range(num_workers)]
    program.add_node(lp.PyNode(driver, workers, *driver_args), label='driver')
    return program


def report(reports: List[Dict[str, Any]], results_path: Optional[str], how: str) -> None:
    """Writes the metrics reports to `results_path` (JSON, if given) and prints how the average
    return rose from the first to the last 20 episodes, then stops the program."""
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    returns = [r for entry in reports for r in entry['returns']]
    if results_path:
        with open(results_path, 'w') as f:
            json.dump({'returns': returns, 'reports': [
                {k: v for k, v in entry.items() if k != 'info'} for entry in reports]}, f)
    print(f'Average return rose from {np.mean(returns[:20]):.1f} (first 20 episodes) to '
          f'{np.mean(returns[-20:]):.1f} (last 20) in {how}.', flush=True)
    lp.stop()
