"""Containment scoring."""

from __future__ import annotations

from evora.tasks.rewards.limits import clip


def contains_answer(completion: str, answer: str) -> float:
    """1.0 when the stripped answer is non-empty and occurs in the completion (case-sensitive), else 0.0."""
    needle = answer.strip()
    return 1.0 if needle and needle in clip(completion) else 0.0
