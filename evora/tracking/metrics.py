"""Metrics sinks: metrics.jsonl always, W&B when tracking=wandb. The driver calls
`log` once per generation with one flat record; strategies never log themselves."""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, cast

from evora.strategies.analysis_hooks import read_jsonl
from evora.tracking.run_dir import METRICS_FILE


class MetricsSink(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float, however deeply nested, as None: JSON has no NaN, and
    a strict parser refuses the bare `NaN` Python's json writes."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class JsonlSink:
    """Appends records to a JSONL file, fsynced; `lazy`: the file appears with its first record."""

    def __init__(
        self,
        run_dir: str | Path,
        completed_generations: int | None = None,
        filename: str = METRICS_FILE,
        lazy: bool = False,
    ):
        self.path = Path(run_dir) / filename
        if completed_generations is not None:
            self._truncate(completed_generations)
        self.handle = None if lazy else open(self.path, "a")

    def _truncate(self, completed: int) -> None:
        """On resume, drop lines of generations the checkpoint does not cover (they are redone)."""
        if not self.path.exists():
            return
        keep = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get("generation", -1) <= completed
        ]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, record: dict[str, Any]) -> None:
        self.log_many([record])

    def log_many(self, records: list[dict[str, Any]]) -> None:
        """Records in order, fsynced once: a generation's lineage or episodes are one write, not
        one fsync a line (milliseconds each, thousands a generation at large populations)."""
        if not records:
            return
        if self.handle is None:
            self.handle = open(self.path, "a")
        self.handle.write("".join(json.dumps(json_safe(r), allow_nan=False) + "\n" for r in records))
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


# W&B's sections, as researchers read a run: a record's key -> "<section>/<key>" (the first rule that
# matches), so the workspace groups its panels; metrics.jsonl keeps the flat keys.
WANDB_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("heldout", ("heldout_", "base_heldout_", "selection_")),
    ("compute", ("tokens", "flops", "eval_flops", "cumulative_flops", "wall_clock_s", "seconds", "units")),
    ("system", ("workers", "worker_", "reward_errors", "reward_timeouts", "reward_invalid", "reward_failed", "time")),
)
COMPLETIONS = "heldout/completions"  # the table of held-out completions, at each held-out evaluation


def wandb_key(key: str) -> str:
    """heldout_reward -> heldout/reward, base_heldout_reward -> heldout/base_reward, tokens_generated ->
    compute/tokens_generated, workers_lost -> system/workers_lost; the search's own numbers -> search/."""
    for section, prefixes in WANDB_SECTIONS:
        if key.startswith(prefixes):
            return f"{section}/{key.removeprefix('heldout_').replace('base_heldout_', 'base_')}"
    return f"search/{key}"


class WandbSink:
    """One W&B run per evora run; its id is kept in the run folder so a resume continues it.
    Metrics go under sections (`wandb_key`), held-out completions into a table, and the run's
    exports, at its end, become model artifacts."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        project: str,
        entity: str | None,
        group: str | None,
        name: str,
        mode: str,
        config: dict[str, Any],
        figures: Callable[[], list[Path]] | None = None,
        exports: Callable[[], list[tuple[str, Path]]] | None = None,
    ):
        import wandb

        self.run_dir = Path(run_dir)
        self.figures = figures  # the run's plots, drawn at the end (passed in: tracking draws nothing itself)
        self.exports = exports  # (name, folder) of what the run exported, read at the end
        id_file = Path(run_dir) / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(
            project=project,
            entity=entity,
            group=group,
            name=name,
            # one of wandb's modes: plan/validate.py checks tracking.wandb_mode (a str in the schema)
            mode=cast(Literal["online", "offline", "disabled"], mode),
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )

    def log(self, record: dict[str, Any]) -> None:
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "generation"}
        self.run.log({wandb_key(k): v for k, v in numbers.items()}, step=int(record.get("generation", 0)))

    def completions(self, generation: int, rows: list[dict[str, Any]]) -> None:
        """The held-out completions after `generation` generations: a table, one row per example."""
        import wandb

        if rows:
            columns = list(rows[0])
            table = wandb.Table(columns=["generation", *columns], data=[[generation, *r.values()] for r in rows])
            self.run.log({COMPLETIONS: table}, step=generation)

    def close(self) -> None:
        """The run's figures (`evora analyze`'s plots) and its exports (model artifacts) go to W&B
        too, then the run ends."""
        import wandb

        paths = self.figures() if self.figures is not None else []
        figures = {f"plots/{path.stem}": wandb.Image(str(path)) for path in paths}
        if figures:
            self.run.log(figures)
        for name, folder in self.exports() if self.exports is not None else []:
            artifact = wandb.Artifact(artifact_name(self.run_dir.name, name), type="model", metadata={"export": name})
            artifact.add_dir(str(folder))
            self.run.log_artifact(artifact)
        self.run.finish()


def artifact_name(run: str, export: str) -> str:
    """W&B artifact names hold letters, digits, '-', '_' and '.' only."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{run}-{export}")


def read_metrics(run_dir: str | Path, filename: str = METRICS_FILE) -> list[dict[str, Any]]:
    return read_jsonl(Path(run_dir) / filename)
