"""Generator seeds from names: the one function of `noise.py` that tasks (prompt sampling,
decoding seeds) need, kept here without torch so that the CLI's task registry imports none."""

from __future__ import annotations

import hashlib


def noise_key(*parts: object) -> int:
    """A 63-bit generator seed from the parts' text (stable across processes and machines)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
