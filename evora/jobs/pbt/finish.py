"""The end of a PBT run: every member's last checkpoint scored on held-out, the best member
(by selection fitness, chosen without looking at held-out) saved and compared with the base
model, the compute booked, and the run summary."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import ray
import torch

from evora.config.schema import RunConfig
from evora.distributed.finish import Outcome, final_event, report_against_base, write_run_summary
from evora.jobs.pbt.records import converged
from evora.jobs.pbt.trial import TrialContext, layout_for
from evora.lora.peft_io import load_adapter_tensors, save_adapter
from evora.plan.run_plan import RunPlan
from evora.strategies.pbt.trials import read_trials
from evora.tasks.fitness import parse_fitness
from evora.tracking.compute import ComputeLedger
from evora.tracking.events import FinalEvent
from evora.tracking.metrics import read_metrics


def members(run: RunConfig, context: TrialContext, service: Any, results: Any) -> list[dict[str, Any]]:
    """Every member's last checkpoint and its held-out metrics."""
    if results.errors:
        raise RuntimeError(f"{len(results.errors)} PBT member(s) failed; the first: {results.errors[0]}")
    fitness = parse_fitness(run.strategy.fitness)
    found = []
    for result in results:
        if result.checkpoint is None:
            continue
        with result.checkpoint.as_directory() as directory:
            meta = torch.load(Path(directory) / "trainer.pt", map_location="cpu", weights_only=True)
            adapter = load_adapter_tensors(Path(directory) / "adapter")
        layout = layout_for(meta["hp"], context)
        heldout = ray.get(service.metrics.remote(adapter, layout, "heldout", bucket="evaluation"))
        found.append(
            {
                "member": meta["member"],
                "hp": meta["hp"],
                "selection_fitness": result.metrics["fitness"],
                "heldout": {**heldout, "fitness": fitness(heldout)},
                "adapter": adapter,
                "layout": layout,
            }
        )
    return found


def against_base(plan: RunPlan, folder: Path, service: Any, best: dict[str, Any]) -> dict[str, Any]:
    """The best member and the base model on held-out, written to eval/best_vs_base*."""
    return report_against_base(
        lambda theta, layout, ops: ray.get(
            service.evaluate.remote(theta, layout, "heldout", with_base=True, keep_texts=True, bucket="evaluation")
        ),
        best["adapter"],
        best["layout"],
        plan.splits.heldout,
        task=plan.run.task.name,
        split="heldout",
        adapter_name="adapters/best",
        out_dir=folder / "eval",
        stem="best_vs_base",
    )


def book_compute(folder: Path, service: Any, ledger: ComputeLedger) -> None:
    """The search (members' scoring and training) and the evaluation, into the ledger."""
    trials, scoring = read_trials(folder), ray.get(service.spend.remote("search"))  # each read once
    ledger.search.add(scoring)
    ledger.search.tokens_trained += sum(t.get("tokens_trained") or 0 for t in trials)
    ledger.evaluation.add(ray.get(service.spend.remote("evaluation")))


def finish(
    plan: RunPlan, folder: Path, context: TrialContext, service: Any, results: Any, ledger: ComputeLedger
) -> FinalEvent:
    """Best member's adapter, every member's held-out fitness, the base comparison, the summary."""
    started, run = time.perf_counter(), plan.run
    scored = members(run, context, service, results)
    best = max(scored, key=lambda m: m["selection_fitness"])  # chosen without looking at held-out
    save_adapter(folder / "adapters" / "best", best["adapter"], best["layout"])
    report = against_base(plan, folder, service, best)
    fitness = parse_fitness(run.strategy.fitness)
    base = {**report["base_metrics"], "fitness": fitness(report["base_metrics"])}
    book_compute(folder, service, ledger)
    ledger.add_seconds("evaluation", time.perf_counter() - started)
    details = {
        "best_hyperparameters": best["hp"],
        "converged": converged([g["fitness_max"] for g in read_metrics(folder)]),
        "median_member_heldout_fitness": statistics.median(m["heldout"]["fitness"] for m in scored),
        "members": {m["member"]: m["heldout"]["fitness"] for m in scored},
        "members_selection_fitness": [[m["member"], m["selection_fitness"]] for m in scored],
    }
    summary = write_run_summary(
        folder,
        run=run,
        heldout_size=len(plan.splits.heldout),
        strategy="pbt",
        generations=run.generations,
        center=None,
        outcome=Outcome(base, None, best["heldout"], None, best["member"], run.strategy.eval_split),
        counts=report["counts"],
        adapters={"best": "adapters/best"},
        compute=ledger.summary(sum(ledger.seconds.values())),
        details=details,
    )
    return final_event(summary, folder)
