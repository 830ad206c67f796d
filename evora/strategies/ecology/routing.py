"""Routing: a bandit per task family over the living organelles, on episode ROI.

UCB: mean ROI + exploration x sqrt(ln(family episodes) / organelle's episodes), an untried
organelle first. Thompson: a draw from N(mean ROI, exploration^2 / (1 + episodes)). Within
a generation each routed episode counts at once (a virtual visit), so one family's episodes
spread over organelles instead of all going to one. Ties go to the lower position.
"""

from __future__ import annotations

import math

import numpy as np

from evora.strategies.ecology.economy import Organelle


def _counts(organelles: list[Organelle], family: str) -> tuple[np.ndarray, np.ndarray]:
    stats = [o.families.get(family, [0, 0.0, 0.0, 0.0]) for o in organelles]
    return np.array([int(s[0]) for s in stats], dtype=np.int64), np.array([float(s[1]) for s in stats])


def route(
    organelles: list[Organelle],
    families: list[str],
    router: str,
    exploration: float,
    rng: np.random.Generator,
) -> list[int]:
    """The organelle position serving each episode, given the episodes' families in order.
    Scores are whole-array float64 operations (each element rounded as the scalar formula
    rounds it): linear in organelles per episode, not a Python loop over them."""
    visits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    picks = []
    for family in families:
        if family not in visits:
            visits[family] = _counts(organelles, family)
        counts, rois = visits[family]
        score = _ucb(counts, rois, exploration) if router == "ucb" else _thompson(counts, rois, exploration, rng)
        pick = int(np.argmax(score))  # the first of the best: ties go to the lower position
        counts[pick] += 1  # a virtual visit at the organelle's current mean
        rois[pick] += rois[pick] / max(int(counts[pick]) - 1, 1) if counts[pick] > 1 else 0.0
        picks.append(pick)
    return picks


def _ucb(counts: np.ndarray, rois: np.ndarray, exploration: float) -> np.ndarray:
    bonus = math.log(max(int(counts.sum()), 1))
    tried = np.maximum(counts, 1)
    return np.where(counts == 0, math.inf, rois / tried + exploration * np.sqrt(bonus / tried))


def _thompson(counts: np.ndarray, rois: np.ndarray, exploration: float, rng: np.random.Generator) -> np.ndarray:
    means = rois / np.maximum(counts, 1)  # 0 where untried (rois is 0 there)
    return rng.normal(means, exploration / np.sqrt(1 + counts))
