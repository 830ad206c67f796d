"""Hydra multirun bookkeeping: every job of `evora -m ...` gets a W&B group named after
the sweep, and the sweep folder gets `sweep_summary.json` / `.md` with one row per
override set (base, final and best held-out reward, generations, compute, wall-clock), rewritten after every
job so that an interrupted sweep still has the rows it finished."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from evora.errors import RunError
from evora.tracking.summary import headline, objective_value, read_summary

SUMMARY = "sweep_summary"
STUDY = "optimization_results.yaml"  # what hydra-optuna-sweeper writes into the sweep folder
COLUMNS = (
    "job",
    "overrides",
    "status",
    "strategy",
    "base_heldout",
    "final_heldout",
    "best_heldout",
    "objective",
    "generations",
    "search_flops",
    "wall_clock_s",
    "run_dir",
)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def with_sweep_tracking(run: Any) -> Any:
    """In a multirun, W&B runs are grouped by the sweep and named by their overrides."""
    if not in_multirun():
        return run
    hydra = HydraConfig.get()
    tracking = run.tracking
    return replace(
        run,
        tracking=replace(
            tracking,
            wandb_group=tracking.wandb_group or Path(hydra.sweep.dir).name,
            wandb_name=tracking.wandb_name or hydra.job.override_dirname or hydra.job.num,
        ),
    )


def job_objective(run_dir: str | Path, objective: str) -> float:
    """A multirun job's value, what the sweeper optimises (hydra/sweeper=optuna): `objective` of its summary."""
    value = objective_value(read_summary(run_dir), objective)
    if value is None:
        raise RunError(f"objective={objective}: {run_dir}/eval/summary.json has no such value")
    return value


def summary_row(
    job: int,
    overrides: list[str],
    status: str,
    strategy: str,
    summary: dict[str, Any] | None,
    seconds: float,
    run_dir: str,
    objective: str = "best.reward",
) -> dict[str, Any]:
    """One job's row from its eval/summary.json (None when the job failed)."""
    return {
        "job": job,
        "overrides": " ".join(overrides),
        "status": status,
        "strategy": strategy,
        "base_heldout": headline(summary, "base"),
        "final_heldout": headline(summary, "final"),
        "best_heldout": headline(summary, "best"),
        "objective": objective_value(summary, objective),
        "generations": (summary or {}).get("generations"),
        "search_flops": (summary or {}).get("compute", {}).get("search", {}).get("flops"),
        "wall_clock_s": round(seconds, 1),
        "run_dir": run_dir,
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e5 else f"{value:.3f}"
    return "-" if value is None else str(value)


def write_summary(folder: Path, rows: list[dict[str, Any]], study: dict[str, Any] | None = None) -> None:
    """JSON with every override of every job; markdown with the overrides that vary, and an Optuna
    study's best parameters and value (its whole result stays in optimization_results.yaml)."""
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
    if study is not None:
        best = " ".join(f"{key}={value}" for key, value in study.get("best_params", {}).items())
        lines += ["", f"Optuna ({study.get('name', 'optuna')}): best value {_cell(study.get('best_value'))}, `{best}`"]
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
        summary = read_summary(hydra.runtime.output_dir) if completed else None
        self.rows.append(
            summary_row(
                hydra.job.num,
                list(job_return.overrides or []),
                "completed" if completed else "failed",
                config.strategy.name,
                summary,
                time.perf_counter() - self.started,
                hydra.runtime.output_dir,
                config.objective,
            )
        )
        write_summary(Path(hydra.sweep.dir), self.rows)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """hydra/sweeper=optuna: the study's result (optimization_results.yaml) below the table."""
        folder = Path(config.hydra.sweep.dir)  # HydraConfig is unset once the jobs are done
        if self.rows and (folder / STUDY).is_file():
            write_summary(folder, self.rows, yaml.safe_load((folder / STUDY).read_text()))
