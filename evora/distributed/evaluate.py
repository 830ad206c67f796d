"""Evaluating adapters through the worker pool: per-example outcomes of the base model
(BASE) and/or one adapter (CENTER) on a split, a generation's candidate x prompt
matrices, and the compute both spent."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import ray

from evora.distributed.pool import WorkerPool
from evora.distributed.reward_failures import FailureBudget, check_reward_failures
from evora.distributed.units import EVAL_CHUNK, chunks
from evora.distributed.worker import UnitResult, WorkUnit
from evora.distributed.worker_spec import WorkerSpec
from evora.lora.layout import AdapterLayout
from evora.strategies.protocol import BASE, CENTER, CandidateSpec, EvalPayload, Tensors, prompts_of
from evora.tasks.aggregate import pass_at_k
from evora.tasks.decoding import eval_decoding
from evora.tasks.scores import RewardCounts
from evora.tracking.compute import Spend


def unit_prompts(specs: list, prompts: tuple[int, ...]) -> tuple[int, ...]:
    """A unit's prompts: where every spec of it names its own (routed), those they name, so that
    its cells, requests and results grow with what it evaluates, not with the generation's
    prompts (the ecology: one episode per organelle); otherwise the generation's."""
    routed = [prompts_of(spec) for spec in specs]
    if not routed or any(r is None for r in routed):
        return prompts
    return tuple(sorted({i for r in routed if r is not None for i in r}))


def unit_columns(prompts: tuple[int, ...], units: list[WorkUnit]) -> list[np.ndarray | None]:
    """Where each unit's prompts sit among the generation's `prompts` (None: they are all of them)."""
    position = {p: j for j, p in enumerate(prompts)}
    return [
        None if u.prompt_indices == prompts else np.array([position[p] for p in u.prompt_indices], dtype=np.int64)
        for u in units
    ]


def widened(result: UnitResult, columns: np.ndarray | None, width: int) -> UnitResult:
    """A unit's result on its own prompts (`unit_prompts`; `columns`: where they sit among the
    generation's `width`) as one on the generation's: what the worker returns for whole rows,
    the cells outside its prompts not evaluated."""
    if columns is None:
        return result
    shape = (len(result.indices), width)

    def wide(values: np.ndarray, fill: Any) -> np.ndarray:
        out = np.full(shape, fill, dtype=values.dtype)
        out[:, columns] = values
        return out

    def wide_or_none(values: np.ndarray | None, fill: Any) -> np.ndarray | None:
        return None if values is None else wide(values, fill)

    evaluated = np.zeros(shape, dtype=bool)
    evaluated[:, columns] = True if result.evaluated is None else result.evaluated
    texts = None
    if result.texts is not None:
        texts = [[""] * width for _ in result.indices]
        for row, own_texts in zip(texts, result.texts):
            for column, text in zip(columns, own_texts):
                row[column] = text
    return replace(
        result,
        rewards=wide(result.rewards, np.nan),
        correct=wide(result.correct, False),
        tokens=wide(result.tokens, 0),
        perplexity=wide_or_none(result.perplexity, np.nan),
        kl=wide_or_none(result.kl, np.nan),
        correct_counts=wide_or_none(result.correct_counts, 0),
        texts=texts,
        evaluated=None if evaluated.all() else evaluated,
    )


def merged_rows(results: list[UnitResult]) -> list[UnitResult]:
    """Results of units that evaluated the same candidates on different prompts (`search_units`
    cut the prompts; each widened to the generation's prompts) as one result per candidate group,
    in the order the groups first come: each cell from the unit that evaluated it."""
    groups: dict[tuple[int, ...], list[UnitResult]] = {}
    for result in results:
        groups.setdefault(tuple(result.indices), []).append(result)
    return [parts[0] if len(parts) == 1 else merged(parts) for parts in groups.values()]


def merged(parts: list[UnitResult]) -> UnitResult:
    masks = [evaluated_mask(p) for p in parts]

    def cells(values: list[np.ndarray]) -> np.ndarray:
        out = np.array(values[0], copy=True)
        for value, mask in zip(values[1:], masks[1:]):
            out[mask] = value[mask]
        return out

    def optional(values: list[np.ndarray | None]) -> np.ndarray | None:
        present = [v for v in values if v is not None]
        return cells(present) if len(present) == len(values) else None

    texts = None
    if parts[0].texts is not None:
        texts = [list(row) for row in parts[0].texts]
        for part, mask in zip(parts[1:], masks[1:]):
            for r, c in zip(*np.nonzero(mask)):
                texts[r][c] = part.texts[r][c]  # type: ignore[index]  # units of one generation keep texts alike
    evaluated = np.logical_or.reduce(masks)
    first = parts[0]
    return replace(
        first,
        rewards=cells([p.rewards for p in parts]),
        correct=cells([p.correct for p in parts]),
        tokens=cells([p.tokens for p in parts]),
        perplexity=optional([p.perplexity for p in parts]),
        kl=optional([p.kl for p in parts]),
        correct_counts=optional([p.correct_counts for p in parts]),
        texts=texts,
        evaluated=None if evaluated.all() else evaluated,
        reward=RewardCounts.total([p.reward for p in parts]),
        timings={k: sum(p.timings[k] for p in parts) for k in first.timings},
        tokens_prompt=sum(p.tokens_prompt for p in parts),
        tokens_generated=sum(p.tokens_generated for p in parts),
        tokens_scored=sum(p.tokens_scored for p in parts),
    )


def evaluated_mask(result: UnitResult) -> np.ndarray:
    return result.evaluated if result.evaluated is not None else np.ones(result.rewards.shape, dtype=bool)


def spend_of(results: list[UnitResult]) -> Spend:
    return Spend(
        tokens_prompt=sum(r.tokens_prompt for r in results),
        tokens_generated=sum(r.tokens_generated for r in results),
        tokens_scored=sum(r.tokens_scored for r in results),
    )


@dataclass
class SplitOutcome:
    """One adapter (or the base model) on every example of a split."""

    rewards: np.ndarray
    correct: np.ndarray
    tokens: np.ndarray
    perplexity: np.ndarray | None
    texts: list[str] | None
    kl: np.ndarray | None = None  # per example: mean per-token KL of the completion from the base model
    correct_counts: np.ndarray | None = None  # per example: correct samples, when it was sampled several times
    samples: int = 1
    k: int = 1  # the k of the pass@k it reports (task.eval_k)
    scored: np.ndarray | None = None  # per example: False where its reward failed (left out); None: all scored

    def metrics(self, kept: np.ndarray | None = None) -> dict[str, float]:
        """Means over the examples whose rewards were scored (and, given `kept`, that it keeps: a
        comparison's examples both sides scored); sampled several times, the accuracy is pass@1
        (the mean over samples) and pass_at_1 and pass_at_<k> are reported (the unbiased
        estimator). Of no example: NaN."""
        every = np.ones(len(self.rewards), dtype=bool)
        among = every if kept is None else np.asarray(kept, dtype=bool)
        kept = among & (self.scored if self.scored is not None else every)
        out = {
            "reward": _mean(self.rewards[kept]),
            "accuracy": _mean(self.correct[kept]),
            "tokens": _mean(self.tokens[kept]),
        }
        if self.perplexity is not None:  # no reward in it: over every example `kept` keeps
            out["perplexity"] = _mean(self.perplexity[among])
        if self.kl is not None:
            out["kl"] = _mean(self.kl[among])
        if failed := int((among & ~kept).sum()):  # left out: a reward failed (held-out failures in metrics.jsonl)
            out["reward_failed"] = failed
        if self.correct_counts is not None:
            for k in sorted({1, self.k}):
                estimates = [pass_at_k(self.samples, int(c), k) for c in self.correct_counts[kept]]
                out[f"pass_at_{k}"] = float(np.mean(estimates))
        return out


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan  # without numpy's empty-slice warning


def sampled_counts(results: list[UnitResult], row: int) -> np.ndarray | None:
    """One op's correct samples per example, when the split was sampled several times."""
    if not results or results[0].correct_counts is None:
        return None
    return np.concatenate([rows_of(r.correct_counts, row) for r in results])


def evaluate_split(
    pool: WorkerPool,
    theta: Tensors | None,
    ops: list[str],
    split: str,
    size: int,
    *,
    generation: int = 0,
    keep_texts: bool = False,
    perplexity: bool = False,
    layout: AdapterLayout | None = None,
    spend: Spend | None = None,
    kl: bool = True,
    kl_on_selection: bool = False,
    k: int = 1,
    failure_budget: FailureBudget | None = None,
) -> dict[str, SplitOutcome]:
    """Outcomes per op (BASE, CENTER) on the first `size` examples of `split`; `layout`
    describes theta when it is not the pool's layout; the compute is added to `spend`.
    Every held-out evaluation also measures the KL divergence of each op's completions from
    the base model (the engine's estimator: exact with hf, top-k with vLLM; 0 for BASE), as
    does selection with `kl_on_selection` (a fitness with a KL term); `k`: the pass@k to report
    when the split is sampled several times; `failure_budget`: the rewards' (reward_failures.py)."""
    specs = tuple(CandidateSpec(generation, i, op=op) for i, op in enumerate(ops))
    kl = kl and (split == "heldout" or (kl_on_selection and split == "selection"))
    units = [
        WorkUnit(specs, split, tuple(c), keep_texts, perplexity, kl=kl) for c in chunks(list(range(size)), EVAL_CHUNK)
    ]
    results = pool.run(ray.put(EvalPayload(theta, layout)), units)
    check_reward_failures(results, failure_budget, f"{split} evaluation after generation {generation}")
    if spend is not None:
        spend.add(spend_of(results))
    outcomes, paired = {}, paired_scored(results, len(ops))
    for row, op in enumerate(ops):
        outcomes[op] = SplitOutcome(
            rewards=np.concatenate([r.rewards[row] for r in results]),
            correct=np.concatenate([r.correct[row] for r in results]),
            tokens=np.concatenate([r.tokens[row] for r in results]),
            perplexity=np.concatenate([rows_of(r.perplexity, row) for r in results]) if perplexity else None,
            texts=[t for r in results for t in rows_of(r.texts, row)] if keep_texts else None,
            kl=np.concatenate([rows_of(r.kl, row) for r in results]) if kl else None,
            correct_counts=sampled_counts(results, row),
            scored=paired,
            samples=results[0].samples if results else 1,
            k=k,
        )
    return outcomes


def paired_scored(results: list[UnitResult], ops: int) -> np.ndarray | None:
    """The examples every op's reward was scored on: each op's held-out means are over these
    alone, so a judge's failures on one op's cells cannot move it against another's."""
    if not results:
        return None
    rows = [np.concatenate([evaluated_row(r, row) for r in results]) for row in range(ops)]
    return np.logical_and.reduce(rows)


@dataclass(frozen=True)
class CandidateMatrices:
    """A generation's [candidate, prompt] matrices in population order."""

    rewards: np.ndarray
    correct: np.ndarray
    tokens: np.ndarray
    perplexity: np.ndarray | None  # when every unit scored perplexity
    evaluated: np.ndarray | None  # [candidate, prompt] bool when candidates were routed to prompts; None: all
    kl: np.ndarray | None = None  # when every unit measured the KL to the base model (a fitness with a KL term)


def candidate_matrices(results: list[UnitResult], population: int) -> CandidateMatrices:
    order = [(index, result, row) for result in results for row, index in enumerate(result.indices)]
    order.sort(key=lambda item: item[0])
    if [index for index, _, _ in order] != list(range(population)):
        raise RuntimeError("a generation's results do not cover its population exactly once")
    perplexities = [r.perplexity[row] for _, r, row in order if r.perplexity is not None]
    kls = [r.kl[row] for _, r, row in order if r.kl is not None]
    routed = any(r.evaluated is not None for r in results)
    return CandidateMatrices(
        rewards=np.stack([r.rewards[row] for _, r, row in order]),
        correct=np.stack([r.correct[row] for _, r, row in order]),
        tokens=np.stack([r.tokens[row] for _, r, row in order]),
        perplexity=np.stack(perplexities) if len(perplexities) == len(order) else None,
        evaluated=np.stack([evaluated_row(r, row) for _, r, row in order]) if routed else None,
        kl=np.stack(kls) if len(kls) == len(order) else None,
    )


def evaluated_row(result: UnitResult, row: int) -> np.ndarray:
    """One row's evaluated cells, as booleans (a mask; `correct` is a fraction when sampled)."""
    return result.evaluated[row] if result.evaluated is not None else np.ones(len(result.correct[row]), dtype=bool)


def rows_of(values: list[Any] | np.ndarray | None, row: int) -> Any:
    """One row of a result's optional matrix (perplexity, KL, texts) that the unit asked for."""
    assert values is not None, "the work unit asked for it"
    return values[row]


def candidate_texts(results: list[UnitResult], population: int) -> list[list[str]]:
    """Completion texts [candidate][prompt] in population order ("" where a cell was not
    evaluated), from units that kept their texts."""
    rows: list[list[str] | None] = [None] * population
    for result in results:
        if result.texts is None:
            raise RuntimeError("a unit that was asked for its completions came back without them")
        for row, index in enumerate(result.indices):
            rows[index] = result.texts[row]
    if any(r is None for r in rows):
        raise RuntimeError("a generation's results do not cover its population exactly once")
    return [r for r in rows if r is not None]


def row_means(values: np.ndarray, evaluated: np.ndarray | None) -> np.ndarray:
    """Each row's mean over its evaluated cells (all cells when `evaluated` is None; NaN for none)."""
    if evaluated is None:
        return values.mean(axis=1)
    counts = evaluated.sum(axis=1)
    sums = np.where(evaluated, values, 0).sum(axis=1)
    return np.divide(sums, counts, out=np.full(len(counts), np.nan), where=counts > 0)


class EvaluationService:
    """One worker pool that many clients (PBT trials) evaluate adapters on, one call at a time;
    it keeps the compute spent per bucket (search: trials scored during the search)."""

    def __init__(self, spec: WorkerSpec, hardware: Any, split_sizes: dict[str, int]):
        self.pool = WorkerPool.start(spec, hardware)
        self.sizes = split_sizes
        self.k = eval_decoding(spec.task).k
        self.spent: dict[str, Spend] = {}

    def workers(self) -> int:
        """How many engine workers serve; returns once they are all placed and loaded."""
        return len(self.pool)

    def evaluate(
        self,
        theta: Tensors | None,
        layout: AdapterLayout,
        split: str,
        *,
        with_base: bool = False,
        keep_texts: bool = False,
        bucket: str = "search",
    ) -> dict[str, SplitOutcome]:
        ops = [BASE] * with_base + [CENTER] * (theta is not None)
        return evaluate_split(
            self.pool,
            theta,
            ops,
            split,
            self.sizes[split],
            keep_texts=keep_texts,
            perplexity=True,
            layout=layout,
            spend=self.spent.setdefault(bucket, Spend()),
            k=self.k,
        )

    def metrics(self, theta: Tensors, layout: AdapterLayout, split: str, bucket: str = "search") -> dict[str, float]:
        return self.evaluate(theta, layout, split, bucket=bucket)[CENTER].metrics()

    def spend(self, bucket: str) -> Spend:
        return self.spent.get(bucket, Spend())

    def shutdown(self) -> None:
        self.pool.shutdown()
