"""Metrics sinks: metrics.jsonl always, W&B when tracking=wandb. The driver calls
`log` once per generation with one flat record; strategies never log themselves."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from evora.tracking.run_dir import METRICS_FILE, TRIALS_FILE


class MetricsSink(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    def __init__(self, run_dir: str | Path, completed_generations: int | None = None, filename: str = METRICS_FILE):
        self.path = Path(run_dir) / filename
        if completed_generations is not None:
            self._truncate(completed_generations)
        self.handle = open(self.path, "a")

    def _truncate(self, completed: int) -> None:
        """On resume, drop lines of generations the checkpoint does not cover (they are redone)."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("generation", -1) <= completed]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, record: dict[str, Any]) -> None:
        self.handle.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


class WandbSink:
    """One W&B run per evora run; its id is kept in the run folder so a resume continues it."""

    def __init__(self, run_dir: str | Path, *, project: str, entity: str | None, group: str | None, name: str,
                 mode: str, config: dict[str, Any]):
        import wandb

        self.run_dir = Path(run_dir)
        id_file = Path(run_dir) / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(project=project, entity=entity, group=group, name=name, mode=mode, id=run_id,
                              resume="allow", dir=str(run_dir), config=config)

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None},
                     step=int(record.get("generation", 0)))

    def close(self) -> None:
        """The run's figures (`evora analyze`'s plots) go to W&B too, then the run ends."""
        import wandb

        from evora.analysis.plots import write_plots

        figures = {f"plots/{path.stem}": wandb.Image(str(path)) for path in write_plots(self.run_dir)}
        if figures:
            self.run.log(figures)
        self.run.finish()


class RewardPlotSink:
    """plots/reward.png redrawn as the run goes (seed 001's live plot): at most every
    `every_s` seconds, and at the end. Written to a temporary name, then renamed, so a
    viewer never opens half a PNG."""

    def __init__(self, run_dir: str | Path, every_s: float = 10.0):
        self.run_dir, self.every_s, self.drawn_at = Path(run_dir), every_s, float("-inf")

    def log(self, record: dict[str, Any]) -> None:
        if time.monotonic() - self.drawn_at >= self.every_s:
            self.draw()

    def draw(self) -> None:
        from evora.analysis.plots import PLOTS_DIR, plot_reward

        metrics = read_metrics(self.run_dir)
        if not metrics:
            return
        path = self.run_dir / PLOTS_DIR / "reward.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(".reward.png.partial")
        plot_reward(metrics).savefig(partial, dpi=120, format="png")
        os.replace(partial, path)
        self.drawn_at = time.monotonic()

    def close(self) -> None:
        self.draw()


def read_metrics(run_dir: str | Path, filename: str = METRICS_FILE) -> list[dict[str, Any]]:
    path = Path(run_dir) / filename
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_trials(run_dir: str | Path) -> list[dict[str, Any]]:
    """PBT's trials.jsonl, the last result of every (trial, generation): a resumed trial repeats a few."""
    latest = {(r["trial"], r["generation"]): r for r in read_metrics(run_dir, TRIALS_FILE)}
    return sorted(latest.values(), key=lambda r: (r["generation"], r["trial"]))
