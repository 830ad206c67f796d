"""Evaluating adapters on a split through the worker pool: per-example outcomes for the
base model (BASE) and/or one adapter (CENTER), and per-candidate metrics of a generation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from evora.distributed.pool import WorkerPool
from evora.distributed.worker import UnitResult, WorkUnit
from evora.strategies.base import CandidateSpec

EVAL_CHUNK = 64  # examples per work unit


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@dataclass
class SplitOutcome:
    """One adapter (or the base model) on every example of a split."""

    rewards: np.ndarray
    correct: np.ndarray
    tokens: np.ndarray
    perplexity: np.ndarray | None
    texts: list[str] | None

    def metrics(self) -> dict[str, float]:
        out = {"reward": float(self.rewards.mean()), "accuracy": float(self.correct.mean()),
               "tokens": float(self.tokens.mean())}
        if self.perplexity is not None:
            out["perplexity"] = float(self.perplexity.mean())
        return out


def evaluate_split(pool: WorkerPool, theta: dict[str, Any] | None, ops: list[str], split: str, size: int, *,
                   generation: int = 0, keep_texts: bool = False, perplexity: bool = False,
                   layout: Any = None) -> dict[str, SplitOutcome]:
    """Outcomes per op (BASE, CENTER) on the first `size` examples of `split`; `layout`
    describes theta when it is not the pool's layout."""
    specs = tuple(CandidateSpec(generation, i, op=op) for i, op in enumerate(ops))
    units = [WorkUnit(specs, split, tuple(c), keep_texts, perplexity) for c in chunks(list(range(size)), EVAL_CHUNK)]
    payload = {"theta": theta} if layout is None else {"theta": theta, "layout": layout}
    results = pool.run(ray.put(payload), units)
    outcomes = {}
    for row, op in enumerate(ops):
        outcomes[op] = SplitOutcome(
            rewards=np.concatenate([r.rewards[row] for r in results]),
            correct=np.concatenate([r.correct[row] for r in results]),
            tokens=np.concatenate([r.tokens[row] for r in results]),
            perplexity=np.concatenate([r.perplexity[row] for r in results]) if perplexity else None,
            texts=[t for r in results for t in r.texts[row]] if keep_texts else None,
        )
    return outcomes


class EvaluationService:
    """One worker pool that many clients (PBT trials) evaluate adapters on, one call at a time."""

    def __init__(self, spec: Any, split_sizes: dict[str, int]):
        self.pool = WorkerPool.start(spec)
        self.sizes = split_sizes

    def workers(self) -> int:
        """How many engine workers serve; returns once they are all placed and loaded."""
        return len(self.pool)

    def evaluate(self, theta: dict[str, Any] | None, layout: Any, split: str, *, with_base: bool = False,
                 keep_texts: bool = False) -> dict[str, SplitOutcome]:
        from evora.strategies.base import BASE, CENTER

        ops = [BASE] * with_base + [CENTER] * (theta is not None)
        return evaluate_split(self.pool, theta, ops, split, self.sizes[split], keep_texts=keep_texts, perplexity=True,
                              layout=layout)

    def metrics(self, theta: dict[str, Any], layout: Any, split: str) -> dict[str, float]:
        from evora.strategies.base import CENTER

        return self.evaluate(theta, layout, split)[CENTER].metrics()

    def shutdown(self) -> None:
        self.pool.shutdown()


def candidate_metrics(results: list[UnitResult], population: int) -> dict[str, np.ndarray]:
    """Metric name -> one mean per candidate (population order), from a generation's units."""
    columns: dict[str, list] = {name: [None] * population for name in ("reward", "accuracy", "tokens", "perplexity")}
    for result in results:
        for row, index in enumerate(result.indices):
            columns["reward"][index] = result.rewards[row].mean()
            columns["accuracy"][index] = result.correct[row].mean()
            columns["tokens"][index] = result.tokens[row].mean()
            if result.perplexity is not None:
                columns["perplexity"][index] = result.perplexity[row].mean()
    return {name: np.array(values, dtype=np.float64) for name, values in columns.items() if None not in values}


def run_evaluation(run: Any, adapter: str | None, compare: bool, split: str, out_dir: str) -> dict[str, Any]:
    """`evora eval`: one adapter (or the base model) on a split, optionally against the base
    model; writes <out_dir>/{compare,eval}.{md,json} and returns the report."""
    from pathlib import Path

    from evora.analysis.comparison import build_report, write_reports
    from evora.distributed.driver import run_tag
    from evora.distributed.launch import init_ray
    from evora.distributed.worker import WorkerSpec
    from evora.engines.adapter_store import sweep_run_scratch
    from evora.lora.layout import build_layout, linear_shapes_of_model
    from evora.lora.peft_io import layout_of_adapter, load_adapter_tensors
    from evora.models import locate_model
    from evora.strategies.base import BASE, CENTER
    from evora.tasks import build_task

    location = locate_model(run.model.path)
    shapes = linear_shapes_of_model(location.path, revision=run.model.revision,
                                    trust_remote_code=run.model.trust_remote_code)
    if adapter is not None:
        layout, theta = layout_of_adapter(adapter, shapes), load_adapter_tensors(adapter)
    else:
        layout, theta = build_layout(shapes, rank=run.lora.rank, alpha=run.lora.alpha,
                                     target_modules=run.lora.target_modules, layers=run.lora.layers,
                                     base_model=location.path), None
    examples = build_task(run.task, run.seed).splits().get(split)
    ops = [BASE] * (compare or adapter is None) + [CENTER] * (adapter is not None)
    init_ray(run)
    tag = run_tag(out_dir)
    pool = WorkerPool.start(WorkerSpec(run, location.path, layout, {}, tag))
    try:
        outcomes = evaluate_split(pool, theta, ops, split, len(examples), keep_texts=True, perplexity=True)
    finally:
        pool.shutdown()
        sweep_run_scratch(run.engine.adapter_dir, tag)
    main = outcomes[CENTER] if adapter is not None else outcomes[BASE]
    report = build_report(examples, main, outcomes[BASE] if compare and adapter is not None else None,
                          task=run.task.name, split=split, adapter_name=adapter or "base model")
    report["paths"] = [str(p) for p in write_reports(report, Path(out_dir), "compare" if compare else "eval")]
    return report
