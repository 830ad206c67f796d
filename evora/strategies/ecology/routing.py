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


def _counts(organelles: list[Organelle], family: str) -> tuple[list[int], list[float]]:
    stats = [o.families.get(family, [0, 0.0, 0.0, 0.0]) for o in organelles]
    return [int(s[0]) for s in stats], [float(s[1]) for s in stats]


def route(
    organelles: list[Organelle],
    families: list[str],
    router: str,
    exploration: float,
    rng: np.random.Generator,
) -> list[int]:
    """The organelle position serving each episode, given the episodes' families in order."""
    visits: dict[str, tuple[list[int], list[float]]] = {}
    picks = []
    for family in families:
        if family not in visits:
            visits[family] = _counts(organelles, family)
        counts, rois = visits[family]
        score = _ucb(counts, rois, exploration) if router == "ucb" else _thompson(counts, rois, exploration, rng)
        pick = max(range(len(organelles)), key=lambda i: (score[i], -i))
        counts[pick] += 1  # a virtual visit at the organelle's current mean
        rois[pick] += rois[pick] / max(counts[pick] - 1, 1) if counts[pick] > 1 else 0.0
        picks.append(pick)
    return picks


def _ucb(counts: list[int], rois: list[float], exploration: float) -> list[float]:
    total = sum(counts)
    return [
        math.inf if n == 0 else r / n + exploration * math.sqrt(math.log(max(total, 1)) / n)
        for n, r in zip(counts, rois)
    ]


def _thompson(counts: list[int], rois: list[float], exploration: float, rng: np.random.Generator) -> list[float]:
    means = [r / n if n else 0.0 for n, r in zip(counts, rois)]
    return [float(rng.normal(m, exploration / math.sqrt(1 + n))) for m, n in zip(means, counts)]
