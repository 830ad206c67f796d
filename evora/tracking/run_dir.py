"""The run folder (docs/architecture.md, "Run folder") and its resolved, redacted config.yaml."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import traceback
from pathlib import Path
from typing import Any

import yaml

SECRET_KEY = re.compile(r"(key|token|secret|password)$", re.IGNORECASE)
REDACTED = "<redacted>"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CLI_LOG = "cli.log"  # a run folder's tracebacks; on the console too with EVORA_DEBUG=1
LINEAGE_FILE = "lineage.jsonl"  # a family tree, for strategies that keep one: one record per member


def run_tag(run_dir: str | Path) -> str:
    """A short tag naming the run's tmpfs scratch folders and named actors."""
    return hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=4).hexdigest()


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


def log_traceback(run_dir: str | Path, error: BaseException) -> str:
    """Append `error`'s traceback to the run folder's cli.log; returns the traceback."""
    trace = "".join(traceback.format_exception(error))
    with open(Path(run_dir) / CLI_LOG, "a") as log:
        log.write(trace)
    return trace
