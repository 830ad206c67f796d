"""Fuzzy answer matching as in LoRALab: containment, 80% word overlap, numeric value,
multiple-choice letter."""

from __future__ import annotations

import string

from evora.tasks.rewards.choice import DEFAULT_LETTERS, choice_match
from evora.tasks.rewards.limits import clip
from evora.tasks.rewards.numeric import numeric_match, parse_number

OVERLAP_NUMERATOR, OVERLAP_DENOMINATOR = 4, 5  # 80%, compared in integers


def normalised_words(text: str) -> list[str]:
    """Lower-cased words with punctuation stripped at their edges; empty words dropped."""
    words = (word.strip(string.punctuation) for word in text.lower().split())
    return [word for word in words if word]


def _contains_words(haystack: list[str], needle: list[str]) -> bool:
    # Containment on word boundaries, so that "72" is not found in "720".
    return f" {' '.join(needle)} " in f" {' '.join(haystack)} "


def _overlaps(completion_words: list[str], answer_words: list[str]) -> bool:
    wanted = set(answer_words)
    found = len(wanted & set(completion_words))
    return OVERLAP_DENOMINATOR * found >= OVERLAP_NUMERATOR * len(wanted)


def _is_number(answer: str) -> bool:
    return parse_number(answer.strip().removeprefix("$").removesuffix("%")) is not None


def _is_choice_letter(answer: str) -> bool:
    letter = answer.strip().upper()
    return len(letter) == 1 and letter in DEFAULT_LETTERS


def fuzzy_match(completion: str, answer: str) -> float:
    """1.0 when the answer is contained, 80% of its words overlap, its number or its choice
    letter matches; else 0.0 (always 0.0 for an empty answer)."""
    completion, answer = clip(completion), clip(answer)  # a hostile reference is bounded too
    answer_words = normalised_words(answer)
    if answer_words:
        completion_words = normalised_words(completion)
        if _contains_words(completion_words, answer_words) or _overlaps(completion_words, answer_words):
            return 1.0
    if _is_number(answer) and numeric_match(completion, answer) == 1.0:
        return 1.0
    if _is_choice_letter(answer) and choice_match(completion, answer) == 1.0:
        return 1.0
    return 0.0
