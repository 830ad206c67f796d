"""What a PBT run writes as it goes (Tune callbacks, in the driver): every trial result to
trials.jsonl with a console line, and metrics.jsonl, one record per round written through
`JsonlSink` as soon as every member has reported that round (as the shared loop writes one
per generation). Both are picklable: Tune stores its callbacks with the experiment."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import ray
from ray.tune import Callback

from evora.config.schema import RunConfig
from evora.distributed.recorder import wandb_sink
from evora.strategies.pbt.space import KEYS
from evora.strategies.pbt.trials import TRIALS_FILE, read_trials
from evora.tracking.compute import Spend
from evora.tracking.metrics import JsonlSink, MetricsSink, read_metrics

TRIAL_KEYS = (
    "generation",
    "member",
    "parent",
    "fitness",
    "reward",
    "accuracy",
    "perplexity",
    "loss",
    "step",
    "tokens_trained",
)


class TrialLog(Callback):
    """Every trial result to trials.jsonl and a console line."""

    def __init__(self, run_dir: str, generations: int, quiet: bool):
        self.path, self.generations, self.quiet = str(Path(run_dir) / TRIALS_FILE), generations, quiet

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        record = {
            "trial": trial.trial_id,
            **{k: result.get(k) for k in TRIAL_KEYS},
            **{k: trial.config[k] for k in KEYS},
        }
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if not self.quiet:
            print(
                f"gen {record['generation']:>3}/{self.generations}  {record['member']:<28} fitness "
                f"{record['fitness']:.3f}  accuracy {record['accuracy']:.3f}  perplexity {record['perplexity']:.2f}"
                f"  loss {record['loss']:.3f}",
                flush=True,
            )


def round_record(
    generation: int, rows: list[dict[str, Any]], parameters: int, scoring_flops: float, cumulative_before: float
) -> dict[str, Any]:
    """metrics.jsonl's line for one round, over the members' results (sorted by trial), with its
    compute: training 6 x P x tokens trained, plus the members' scoring in that round."""
    rows = sorted(rows, key=lambda r: r["trial"])
    fitness = [r["fitness"] for r in rows]
    best = max(rows, key=lambda r: r["fitness"])
    trained = sum(r.get("tokens_trained") or 0 for r in rows)
    flops = 6.0 * parameters * trained + scoring_flops
    return {
        "generation": generation,
        "fitness_max": max(fitness),
        "fitness_median": statistics.median(fitness),
        "fitness_min": min(fitness),
        "accuracy_max": max(r["accuracy"] for r in rows),
        "best_member": best["member"],
        "trials": len(rows),
        "tokens_trained": trained,
        "flops": flops,
        "cumulative_flops": cumulative_before + flops,
    }


def scoring_flops(service: str, parameters: int) -> float:
    """The search scoring the run's EvaluationService has done so far, in FLOPs."""
    actor: Any = ray.get_actor(service)
    spent: Spend = ray.get(actor.spend.remote("search"))
    return spent.flops(parameters)["flops"]


class RoundLog(Callback):
    """Rounds as they complete, through evora's sinks (metrics.jsonl, and W&B with
    tracking=wandb: one W&B run for the job, as for every strategy). Its state comes from the
    run folder on the first result (trials.jsonl, metrics.jsonl), so a restored run logs only
    the rounds not yet logged; a round's scoring is what the service scored since the previous
    round (after a restore, the new service's count starts with the rounds redone)."""

    def __init__(self, run: RunConfig, run_dir: str, parameters: int, service: str):
        self.run, self.run_dir, self.parameters, self.service = run, run_dir, parameters, service
        self.population = run.strategy.population
        self._reset()

    def _reset(self) -> None:
        self.rows: dict[tuple[str, int], dict[str, Any]] | None = None  # (trial, generation) -> its result
        self.logged, self.cumulative, self.scored = 0, 0.0, 0.0
        self.sinks: list[MetricsSink] = []

    def __getstate__(self) -> dict[str, Any]:
        kept = ("run", "run_dir", "population", "parameters", "service")
        return {k: v for k, v in self.__dict__.items() if k in kept}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _load(self) -> dict[tuple[str, int], dict[str, Any]]:
        rows = {(r["trial"], r["generation"]): r for r in read_trials(self.run_dir)}
        logged = read_metrics(self.run_dir)
        if logged:
            self.logged, self.cumulative = int(logged[-1]["generation"]), float(logged[-1]["cumulative_flops"] or 0.0)
        self.sinks = [JsonlSink(self.run_dir, lazy=True)]
        if self.run.tracking.name == "wandb":
            self.sinks.append(wandb_sink(self.run, Path(self.run_dir)))
        return rows

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.rows is None:
            self.rows = self._load()
        row = {"trial": trial.trial_id, **{k: result.get(k) for k in TRIAL_KEYS}}
        self.rows[(trial.trial_id, int(row["generation"]))] = row
        while True:
            rows = [r for (_, g), r in self.rows.items() if g == self.logged + 1]
            if len(rows) < self.population:
                return
            self.log_round(self.logged + 1, rows)

    def log_round(self, generation: int, rows: list[dict[str, Any]]) -> None:
        scored = scoring_flops(self.service, self.parameters)
        record = round_record(generation, rows, self.parameters, scored - self.scored, self.cumulative)
        for sink in self.sinks:
            sink.log(record)
        self.logged, self.cumulative, self.scored = generation, record["cumulative_flops"], scored

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for sink in self.sinks:
            sink.close()


def converged(best_by_generation: list[float], window: int = 5, threshold: float = 0.01) -> bool | None:
    """LoRALab's convergence flag: the best fitness improved by less than 1% over the last
    5 generations (reported, never used to stop). None with too few generations."""
    if len(best_by_generation) <= window:
        return None
    before, now = best_by_generation[-window - 1], best_by_generation[-1]
    return (now - before) <= threshold * max(abs(before), 1e-9)
