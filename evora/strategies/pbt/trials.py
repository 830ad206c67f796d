"""trials.jsonl: every PBT member's result, every generation (the job runner writes it; the
analysis and the finish read it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evora.strategies.analysis_hooks import read_jsonl

TRIALS_FILE = "trials.jsonl"


def read_trials(run_dir: str | Path) -> list[dict[str, Any]]:
    """The last result of every (trial, generation): a resumed trial repeats a few."""
    latest = {(r["trial"], r["generation"]): r for r in read_jsonl(Path(run_dir) / TRIALS_FILE)}
    return sorted(latest.values(), key=lambda r: (r["generation"], r["trial"]))
