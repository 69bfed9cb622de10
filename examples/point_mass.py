"""The evolution strategies examples' task: a 2-D point mass that a tanh-linear policy must push
to the origin and hold there (evolution_strategies.py, es_pool.py). Plain numpy, no flags, so
that worker processes can import it.
"""
from __future__ import annotations

import numpy as np

_STARTS = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
_STEPS = 100
_DT = 0.05
DIM = 2 * 4 + 2  # a 2x4 weight matrix on (position, velocity) and a bias per force component


def episode_return(params: np.ndarray) -> float:
    """Minus the time-integrated squared distance to the origin, averaged over the start points."""
    weights, bias = params[:8].reshape(2, 4), params[8:]
    position = _STARTS.copy()
    velocity = np.zeros_like(position)
    cost = 0.0
    for _ in range(_STEPS):
        force = np.tanh(np.concatenate([position, velocity], axis=1) @ weights.T + bias)
        velocity = velocity + _DT * (force - 0.1 * velocity)
        position = position + _DT * velocity
        cost += _DT * float(np.mean(np.sum(position ** 2, axis=1)))
    return -cost


def perturbation(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM)


def centered_ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank among all, scaled to [-0.5, 0.5] (ES's fitness shaping)."""
    ranks = np.empty(values.size)
    ranks[values.ravel().argsort()] = np.arange(values.size)
    return (ranks / (values.size - 1) - 0.5).reshape(values.shape)
