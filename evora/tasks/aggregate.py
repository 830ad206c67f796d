"""Fitness over several sampled completions per (candidate, prompt) cell: task.aggregate.

    mean       the mean reward; correct = the fraction of correct samples (pass@1)
    pass_at_k  correct = the unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large
               Language Models Trained on Code", the HumanEval paper): 1 - C(n-c, k) / C(n, k),
               from n samples of which c are correct; reward = its graded analogue, the unbiased
               estimate of E[max of k of the n samples] (`max_at_k`)
    majority   the reward and correctness of the sample that gives the most common canonical
               answer (self-consistency voting; `AnswerTask.answer` gives the answers)

Non-finite rewards: a NaN reward makes the cell NaN under mean and pass_at_k (the estimate is
undefined), and under majority when the voted sample's own reward is NaN. Infinite rewards
follow float arithmetic (mean of -inf and finite is -inf); max_at_k skips the terms of weight
zero (the k-1 smallest rewards), so a -inf that can never be a max of k does not poison it.

The canonical answer forms at the end are shared by the built-in tasks' `answer`, each the
extraction its reward uses: equal strings are the same answer.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from evora.tasks.rewards.choice import extract_choice
from evora.tasks.rewards.numeric import final_value

AGGREGATES = ("mean", "pass_at_k", "majority")


def _check_k(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: must be in 1..n (n={n} samples)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, HumanEval): 1 - C(n-c, k) / C(n, k),
    computed stably (product form), 1.0 when n - c < k. Requires 1 <= k <= n."""
    _check_k(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"c={c}: must be in 0..n (n={n} samples)")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def max_at_k(rewards: Sequence[float], k: int) -> float:
    """Unbiased estimate of E[max of k samples drawn without replacement from the n] : sum over the ascending-sorted
    rewards r_(i), i = 1..n, of r_(i) * C(i-1, k-1) / C(n, k). For 0/1 rewards it equals pass_at_k."""
    n = len(rewards)
    _check_k(n, k)
    values = [float(r) for r in rewards]
    if any(math.isnan(v) for v in values):
        return math.nan
    ordered = sorted(values)
    total = math.comb(n, k)
    # r_(i) for i < k has weight 0: skipped (0 * -inf would be NaN).
    return sum(ordered[i - 1] * (math.comb(i - 1, k - 1) / total) for i in range(k, n + 1))


def majority_index(answers: Sequence[str | None]) -> int | None:
    """Index of the first sample giving the most common non-None answer (ties: the answer that appears first);
    None when no sample gives an answer."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    # Counter keeps first-seen order, so the first answer reaching `top` is the one that appears first.
    winner = next(a for a, count in counts.items() if count == top)
    return answers.index(winner)


@dataclass(frozen=True)
class CellOutcome:
    reward: float
    correct: float  # in [0, 1]


def _mean(rewards: Sequence[float]) -> float:
    return sum(float(r) for r in rewards) / len(rewards)


def aggregate(
    method: str, rewards: Sequence[float], correct: Sequence[bool], answers: Sequence[str | None] | None, k: int
) -> CellOutcome:
    """One cell's outcome from its n samples' rewards, correctness and (majority) canonical answers.

    mean: mean reward, fraction correct (pass@1).
    pass_at_k: reward = max_at_k(rewards, k), correct = pass_at_k(n, c, k).
    majority: the reward and correctness of the sample `majority_index` picks; when no sample
    answers, the mean reward and 0.0. `k` is used by pass_at_k only, `answers` by majority only."""
    n = len(rewards)
    if n == 0 or len(correct) != n:
        raise ValueError(f"aggregate: {n} rewards and {len(correct)} correctness flags; need as many, at least 1")
    if method == "mean":
        return CellOutcome(_mean(rewards), sum(map(bool, correct)) / n)
    if method == "pass_at_k":
        return CellOutcome(max_at_k(rewards, k), pass_at_k(n, sum(map(bool, correct)), k))
    if method == "majority":
        if answers is None or len(answers) != n:
            raise ValueError(f"aggregate=majority: needs one answer per sample ({n}), got {answers!r}")
        picked = majority_index(answers)
        if picked is None:
            return CellOutcome(_mean(rewards), 0.0)
        return CellOutcome(float(rewards[picked]), float(bool(correct[picked])))
    raise ValueError(f"aggregate={method!r}: allowed: {', '.join(AGGREGATES)}")


# Canonical answers (AnswerTask.answer): the extraction each scorer compares, normalised.


def exact_answer_text(completion: str) -> str | None:
    """The exact scorer's answer: the stripped completion; None for a blank one (no answer)."""
    return completion.strip() or None


def numeric_answer(completion: str) -> str | None:
    """The numeric scorer's answer: the final number's exact value as a Fraction string ("850", "-3/4",
    "1/2" for "0.5"), or None. numeric_match also accepts values within 1e-6 relative of each other;
    those are different answers here."""
    value = final_value(completion)
    return None if value is None else str(value)


def choice_answer(completion: str) -> str | None:
    """The choice scorer's answer: the upper-case letter the completion commits to, or None."""
    return extract_choice(completion)
