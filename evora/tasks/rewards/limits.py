"""Size limits shared by the scorers, so that hostile completions stay cheap to score.

Completions longer than MAX_CHARS characters are scored on their first MAX_CHARS
characters; numeric literals longer than MAX_NUMBER_CHARS are never parsed (int() of a
million-digit string is slow or raises)."""

from __future__ import annotations

MAX_CHARS = 65_536
MAX_NUMBER_CHARS = 64


def clip(text: str) -> str:
    """The first MAX_CHARS characters of the text."""
    return text[:MAX_CHARS]
