"""What a run writes as it goes: metrics records to every sink (metrics.jsonl, the live reward
plot, W&B), the family tree (lineage.jsonl), a strategy's own JSONL files, and the compute of
every record into the ledger. The run loop hands it records; it never computes one.

On resume every file is truncated to the last checkpointed generation, so a crash between a
record and its checkpoint leaves no line twice.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from evora.analysis.live import RewardPlotSink
from evora.analysis.plots import write_plots
from evora.config.schema import RunConfig
from evora.tracking.compute import ComputeLedger, Spend
from evora.tracking.events import StartEvent
from evora.tracking.metrics import JsonlSink, MetricsSink, WandbSink
from evora.tracking.run_dir import LINEAGE_FILE, config_dict
from evora.tracking.summary import read_summary


class Recorder:
    def __init__(self, run: RunConfig, run_dir: Path, ledger: ComputeLedger, completed: int):
        """`completed`: the last generation the checkpoint holds (-1: a fresh run)."""
        self.run_dir, self.ledger, self.completed = run_dir, ledger, completed
        self.sinks: list[MetricsSink] = [JsonlSink(run_dir, completed), RewardPlotSink(run_dir)]
        self.wandb = wandb_sink(run, run_dir) if run.tracking.name == "wandb" else None
        if self.wandb is not None:
            self.sinks.append(self.wandb)
        self.lineage = JsonlSink(run_dir, completed, LINEAGE_FILE, lazy=True)
        self.files: dict[str, JsonlSink] = {}

    def log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    @property
    def wants_completions(self) -> bool:
        """Whether held-out evaluations should keep their completions (W&B's table)."""
        return self.wandb is not None

    def completions(self, generation: int, rows: list[dict[str, Any]]) -> None:
        if self.wandb is not None:
            self.wandb.completions(generation, rows)

    def family(self, members: list[dict[str, Any]]) -> None:
        self.lineage.log_many(members)

    def strategy_records(self, records: dict[str, list[dict[str, Any]]]) -> None:
        """A strategy's own JSONL files (the ecology's episodes and organelles)."""
        for name, lines in records.items():
            if name not in self.files:
                self.files[name] = JsonlSink(self.run_dir, self.completed, name, lazy=True)
            self.files[name].log_many(lines)

    def account(
        self, record: dict[str, Any], search: Spend, evaluation: Spend, search_s: float, evaluation_s: float
    ) -> None:
        """Compute of this record into the ledger, and into the record (per generation and cumulative)."""
        ledger = self.ledger
        ledger.search.add(search)
        ledger.evaluation.add(evaluation)
        ledger.add_seconds("search", search_s)
        ledger.add_seconds("evaluation", evaluation_s)
        record.update(
            tokens_prompt=search.tokens_prompt,
            tokens_generated=search.tokens_generated,
            tokens_scored=search.tokens_scored,
            tokens_trained=search.tokens_trained,
            flops=search.flops(ledger.parameters)["flops"],
            eval_flops=evaluation.flops(ledger.parameters)["flops"],
            cumulative_flops=ledger.search_flops(),
            wall_clock_s=sum(ledger.seconds.values()),
            time=time.time(),
        )

    def close(self) -> None:
        for sink in [*self.sinks, self.lineage, *self.files.values()]:
            sink.close()


def wandb_sink(run: RunConfig, run_dir: Path) -> WandbSink:
    tracking = run.tracking
    return WandbSink(
        run_dir,
        project=tracking.wandb_project,
        entity=tracking.wandb_entity,
        group=tracking.wandb_group or run.name,
        name=tracking.wandb_name or run_dir.name,
        mode=tracking.wandb_mode,
        config=config_dict(run),
        figures=lambda: write_plots(run_dir),
        exports=lambda: exports_of(run_dir),
    )


def exports_of(run_dir: Path) -> list[tuple[str, Path]]:
    """(name, folder) of each export of the finished run (an adapter, a model, the ecology's folder of
    organelles), none if it did not finish."""
    summary = read_summary(run_dir)
    exports = summary["adapters"] if summary is not None else {}
    return [(name, run_dir / relative) for name, relative in exports.items() if (run_dir / relative).is_dir()]


def start_event(
    strategy: str,
    *,
    generations: int | None,
    start: int,
    workers: int,
    base_heldout: float | None,
    resumed: bool,
    adapter_parameters: int | None,
    setup_seconds: float,
    moved: dict[str, int] | None = None,
    population: int | None = None,
    units: int | None = None,
    master_device: str | None = None,
    device_change: str | None = None,
) -> StartEvent:
    """The event every run's console starts from, the shared loop's and a job runner's.
    `moved`: a full-weight strategy's weights and master bytes (and `master_device`, where they
    live); `population`: a job whose members report themselves (PBT), so the console draws no
    generation bar; `units`: the work units a generation is cut into; `device_change`: a resume's
    line when its noise is now drawn on another device class (checkpoint.device_change)."""
    event = StartEvent(
        kind="start",
        strategy=strategy,
        generations=generations,
        start=start,
        workers=workers,
        base_heldout=base_heldout,
        resumed=resumed,
        adapter_parameters=adapter_parameters,
        setup_seconds=setup_seconds,
    )
    if population is not None:
        event["population"] = population
    if moved is not None:
        event["full_weights"], event["master_bytes"] = moved["full_weights"], moved["master_bytes"]
    if master_device is not None:
        event["master_device"] = master_device
    if units is not None:
        event["units"] = units
    if device_change is not None:
        event["device_change"] = device_change
    return event
