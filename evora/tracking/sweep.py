"""Hydra multirun bookkeeping: every job of `evora -m ...` gets a W&B group named after
the sweep, and the sweep folder gets `sweep_summary.json` / `.md` with one row per
override set (final held-out reward, generations, wall-clock), rewritten after every
job so that an interrupted sweep still has the rows it finished."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

SUMMARY = "sweep_summary"
COLUMNS = ("job", "overrides", "status", "strategy", "base_heldout", "final_heldout", "best_heldout", "generations",
           "wall_clock_s", "run_dir")


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def with_sweep_tracking(run: Any) -> Any:
    """In a multirun, W&B runs are grouped by the sweep and named by their overrides."""
    if not in_multirun():
        return run
    hydra = HydraConfig.get()
    tracking = run.tracking
    return replace(run, tracking=replace(
        tracking, wandb_group=tracking.wandb_group or Path(hydra.sweep.dir).name,
        wandb_name=tracking.wandb_name or hydra.job.override_dirname or hydra.job.num))


def summary_row(job: int, overrides: list[str], status: str, strategy: str, result: dict[str, Any] | None,
                seconds: float, run_dir: str) -> dict[str, Any]:
    result = result or {}
    return {"job": job, "overrides": " ".join(overrides), "status": status, "strategy": strategy,
            "base_heldout": _number(result.get("base_heldout")),
            "final_heldout": _number(result.get("final_heldout", result.get("best_heldout_fitness"))),
            "best_heldout": _number(result.get("best_heldout", result.get("best_heldout_fitness"))),
            "generations": result.get("generations"), "wall_clock_s": round(seconds, 1), "run_dir": run_dir}


def _number(value: Any) -> Any:
    if isinstance(value, dict):  # PBT reports the base model's metrics as a dict
        value = value.get("fitness")
    return value


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def write_summary(folder: Path, rows: list[dict[str, Any]]) -> None:
    """JSON with every override of every job; markdown with the overrides that vary."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{SUMMARY}.json").write_text(json.dumps(rows, indent=2) + "\n")
    shared = set.intersection(*(set(row["overrides"].split()) for row in rows)) if len(rows) > 1 else set()
    lines = [f"# Sweep {folder.name}", ""]
    if shared:
        lines += ["Every job: `" + " ".join(o for o in rows[0]["overrides"].split() if o in shared) + "`", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        varying = " ".join(o for o in row["overrides"].split() if o not in shared)
        lines.append("| " + " | ".join(_cell({**row, "overrides": varying}[c]) for c in COLUMNS) + " |")
    (folder / f"{SUMMARY}.md").write_text("\n".join(lines) + "\n")


class SweepSummary(Callback):
    """Registered in conf/config.yaml (hydra.callbacks); does nothing outside a multirun."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.started = 0.0

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not in_multirun():
            return
        hydra = HydraConfig.get()
        completed = job_return.status == JobStatus.COMPLETED
        result = job_return._return_value if completed else None  # .return_value re-raises a failure
        self.rows.append(summary_row(hydra.job.num, list(job_return.overrides or []),
                                     "completed" if completed else "failed", config.strategy.name, result,
                                     time.perf_counter() - self.started, hydra.runtime.output_dir))
        write_summary(Path(hydra.sweep.dir), self.rows)
