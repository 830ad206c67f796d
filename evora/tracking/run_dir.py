"""The run folder (DESIGN §6) and its resolved, redacted config.yaml."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

SECRET_KEY = re.compile(r"(key|token|secret|password)$", re.IGNORECASE)
REDACTED = "<redacted>"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
LINEAGE_FILE = "lineage.jsonl"  # GA/PBT family tree: one record per member
TRIALS_FILE = "trials.jsonl"  # PBT: every trial's result, every generation


def new_run_dir(out_dir: str, name: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    return str(Path(out_dir) / f"{stamp}_{name}")


def redact(value: Any) -> Any:
    """The same structure with every *key/*token/*secret/*password value hidden."""
    if isinstance(value, dict):
        return {k: REDACTED if SECRET_KEY.search(str(k)) and v is not None else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def config_dict(run: Any) -> dict[str, Any]:
    return redact(dataclasses.asdict(run))


def write_config(run_dir: str | Path, run: Any) -> Path:
    path = Path(run_dir) / CONFIG_FILE
    path.write_text(yaml.safe_dump(config_dict(run), sort_keys=False))
    return path
