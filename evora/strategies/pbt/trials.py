"""trials.jsonl: every PBT member's result, every generation (the job runner writes it; the
analysis and the finish read it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRIALS_FILE = "trials.jsonl"


def read_trials(run_dir: str | Path) -> list[dict[str, Any]]:
    """The last result of every (trial, generation): a resumed trial repeats a few."""
    path = Path(run_dir) / TRIALS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    latest = {(r["trial"], r["generation"]): r for r in (json.loads(line) for line in lines if line.strip())}
    return sorted(latest.values(), key=lambda r: (r["generation"], r["trial"]))
