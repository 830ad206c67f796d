"""The one finish every run ends with, whatever its strategy: the best adapter against
the base model on held-out (eval/best_vs_base.md/.json), exported adapters with their model
cards, and eval/summary.json in the one schema (evora/schemas/summary.schema.json). `evora eval`
uses the same comparison.

Evaluation itself is passed in (`Evaluate`): a worker pool for ask/tell runs and
`evora eval`, the shared evaluation service for PBT."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from evora.analysis.comparison import build_report, write_reports
from evora.config.schema import RunConfig
from evora.distributed.evaluate import SplitOutcome
from evora.distributed.model_cards import write_model_cards
from evora.lora.layout import AdapterLayout
from evora.strategies.protocol import BASE, CENTER, Tensors
from evora.tracking.events import FinalEvent
from evora.tracking.run_dir import CLI_LOG, log_traceback
from evora.tracking.summary import SCHEMA_VERSION, write_summary

# (adapter or None, its layout or None for the pool's, ops) -> outcomes with completion texts
Evaluate = Callable[[Tensors | None, AdapterLayout | None, list[str]], dict[str, SplitOutcome]]


def report_against_base(
    evaluate: Evaluate,
    adapter: Tensors | None,
    layout: AdapterLayout | None,
    examples: Sequence[Any],
    *,
    task: str,
    split: str,
    adapter_name: str,
    out_dir: Path,
    stem: str,
    with_base: bool = True,
) -> dict[str, Any]:
    """Evaluate an adapter (None: the base model alone) and, with_base, the base model on
    the same examples; write <stem>.md/.json; return the report."""
    ops = [BASE] * (with_base or adapter is None) + [CENTER] * (adapter is not None)
    outcomes = evaluate(adapter, layout, ops)
    main = outcomes[CENTER] if adapter is not None else outcomes[BASE]
    base = outcomes[BASE] if with_base and adapter is not None else None
    report = build_report(examples, main, base, task=task, split=split, adapter_name=adapter_name)
    report["paths"] = [str(p) for p in write_reports(report, out_dir, stem)]
    return report


@dataclass
class Outcome:
    """What a run found, in the words of the summary."""

    base: dict[str, float]  # held-out metrics (with fitness) of the base model
    final: dict[str, float] | None  # of the strategy's final center adapter
    best: dict[str, float]
    best_generation: int | None
    best_member: str | None
    best_chosen_on: str  # selection | heldout


COUNTS = ("improvements", "regressions", "both_wrong", "both_right", "failed")  # the summary's best_vs_base


def write_run_summary(
    run_dir: Path,
    *,
    run: RunConfig,
    heldout_size: int,
    strategy: str,
    generations: int,
    center: str | None,
    outcome: Outcome,
    counts: dict[str, int],
    adapters: dict[str, str],
    compute: dict[str, Any],
    details: dict[str, Any] | None = None,
    stopped: str | None = None,
) -> dict[str, Any]:
    summary = {
        "schema_version": SCHEMA_VERSION,
        "strategy": strategy,
        "generations": generations,
        "center": center,
        "base": outcome.base,
        "final": outcome.final,
        "best": outcome.best,
        "best_generation": outcome.best_generation,
        "best_member": outcome.best_member,
        "best_chosen_on": outcome.best_chosen_on,
        "best_vs_base": {k: counts[k] for k in COUNTS},
        "adapters": adapters,
        "compute": compute,
        "details": details or {},
        "stopped": stopped,  # why the strategy ended the run early (Told.stop); None: it ran its course
    }
    write_summary(run_dir, summary)
    try:
        write_model_cards(run_dir, run, summary, heldout_size)  # after the summary: a card cites its numbers
    except Exception as error:  # the run's work is done and saved: a card cannot fail it
        log_traceback(run_dir, error)
        first = (str(error).strip().splitlines() or [""])[0][:300]
        print(f"evora: warning: no model cards: {type(error).__name__}: {first} (traceback: {run_dir / CLI_LOG})")
    return summary


def final_event(summary: dict[str, Any], run_dir: Path) -> FinalEvent:
    """The one console event a run ends with."""
    return FinalEvent(kind="final", summary=summary, run_dir=str(run_dir))
