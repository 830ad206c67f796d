"""Metrics sinks: metrics.jsonl always, W&B when tracking=wandb. The driver calls
`log` once per generation with one flat record; strategies never log themselves."""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Literal, Protocol, cast

from evora.strategies.analysis_hooks import read_jsonl
from evora.tracking.run_dir import METRICS_FILE


class MetricsSink(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
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
        self.handle.write("".join(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n" for r in records))
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


class WandbSink:
    """One W&B run per evora run; its id is kept in the run folder so a resume continues it."""

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
    ):
        import wandb

        self.run_dir = Path(run_dir)
        self.figures = figures  # the run's plots, drawn at the end (passed in: tracking draws nothing itself)
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
        self.run.log(
            {k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None},
            step=int(record.get("generation", 0)),
        )

    def close(self) -> None:
        """The run's figures (`evora analyze`'s plots) go to W&B too, then the run ends."""
        import wandb

        paths = self.figures() if self.figures is not None else []
        figures = {f"plots/{path.stem}": wandb.Image(str(path)) for path in paths}
        if figures:
            self.run.log(figures)
        self.run.finish()


def read_metrics(run_dir: str | Path, filename: str = METRICS_FILE) -> list[dict[str, Any]]:
    return read_jsonl(Path(run_dir) / filename)
