"""Held-out and selection evaluation of the center (and of the base model) on the worker pool,
and the best center so far: chosen on the selection split when there is one, else on held-out."""

from __future__ import annotations

from typing import Any

from evora.distributed.evaluate import SplitOutcome, evaluate_split
from evora.distributed.loop_state import Best, LoopState
from evora.distributed.pool import WorkerPool
from evora.distributed.reward_failures import failure_budget
from evora.lora import Tensors
from evora.plan.run_plan import RunPlan
from evora.strategies.protocol import BASE, CENTER
from evora.tasks.decoding import eval_decoding
from evora.tracking.compute import Spend


class CenterScoring:
    def __init__(self, pool: WorkerPool, plan: RunPlan, completions: bool = False):
        """`completions`: held-out evaluations keep their completions for a table (`rows`, W&B's)."""
        self.pool, self.splits, self.fitness = pool, plan.splits, plan.fitness
        self.k = eval_decoding(plan.run.task).k
        self.failure_budget = failure_budget(plan.run.task)
        self.completions = completions
        self.base: SplitOutcome | None = None  # the base model's held-out completions, once this session has them
        self.rows: list[dict[str, Any]] = []  # the last held-out evaluation's completions, base and adapter

    def outcomes(
        self, split: str, ops: list[str], generation: int, theta: Tensors | None, spend: Spend
    ) -> dict[str, SplitOutcome]:
        """Whole outcomes (completion texts, perplexity) of BASE/CENTER/... on a split."""
        return self._evaluate(split, ops, generation, theta, spend, whole=True)

    def metrics(
        self, split: str, ops: list[str], generation: int, theta: Tensors | None, spend: Spend
    ) -> dict[str, dict[str, float]]:
        """Each op's metrics on a split, with the task's fitness (and, held-out, the table's `rows`)."""
        table = self.completions and split == "heldout" and CENTER in ops
        outcomes = self._evaluate(split, ops, generation, theta, spend, whole=False, texts=table)
        if table:
            self.base = (
                outcomes.get(BASE) or self.base or self._evaluate(split, [BASE], 0, None, spend, False, True)[BASE]
            )
            self.rows = completion_rows(self.splits.heldout, self.base, outcomes[CENTER])
        return {op: self.with_fitness(o.metrics()) for op, o in outcomes.items()}

    def _evaluate(
        self,
        split: str,
        ops: list[str],
        generation: int,
        theta: Tensors | None,
        spend: Spend,
        whole: bool,
        texts: bool = False,
    ) -> dict[str, SplitOutcome]:
        return evaluate_split(
            self.pool,
            theta,
            ops,
            split,
            len(self.splits.get(split)),
            generation=generation,
            keep_texts=whole or texts,
            perplexity=whole or self.fitness.needs_perplexity,
            spend=spend,
            kl_on_selection=self.fitness.needs_kl,
            k=self.k,
            failure_budget=self.failure_budget,
        )

    def with_fitness(self, metrics: dict[str, float]) -> dict[str, float]:
        return {**metrics, "fitness": self.fitness(metrics)}

    def initial(self, loop: LoopState, theta: Tensors, spend: Spend) -> dict[str, Any]:
        """The base model and the starting center on held-out: generation 0's record."""
        outcomes = self.metrics("heldout", [BASE, CENTER], 0, theta, spend)
        loop.base = outcomes[BASE]
        return {
            "generation": 0,
            **{f"base_heldout_{k}": v for k, v in loop.base.items()},
            **self.center(loop, 0, theta, outcomes[CENTER], spend),
        }

    def heldout(self, loop: LoopState, done: int, theta: Tensors, spend: Spend) -> dict[str, float]:
        """The center after `done` generations on held-out (and selection): the record's scores."""
        heldout = self.metrics("heldout", [CENTER], done, theta, spend)[CENTER]
        return self.center(loop, done, theta, heldout, spend)

    def center(
        self, loop: LoopState, done: int, theta: Tensors, heldout: dict[str, float], spend: Spend
    ) -> dict[str, float]:
        """Record the center's held-out metrics, and keep it as the best if it is."""
        loop.last = heldout
        scores = {f"heldout_{k}": v for k, v in heldout.items()}
        score = heldout["fitness"]
        if self.splits.selection:
            score = self.metrics("selection", [CENTER], done, theta, spend)[CENTER]["fitness"]
            scores["selection_fitness"] = score
        if loop.best is None or score > loop.best.score:
            loop.best = Best(score, done, {k: v.clone() for k, v in theta.items()}, heldout)
        return scores


def completion_rows(examples: Any, base: SplitOutcome, adapter: SplitOutcome) -> list[dict[str, Any]]:
    """One row per held-out example: its prompt and answer, the base model's and the adapter's
    completions and rewards."""
    assert base.texts is not None and adapter.texts is not None, "evaluated with their texts"
    return [
        {
            "prompt": example.prompt,
            "answer": example.answer,
            "base": base.texts[i],
            "base_reward": float(base.rewards[i]),
            "adapter": adapter.texts[i],
            "adapter_reward": float(adapter.rewards[i]),
        }
        for i, example in enumerate(examples)
    ]
