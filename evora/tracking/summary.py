"""eval/summary.json: the one record every run ends with, whatever its strategy.

Its JSON schema is `evora/schemas/summary.schema.json`; `write_summary` validates
against it, so a strategy that writes something else fails at once instead of breaking
`evora runs`, sweeps, `analyze` or `compare` later. Those read it through `read_summary`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from evora.tracking.metrics import json_safe

SUMMARY_FILE = Path("eval") / "summary.json"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "summary.schema.json"
SCHEMA_VERSION = 1


@cache
def summary_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate_summary(summary: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when `summary` breaks the schema."""
    import jsonschema

    jsonschema.validate(summary, summary_schema())


def write_summary(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    validate_summary(summary)
    path = Path(run_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(".summary.json.partial")
    partial.write_text(json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n")
    partial.replace(path)
    return path


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's summary, or None when it did not finish (or wrote an older layout)."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("schema_version") == SCHEMA_VERSION else None


OBJECTIVE_SECTIONS = ("base", "final", "best")  # `objective=<section>.<metric>`: held-out metrics of the summary


def objective_value(summary: dict[str, Any] | None, objective: str) -> float | None:
    """A run's `objective` (e.g. best.reward) from its summary, or None where it has none."""
    section, _, metric = objective.partition(".")
    return headline(summary, section, metric)


def headline(summary: dict[str, Any] | None, which: str, metric: str = "reward") -> float | None:
    """summary[which][metric] (which: base, final, best), or None where there is none."""
    if not summary or not summary.get(which):
        return None
    value = summary[which].get(metric)
    return float(value) if isinstance(value, (int, float)) else None
