"""Countdown files in the ES paper's format, what `task=countdown` reads as it is: a JSON list of
records with `id`, `context` (the whole prompt), `numbers`, `target` (a string) and `solution`
(docs/reproduce.md, "The data"). `evora data countdown` writes one from either source:

- the paper's own countdown.json (any of its versions, or any file of numbers/target records):
  every record checked (errors name the file and line), targets as strings, and a record without
  a `context` given the paper's prompt;
- a seeded draw from reasoning-gym's procedural `countdown` dataset (Apache-2.0, offline; the
  `tasks` extra): 3 or 4 numbers in 1..99 as in the paper's file, and reasoning-gym's targets
  (integers in 100..999, where the paper's also has negative and fractional ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evora.errors import ConfigError, DataError
from evora.lora.keys import noise_key
from evora.tasks.builtin.countdown import PAPER_FILE, PAPER_REPOSITORY, load_problems, paper_context, target_text

# reasoning-gym's countdown settings that make its problems look like the paper's file's
DRAW = {"min_numbers": 3, "max_numbers": 4, "min_value": 1, "max_value": 99}


def paper_record(problem: dict[str, Any], index: int) -> dict[str, Any]:
    """A checked problem as a record of the paper's file; its own id and context are kept."""
    numbers, target = list(problem["numbers"]), target_text(problem["target"])
    return {
        "id": problem.get("id", index),
        "context": problem.get("context") or paper_context(numbers, target),
        "numbers": numbers,
        "target": target,
        "solution": str(problem.get("solution", "")),
    }


def from_file(path: str) -> list[dict[str, Any]]:
    """The records of a Countdown file (the paper's countdown.json), checked, in the paper's format."""
    if not Path(path).is_file():
        raise DataError(f"{path}: file not found; the ES paper's is {PAPER_FILE} in {PAPER_REPOSITORY}")
    return [paper_record(problem, i) for i, problem in enumerate(load_problems(path))]


def drawn(size: int, seed: int) -> list[dict[str, Any]]:
    """`size` problems from reasoning-gym's countdown dataset, the same ones for the same seed."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "evora data countdown: drawing problems needs the reasoning-gym package (evora's `tasks` extra: "
            "pip install -e '.[tasks]'), not installed here; or pass the paper's file with --from"
        ) from None
    # reasoning-gym draws item i from Random(seed + i): seeds 0 and 1 would share all but one
    # problem, so each of evora's seeds starts the draw somewhere of its own.
    dataset = reasoning_gym.create_dataset("countdown", size=size, seed=noise_key(seed, "countdown-draw"), **DRAW)
    entries = (dataset[i] for i in range(size))
    return [paper_record({**entry["metadata"], "solution": entry["answer"]}, i) for i, entry in enumerate(entries)]


def write_records(records: list[dict[str, Any]], out: str) -> None:
    try:
        Path(out).write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"--out={out}: cannot write it ({error.strerror or error})") from None
