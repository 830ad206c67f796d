"""Regex scoring with a user-configured pattern, bounded by the `regex` package's timeout
so that catastrophic backtracking on hostile completions cannot stall scoring."""

from __future__ import annotations

import functools

import regex

from evora.tasks.rewards.limits import clip

DEFAULT_TIMEOUT_S = 0.02


@functools.lru_cache(maxsize=256)
def compiled(pattern: str) -> regex.Pattern | None:
    """The compiled pattern, or None when it is invalid (cached either way)."""
    try:
        return regex.compile(pattern)
    except (regex.error, ValueError, TypeError, OverflowError, RecursionError):
        return None


def regex_match(completion: str, pattern: str, timeout: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 when the pattern is found in the completion, 0.0 on no match, timeout or bad pattern."""
    compiled_pattern = compiled(pattern)
    if compiled_pattern is None:
        return 0.0
    try:
        return 1.0 if compiled_pattern.search(clip(completion), timeout=timeout) else 0.0
    except TimeoutError:
        return 0.0
