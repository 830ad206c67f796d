"""Countdown scoring as in the ES paper (its `countdown_task.py`, the TinyZero rules):
0.1 x format + 1.0 x correct answer.

By default, as the paper: the last `<answer>` block is scored; it must use every given
number exactly once (`sorted(used) == sorted(numbers)`) and evaluate to within 1e-5 of the
target (targets may be non-integers). Options, named deviations: `number_rule=at_most_once`
(a subset of the numbers, each at most once) and `answer_block=first`.

The paper's regexes are rewritten with `str.find` so scoring stays linear in the
completion's length (a lazy `.*?` over a 1 MB completion is quadratic), and the answer is
evaluated with `safe_eval` (exact fractions) instead of `eval`. Like the paper's `$`, a
single trailing newline after the last tag or the expression is accepted.
"""

from __future__ import annotations

import re
from collections import Counter

from evora.tasks.rewards.safe_eval import UnsafeExpression, evaluate, integer_literals, parse_arithmetic

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_ALLOWED = re.compile(r"[0-9+\-*/() ]+")
FORMAT_WEIGHT = 0.1
TOLERANCE = 1e-5  # the paper's abs(value - float(target)) < 1e-5
NUMBER_RULES = ("all_exactly_once", "at_most_once")
ANSWER_BLOCKS = ("last", "first")


def format_score(response: str) -> float:
    """1.0 for `<think>...</think>\\n<answer>...</answer>` exactly; else 0.1 for a think
    block plus 0.5 for an answer block (the paper's format reward)."""
    bridge = THINK_CLOSE + "\n" + ANSWER_OPEN
    response = _without_final_newline(response)
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


def _without_final_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def answer_blocks(response: str) -> list[str]:
    """Every `<answer>...</answer>` content, in order, as `re.findall` of the paper's lazy regex finds them."""
    blocks, at = [], 0
    while (start := response.find(ANSWER_OPEN, at)) != -1:
        end = response.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end == -1:
            break
        blocks.append(response[start + len(ANSWER_OPEN) : end])
        at = end + len(ANSWER_CLOSE)
    return blocks


def answer_content(response: str, answer_block: str = "last") -> str | None:
    blocks = answer_blocks(response)
    if not blocks:
        return None
    return blocks[-1] if answer_block == "last" else blocks[0]


def numbers_allowed(used: list[int], numbers: list[int], number_rule: str) -> bool:
    if number_rule == "all_exactly_once":
        return Counter(used) == Counter(numbers)
    return not Counter(used) - Counter(numbers)


def answer_score(
    response: str,
    numbers: list[int],
    target: float | int | str,
    number_rule: str = "all_exactly_once",
    answer_block: str = "last",
) -> float:
    """1.0 when the chosen answer block is an expression over the given numbers (by
    `number_rule`) whose value is within TOLERANCE of the target."""
    content = answer_content(response, answer_block)
    if content is None:
        return 0.0
    content = _without_final_newline(content)
    if not content or not _ALLOWED.fullmatch(content):
        return 0.0
    try:
        tree = parse_arithmetic(content)
        if not numbers_allowed(integer_literals(tree), numbers, number_rule):
            return 0.0
        return 1.0 if abs(float(evaluate(tree)) - float(target)) < TOLERANCE else 0.0
    except UnsafeExpression:
        return 0.0


def countdown_reward(
    response: str,
    numbers: list[int],
    target: float | int | str,
    number_rule: str = "all_exactly_once",
    answer_block: str = "last",
) -> float:
    return FORMAT_WEIGHT * format_score(response) + answer_score(response, numbers, target, number_rule, answer_block)
