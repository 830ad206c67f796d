"""The registry of (completion, answer) -> float scorers, selected by name in task configs."""

from __future__ import annotations

from collections.abc import Callable

from evora.tasks.rewards.choice import choice_match
from evora.tasks.rewards.contains import contains_answer
from evora.tasks.rewards.exact import exact_answer
from evora.tasks.rewards.fuzzy import fuzzy_match
from evora.tasks.rewards.numeric import numeric_match
from evora.tasks.rewards.regex_match import regex_match

Scorer = Callable[[str, str], float]

SCORERS: dict[str, Scorer] = {
    "exact": exact_answer,
    "numeric": numeric_match,
    "fuzzy": fuzzy_match,
    "regex": regex_match,  # the answer field holds the pattern
    "contains": contains_answer,
    "choice": choice_match,
}


def scorer(name: str) -> Scorer:
    """The scorer registered under `name`; KeyError listing the allowed names otherwise."""
    try:
        return SCORERS[name]
    except KeyError:
        raise KeyError(f"unknown scorer {name!r}; allowed: {', '.join(sorted(SCORERS))}") from None
