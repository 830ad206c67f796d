"""Numeric answers: parse literals exactly as Fractions and find the final answer of a
completion the way GSM8K-style graders do (#### marker, then \\boxed{...}, then the last
number). ASCII digits only; every regex here runs in linear time."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from evora.tasks.rewards.limits import MAX_NUMBER_CHARS, clip

# A \boxed{...} holds a short answer; bounding the brace scan keeps hostile input cheap.
MAX_BOXED_CHARS = 1024

# A sign counts only when it does not follow a word or ")" ("5-3" is 5 and 3, not 5 and -3).
# Thousands groups must not be followed by a digit, so "1,2345" is not read as "1,234".
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?"
# Written as a branch (not an optional sign) so that the engine can skip ahead to a sign
# or digit; about twice as fast on long hostile text.
_NUMBER = re.compile(r"(?:[-+](?<![\w)].)|(?=\d))" + _UNSIGNED, re.ASCII)
_LITERAL = re.compile(r"[-+]?" + _UNSIGNED, re.ASCII)
_BRACE = re.compile(r"[{}]")
_MARKER = "####"
_BOXED = "\\boxed{"


def parse_number(text: str) -> Fraction | None:
    """The exact value of one numeric literal ("-1,234.50", "3/4"), or None if it is not one."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not text.isascii() or not _LITERAL.fullmatch(text):
        return None
    numerator, _, denominator = text.replace(",", "").partition("/")
    value = Fraction(numerator)
    if not denominator:
        return value
    return None if int(denominator) == 0 else value / int(denominator)


def numbers_in(text: str) -> list[str]:
    """All numeric literals in the text, in order (commas kept); ASCII digits only, linear time."""
    return _NUMBER.findall(text)


def last_number(text: str) -> str | None:
    """The last numeric literal in the text (commas kept), or None."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return None if last is None else last.group()


def _first_number(text: str, start: int = 0) -> str | None:
    found = _NUMBER.search(text, start)
    return None if found is None else found.group()


def _last_boxed_content(text: str) -> str | None:
    """The content of the last \\boxed{...}, or None when there is none, it is unclosed or
    longer than MAX_BOXED_CHARS."""
    start = text.rfind(_BOXED)
    if start == -1:
        return None
    begin = start + len(_BOXED)
    depth = 1
    for brace in _BRACE.finditer(text, begin, begin + MAX_BOXED_CHARS + 1):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[begin : brace.start()]
    return None


def extract_final_answer(text: str) -> str | None:
    """The final numeric answer, commas removed: first number after the last "####", else
    first number in the last \\boxed{...}, else the last number; None when there is none."""
    text = clip(text)
    found = None
    marker = text.rfind(_MARKER)
    if marker != -1:
        found = _first_number(text, marker + len(_MARKER))
    if found is None:
        boxed = _last_boxed_content(text)
        found = None if boxed is None else _first_number(boxed)
    if found is None:
        found = last_number(text)
    return None if found is None else found.replace(",", "")


def final_value(text: str) -> Fraction | None:
    """The exact value of extract_final_answer(text), or None."""
    found = extract_final_answer(text)
    return None if found is None else parse_number(found)


def numeric_match(completion: str, answer: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 when the final numbers of completion and answer are equal within tolerance, else 0.0."""
    got, want = final_value(completion), final_value(answer)
    if got is None or want is None:
        return 0.0
    if got == want:
        return 1.0
    if rel_tol == 0 and abs_tol == 0:
        return 0.0
    # parse_number bounds literals to MAX_NUMBER_CHARS, so these floats are finite.
    return 1.0 if math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=abs_tol) else 0.0
