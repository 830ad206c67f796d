"""Multiple-choice answers: which letter a completion commits to. Every pattern has only
bounded quantifiers, so matching is linear in the completion's length."""

from __future__ import annotations

import functools
import re

from evora.tasks.rewards.limits import clip

DEFAULT_LETTERS = "ABCDEFGHIJ"


@functools.lru_cache(maxsize=64)
def _patterns(letters: str) -> tuple[re.Pattern, re.Pattern, re.Pattern] | None:
    allowed = "".join(sorted({letter for letter in letters if "A" <= letter <= "Z"}))
    if not allowed:
        return None
    upper, either = f"[{allowed}]", f"[{allowed}{allowed.lower()}]"
    # "answer is (X)", "answer is X", "Answer: X", "answer is option **X**"; a bare
    # lowercase letter is not taken ("the answer is a bit unclear"), "(b)" is.
    keyword = re.compile(
        r"(?<![A-Za-z])(?i:answer)(?:\s{1,3}(?i:is))?\s{0,3}:?\s{0,3}(?:(?i:option|choice)\s{1,3})?[*_]{0,2}"
        rf"(?:\(({either})\)|({upper})(?![A-Za-z0-9]))"
    )
    parenthesised = re.compile(rf"\(({upper})\)")
    leading = re.compile(rf"[*_]{{0,2}}({upper})(?:[.):*_]|$)")
    return keyword, parenthesised, leading


def _last_match(pattern: re.Pattern, text: str) -> str | None:
    last = None
    for last in pattern.finditer(text):
        pass
    return None if last is None else next(group for group in last.groups() if group).upper()


def extract_choice(text: str, letters: str = DEFAULT_LETTERS) -> str | None:
    """The letter the completion commits to (upper case, one of `letters`), or None."""
    patterns = _patterns(letters)
    if patterns is None:
        return None
    keyword, parenthesised, leading = patterns
    text = clip(text)
    found = _last_match(keyword, text) or _last_match(parenthesised, text)
    if found is None:
        start = leading.match(text.strip())
        found = None if start is None else start.group(1)
    return found


def choice_match(completion: str, answer: str) -> float:
    """1.0 when the completion's letter is the answer letter, else 0.0."""
    expected = answer.strip().upper()
    return 1.0 if expected and extract_choice(completion) == expected else 0.0
