"""Exact-answer scoring."""

from __future__ import annotations


def exact_answer(completion: str, answer: str) -> float:
    """1.0 when the completion is the answer and nothing else (surrounding whitespace aside)."""
    return 1.0 if completion.strip() == answer.strip() else 0.0
