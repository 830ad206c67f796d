"""Fitness shaping: raw rewards -> the weights of the ES update."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def zscore(fitness: np.ndarray) -> np.ndarray:
    """(f - mean) / std, as in the ES paper; all zeros when every candidate ties."""
    f = np.asarray(fitness, dtype=np.float64)
    std = f.std()
    if std == 0:
        return np.zeros_like(f)
    return (f - f.mean()) / std


def centered_ranks(fitness: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5]. Ties share their average rank: greedy decoding makes
    many candidates score the same, and breaking those ties arbitrarily adds pure noise."""
    f = np.asarray(fitness, dtype=np.float64)
    if len(f) < 2:
        return np.zeros_like(f)
    return (rankdata(f, method="average") - 1) / (len(f) - 1) - 0.5


SHAPERS = {"zscore": zscore, "centered_rank": centered_ranks, "none": lambda f: np.asarray(f, dtype=np.float64)}


def shape(fitness: np.ndarray, method: str) -> np.ndarray:
    return SHAPERS[method](fitness)
