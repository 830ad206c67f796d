"""Fitness shaping: raw rewards -> the weights of the ES update.

`per_prompt` normalises before averaging: each prompt's fitness is z-scored across the
candidates evaluated on it (GRPO's group normalisation, with the population as the group),
and a candidate's fitness is then its mean over its prompts, so prompts whose rewards spread
widely (hard ones, long ones) no longer dominate the update. The ES update z-scores those
means again, so `lr` keeps the scale it has under `zscore`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from evora.strategies.protocol import GenerationResults

PER_PROMPT = "per_prompt"


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
    return (average_ranks(f) - 1) / (len(f) - 1) - 0.5


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span: scipy.stats.rankdata's
    method="average" (the test compares the two), without importing scipy.stats into the
    driver (1.6 s of every run's start)."""
    if np.isnan(values).any():  # as rankdata's nan_policy="propagate"
        return np.full(len(values), np.nan)
    order = np.argsort(values, kind="stable")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranks


def nes_utilities(fitness: np.ndarray) -> np.ndarray:
    """NES's rank utilities (Wierstra et al. 2014; SNES, Schaul et al. 2011): the k-th best of
    N gets max(0, log(N/2 + 1) - log k), normalised to sum 1, less 1/N. Ties share the mean of
    the utilities their ranks span (as `centered_ranks` shares ranks), so the sum is unchanged."""
    f = np.asarray(fitness, dtype=np.float64)
    n = len(f)
    if n == 0:
        return f
    worst_first = np.maximum(0.0, math.log(n / 2 + 1) - np.log(n - np.arange(n)))
    by_rank = worst_first / worst_first.sum() - 1 / n
    order = np.argsort(f, kind="stable")
    _, first, counts = np.unique(f[order], return_index=True, return_counts=True)
    shared = np.add.reduceat(by_rank, first) / counts
    utilities = np.empty(n)
    utilities[order] = np.repeat(shared, counts)
    return utilities


def per_prompt(cells: np.ndarray, evaluated: np.ndarray | None = None) -> np.ndarray:
    """[candidate, prompt] fitness -> per candidate: the mean over its evaluated prompts of the
    prompt's fitness z-scored across the candidates evaluated on it (0 where they all tie)."""
    values = np.asarray(cells, dtype=np.float64)
    mask = np.ones(values.shape, dtype=bool) if evaluated is None else np.asarray(evaluated, dtype=bool)
    counts = mask.sum(axis=0)
    means = np.where(mask, values, 0.0).sum(axis=0) / np.maximum(counts, 1)
    spread = np.sqrt(np.where(mask, (values - means) ** 2, 0.0).sum(axis=0) / np.maximum(counts, 1))
    z = np.divide(values - means, spread, out=np.zeros_like(values), where=mask & (spread > 0))
    rows = mask.sum(axis=1)
    return np.divide(z.sum(axis=1), rows, out=np.zeros(len(rows)), where=rows > 0)


SHAPERS = {
    "zscore": zscore,
    "centered_rank": centered_ranks,
    "nes": nes_utilities,
    "none": lambda f: np.asarray(f, dtype=np.float64),
    PER_PROMPT: zscore,  # of the per-prompt means (`shaping_input`)
}
SHAPINGS = tuple(SHAPERS)


def shaping_input(results: GenerationResults, method: str) -> np.ndarray:
    """What a strategy shapes from a generation: its fitness, or under `per_prompt` the
    per-prompt normalised means of the cells' fitness."""
    if method != PER_PROMPT:
        return results.fitness
    cells = results.cell_fitness if results.cell_fitness is not None else results.rewards
    return per_prompt(cells, results.evaluated)


def shape(fitness: np.ndarray, method: str) -> np.ndarray:
    return SHAPERS[method](fitness)
