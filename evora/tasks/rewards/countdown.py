"""Countdown scoring as in the ES paper: 0.1 x format + 1.0 x correct answer.

The paper's regexes are rewritten with `str.find` so scoring stays linear in the
completion's length (a lazy `.*?` over a 1 MB completion is quadratic), and the
answer is checked with `safe_eval` instead of `eval`. A given number may be used at
most once; not every number has to be used.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from evora.tasks.rewards.safe_eval import UnsafeExpression, evaluate, integer_literals, parse_arithmetic

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_ALLOWED = re.compile(r"[0-9+\-*/() ]+")
FORMAT_WEIGHT = 0.1


def format_score(response: str) -> float:
    """1.0 for `<think>...</think>\\n<answer>...</answer>` exactly; else 0.1 for a think
    block plus 0.5 for an answer block (the paper's format reward)."""
    bridge = THINK_CLOSE + "\n" + ANSWER_OPEN
    if response.startswith(THINK_OPEN) and response.endswith(ANSWER_CLOSE):
        at = response.find(bridge, len(THINK_OPEN))
        if at != -1 and at + len(bridge) <= len(response) - len(ANSWER_CLOSE):
            return 1.0
    score = 0.0
    if _has_block(response, THINK_OPEN, THINK_CLOSE):
        score += 0.1
    if _has_block(response, ANSWER_OPEN, ANSWER_CLOSE):
        score += 0.5
    return score


def _has_block(text: str, open_tag: str, close_tag: str) -> bool:
    start = text.find(open_tag)
    return start != -1 and text.find(close_tag, start + len(open_tag)) != -1


def answer_content(response: str) -> str | None:
    start = response.find(ANSWER_OPEN)
    if start == -1:
        return None
    end = response.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
    return None if end == -1 else response[start + len(ANSWER_OPEN) : end]


def answer_score(response: str, numbers: list[int], target: int) -> float:
    """1.0 when the answer block is an expression over the given numbers (each at most
    once) whose exact value is the target."""
    content = answer_content(response)
    if not content or not _ALLOWED.fullmatch(content):
        return 0.0
    try:
        tree = parse_arithmetic(content)
        used = Counter(integer_literals(tree))
        if used - Counter(numbers):
            return 0.0
        return 1.0 if evaluate(tree) == Fraction(target) else 0.0
    except UnsafeExpression:
        return 0.0


def countdown_reward(response: str, numbers: list[int], target: int) -> float:
    return FORMAT_WEIGHT * format_score(response) + answer_score(response, numbers, target)
