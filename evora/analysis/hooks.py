"""How the analysis finds a run's strategy hooks: through the registry only, from the name
config.yaml (or the summary) gives, never from the shape of a run's records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from evora.errors import ConfigError
from evora.strategies import get_strategy
from evora.strategies.analysis_hooks import NO_ANALYSIS, Analysis, RunData
from evora.strategies.registry import StrategyEntry
from evora.tracking.metrics import read_metrics
from evora.tracking.run_dir import CONFIG_FILE, LINEAGE_FILE
from evora.tracking.summary import read_summary


def entry_of(name: str | None) -> StrategyEntry | None:
    """The registry entry of a strategy name or import path; None when it is unknown here (a user's
    strategy that is not importable on this machine: the analysis still renders, without its hooks)."""
    if not name:
        return None
    try:
        return get_strategy(name)
    except ConfigError:
        return None


def hooks_of(name: str | None) -> Analysis:
    entry = entry_of(name)
    return NO_ANALYSIS if entry is None else entry.analysis_hooks()


def read_config(run: Path) -> dict[str, Any]:
    path = run / CONFIG_FILE
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def strategy_name(config: dict[str, Any], summary: dict[str, Any] | None = None) -> str | None:
    """config.yaml's strategy.name; the summary's strategy when the config lacks one."""
    section = config.get("strategy")
    name = section.get("name") if isinstance(section, dict) else None
    return str(name) if name is not None else (summary or {}).get("strategy")


def run_data(run_dir: str | Path) -> RunData:
    """A run folder's common files, as the strategies' hooks get them."""
    run = Path(run_dir)
    return RunData(
        path=run,
        config=read_config(run),
        summary=read_summary(run) or {},
        metrics=read_metrics(run),
        lineage=read_metrics(run, LINEAGE_FILE),
    )


def run_hooks(run: RunData) -> Analysis:
    return hooks_of(strategy_name(dict(run.config), dict(run.summary)))
