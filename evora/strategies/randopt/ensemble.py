"""RandOpt's ensemble: the top K perturbations by fitness, their majority vote on each prompt,
and the completions a round distils (Gan and Isola 2026, "Neural Thickets"; its iterative
repository's selection).

For a prompt, the members' completions come in rank order (the fittest member first). The
ensemble's answer is the majority of their canonical answers (`tasks.aggregate.majority_index`:
ties go to the answer a fitter member gave). The completions distilled are

- targets=correct (the repository's rejection sampling): the members' correct completions,
  distinct, those that give the majority answer first, then the shorter; at most `per_prompt`;
- targets=vote: the completion of the fittest member that gives the majority answer, correct
  or not (the ensemble's own answer, no reference needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evora.tasks.aggregate import majority_index


def top_k(fitness: np.ndarray, k: int) -> list[int]:
    """The rows of the k fittest, fittest first (ties: the lower row)."""
    return sorted(range(len(fitness)), key=lambda i: (-float(fitness[i]), i))[:k]


@dataclass(frozen=True)
class Vote:
    answer: str | None  # the majority answer; None when no member answers
    member: int | None  # the fittest member that gives it (its rank)


def vote(answers: Sequence[str | None]) -> Vote:
    picked = majority_index(answers)
    return Vote(None if picked is None else answers[picked], picked)


def targets(
    completions: Sequence[str], answers: Sequence[str | None], correct: Sequence[bool], mode: str, per_prompt: int
) -> list[str]:
    """The completions of one prompt to distil, from its members' (in rank order)."""
    voted = vote(answers)
    if mode == "vote":
        return [] if voted.member is None or not completions[voted.member].strip() else [completions[voted.member]]
    kept = [i for i in range(len(completions)) if correct[i] and completions[i].strip()]
    kept.sort(key=lambda i: (voted.answer is None or answers[i] != voted.answer, len(completions[i]), i))
    return list(dict.fromkeys(completions[i] for i in kept))[:per_prompt]
