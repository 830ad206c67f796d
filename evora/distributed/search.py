"""One generation of search, by the kind of strategy (`strategies/kinds.py` names its search),
chosen once at set-up:

- population (and portfolio, full-weight): ask, evaluate every candidate on the workers, tell;
  then gradient refinement where the strategy refines, and the engines' weights moved where the
  strategy moves them;
- gradient: the strategy trains on the driver (`improve`).

Each returns the next state, the generation's record and the compute it spent; the loop
evaluates, records and checkpoints."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import ray
import torch

from evora.distributed.evaluate import (
    candidate_matrices,
    candidate_texts,
    merged_rows,
    row_means,
    spend_of,
    unit_columns,
    unit_prompts,
    widened,
)
from evora.distributed.full_weights import EngineWeights
from evora.distributed.pool import WorkerPool
from evora.distributed.recorder import Recorder
from evora.distributed.reward_failures import check_reward_failures, failure_budget
from evora.distributed.units import GroupSum, GroupTask, search_units
from evora.distributed.worker import UnitResult, WorkUnit
from evora.errors import RunError
from evora.lora.keys import noise_key
from evora.plan.run_plan import RunPlan
from evora.strategies.noise_sums import SummedStrategy, add_groups
from evora.strategies.protocol import (
    GenerationResults,
    GradientStrategy,
    RefiningStrategy,
    Strategy,
    Told,
    TrainingContext,
    prompts_of,
)
from evora.tasks.fitness import FitnessExpression
from evora.tasks.scores import RewardCounts
from evora.tracking.compute import Spend
from evora.tracking.events import PoolEvent, WorkerLost, WorkerReplaced


@dataclass
class Searched:
    state: Any
    record: dict[str, Any]
    spend: Spend
    pool_events: list[PoolEvent] | None = None  # workers lost and replaced while evaluating candidates
    stop: str | None = None  # the strategy ends the run after this generation, and why (Told.stop)


class Search(Protocol):
    def step(self, state: Any, generation: int) -> Searched: ...

    def units(self, state: Any, generation: int) -> int | None:
        """The work units a generation is cut into (None: no population is evaluated)."""


S = TypeVar("S")


@dataclass
class SearchParts(Generic[S]):
    """What a generation of search may use; `training` where the strategy trains on the driver,
    `weights` where it moves the engines' base weights. The strategy again as the trait protocols
    it was registered with, where it has them, so that each call is typed."""

    plan: RunPlan
    strategy: S
    pool: WorkerPool
    recorder: Recorder
    training: TrainingContext | None
    weights: EngineWeights | None
    keeps_texts: bool
    summed: SummedStrategy | None = None  # its tell takes the members' noise summed on the workers (noise_sums.py)
    refining: RefiningStrategy | None = None  # it may refine after each tell


class PopulationSearch:
    def __init__(self, parts: SearchParts[Strategy]):
        self.parts = parts
        self.fitness = parts.plan.fitness
        self.failure_budget = failure_budget(parts.plan.run.task)

    def step(self, state: Any, generation: int) -> Searched:
        parts, started = self.parts, time.perf_counter()
        specs, payload = parts.strategy.ask(state, generation)
        prompts = routed_prompts(specs) or prompt_batch(parts.plan, generation)
        units = self._units(specs, prompts)
        payload_ref = ray.put(payload)
        wide = zip(parts.pool.run(payload_ref, units), unit_columns(prompts, units))
        results = [widened(result, columns, len(prompts)) for result, columns in wide]
        rows = merged_rows(results)  # units cut along prompts: one result per candidate group
        changes = parts.pool.take_events()
        evaluated = time.perf_counter()
        keeps_texts = parts.keeps_texts
        matrices, invalid = generation_results(self.fitness, generation, prompts, rows, len(specs), keeps_texts)
        check_reward_failures(results, self.failure_budget, f"generation {generation + 1}")
        check_some_fitness(generation + 1, invalid, len(specs), parts.plan.run.strategy)
        told = self._tell(state, specs, matrices, generation, payload_ref)
        parts.recorder.family(told.lineage)
        parts.recorder.strategy_records(told.records)
        record = {
            "generation": generation + 1,
            **population_stats(matrices, self.fitness.text != "reward"),
            "fitness_invalid": invalid,
            **told.stats,
            **unit_stats(results, evaluated - started),
            "seconds_update": time.perf_counter() - evaluated,
            "workers_lost": sum(isinstance(c, WorkerLost) for c in changes),
            "workers_replaced": sum(isinstance(c, WorkerReplaced) for c in changes),
        }
        spend = spend_of(results)
        spend.add(told.spend)
        return Searched(told.state, record, spend, changes, told.stop)

    def units(self, state: Any, generation: int) -> int | None:
        specs, _ = self.parts.strategy.ask(state, generation)
        return len(self._units(specs, routed_prompts(specs) or prompt_batch(self.parts.plan, generation)))

    def _units(self, specs: list[Any], prompts: tuple[int, ...]) -> list[WorkUnit]:
        run, texts = self.parts.plan.run, self.parts.keeps_texts
        engine, pool = run.engine, len(self.parts.pool)
        cut = search_units(specs, prompts, engine.units, engine.max_loras, pool, run.hardware.min_units)
        return [
            WorkUnit(
                tuple(c),
                "train",
                unit_prompts(c, part),
                keep_texts=texts,
                perplexity=self.fitness.needs_perplexity,
                kl=self.fitness.needs_kl,
            )
            for c, part in cut
        ]

    def _tell(self, state: Any, specs: list[Any], matrices: GenerationResults, generation: int, payload: Any) -> Told:
        """tell (a summed strategy's with the noise summed on the workers); the refinement of a
        refining strategy; the engines' weights moved to the new state."""
        parts = self.parts
        if parts.summed is not None:
            told = self._tell_summed(parts.summed, state, specs, matrices, payload)
        else:
            told = parts.strategy.tell(state, specs, matrices)
        if parts.training is not None and parts.refining is not None:
            refined = parts.refining.refine(told.state, generation, parts.training)
            if refined is not None:  # memetic: the elite got gradient steps
                stats, lineage = {**told.stats, **refined.stats}, told.lineage + refined.lineage
                told = Told(refined.state, stats, lineage, refined.spend, told.records, told.stop or refined.stop)
        check_finite_center(generation + 1, parts.strategy.center(told.state), parts.plan.run.strategy)
        if parts.weights is not None:  # every worker applies the update to its own weights
            told.stats.update(parts.weights.to(told.state, generation + 1))
        return told

    def _tell_summed(
        self, strategy: SummedStrategy, state: Any, specs: list[Any], matrices: GenerationResults, payload: Any
    ) -> Told:
        """The members' noise summed by the workers in the strategy's fixed groups, the groups
        added here in order: bitwise the same for any number of workers (noise_sums.py)."""
        started = time.perf_counter()
        sums = strategy.noise_sums(state, specs, matrices)
        tasks = [GroupTask(sums, group) for group in range(len(sums.groups))]
        parts: list[GroupSum] = self.parts.pool.run(payload, tasks, method="noise_sum")
        summed = time.perf_counter()
        total = add_groups([part.tensors for part in parts])
        told = strategy.tell_with(state, specs, matrices, total)
        told.stats.update(
            seconds_noise_sums=summed - started,  # the workers' part, as the driver waited for it
            seconds_noise_sums_workers=float(sum(part.seconds for part in parts)),
            seconds_tell_driver=time.perf_counter() - summed,  # adding the groups and the step
        )
        return told


class GradientSearch:
    """The strategy trains on the driver; the loop evaluates its center as for any strategy."""

    def __init__(self, parts: SearchParts[GradientStrategy]):
        assert parts.training is not None, "a gradient strategy trains on the driver"
        self.parts, self.training = parts, parts.training

    def step(self, state: Any, generation: int) -> Searched:
        started, parts = time.perf_counter(), self.parts
        told = parts.strategy.improve(state, generation, self.training)
        check_finite_center(generation + 1, parts.strategy.center(told.state), parts.plan.run.strategy)
        if parts.weights is not None:  # trained over the engines' own weights: every worker takes them
            told.stats.update(parts.weights.to(told.state, generation + 1))
        record = {"generation": generation + 1, **told.stats, "seconds_train": time.perf_counter() - started}
        return Searched(told.state, record, told.spend, stop=told.stop)

    def units(self, state: Any, generation: int) -> int | None:
        return None  # trained on the driver


# --- pieces ---------------------------------------------------------------------------------


def generation_results(
    fitness: FitnessExpression,
    generation: int,
    prompts: tuple[int, ...],
    results: list[UnitResult],
    population: int,
    keeps_texts: bool = False,
) -> tuple[GenerationResults, int]:
    """The units' results as the generation's matrices, each candidate's fitness (the
    expression of its row means, KL among them when measured) and each cell's; returns how
    many fitness values were not finite."""
    m = candidate_matrices(results, population)
    cells = {"reward": m.rewards, "accuracy": m.correct, "tokens": m.tokens}
    cells.update({name: values for name, values in (("perplexity", m.perplexity), ("kl", m.kl)) if values is not None})
    means = {name: row_means(values, m.evaluated) for name, values in cells.items()}
    finite, invalid = finite_fitness(fitness.over(means, (population,)))
    texts = candidate_texts(results, population) if keeps_texts else None
    matrices = (m.rewards, m.correct, m.tokens, m.perplexity)
    per_cell = cell_fitness(fitness, cells, m.evaluated)
    return GenerationResults(generation, prompts, *matrices, finite, m.evaluated, texts, per_cell), invalid


def cell_fitness(fitness: FitnessExpression, cells: dict[str, np.ndarray], evaluated: np.ndarray | None) -> np.ndarray:
    """task.fitness of every [candidate, prompt] cell (NaN where not evaluated): what
    shaping=per_prompt normalises per prompt."""
    values = fitness.over(cells, cells["reward"].shape)
    return values if evaluated is None else np.where(evaluated, values, np.nan)


def spread(prefix: str, values: np.ndarray) -> dict[str, float]:
    """The values' spread, over the finite ones (a candidate none of whose rewards was scored has
    none); of none, NaN (null in metrics.jsonl)."""
    values = values[np.isfinite(values)]
    if not len(values):
        return dict.fromkeys((f"{prefix}_{s}" for s in ("mean", "std", "min", "max", "p20", "p80")), math.nan)
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std()),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
        f"{prefix}_p20": float(np.percentile(values, 20)),
        f"{prefix}_p80": float(np.percentile(values, 80)),
    }


def population_stats(results: GenerationResults, with_fitness: bool) -> dict[str, float]:
    """The population's reward spread and accuracy (over evaluated cells only), and its fitness
    spread where fitness is not the reward itself."""
    cells = results.evaluated
    correct = results.correct[cells] if cells is not None else results.correct
    rewards = row_means(results.rewards, cells)
    stats = {**spread("reward", rewards), "accuracy_mean": float(correct.mean()) if correct.size else math.nan}
    unscored = int((~np.isfinite(rewards)).sum())
    if unscored:  # candidates none of whose rewards was scored: left out of the spread, counted
        stats["candidates_unscored"] = unscored
    if with_fitness:
        stats.update(spread("fitness", results.fitness))
    return stats


def unit_stats(results: list[UnitResult], seconds: float) -> dict[str, Any]:
    tokens = sum(r.tokens_generated for r in results)  # every sample's
    return {
        "tokens": int(tokens),
        "tokens_per_second": tokens / max(seconds, 1e-9),
        **RewardCounts.total([r.reward for r in results]).record(),
        "seconds_evaluate": seconds,
        "units": len(results),  # generate calls the candidates took (engine.units)
        **timing_sums(results),
        "worker_rss_mb": {str(r.worker): r.rss_mb for r in results},
        "seconds_busy_by_worker": busy_seconds(results),  # timing: only workers that had a unit appear
    }


def busy_seconds(results: list[UnitResult]) -> dict[str, float]:
    """Each worker's own seconds in its units (materialise, generate, reward, perplexity, KL)."""
    busy: dict[str, float] = {}
    for result in results:
        busy[str(result.worker)] = busy.get(str(result.worker), 0.0) + float(sum(result.timings.values()))
    return busy


def finite_fitness(fitness: np.ndarray) -> tuple[np.ndarray, int]:
    """NaN or infinite fitness (a broken reward) becomes the generation's worst finite value,
    so it can neither win a selection nor poison shaping; returns how many there were."""
    bad = ~np.isfinite(fitness)
    if bad.any():
        finite = fitness[~bad]
        fitness = np.where(bad, finite.min() if finite.size else 0.0, fitness)
    return fitness, int(bad.sum())


def knobs(strategy_cfg: Any) -> str:
    """The strategy's float settings: what to look at when its numbers blow up."""
    values = [f"strategy.{key}={value:g}" for key, value in asdict(strategy_cfg).items() if isinstance(value, float)]
    return ", ".join(values) or "the strategy's settings"


# Both checks stop a generation before it is checkpointed: the last checkpoint stays the good one.


def check_some_fitness(generation: int, invalid: int, population: int, strategy_cfg: Any) -> None:
    if invalid == population:
        raise RunError(
            f"generation {generation}: no candidate has a finite fitness; look at {knobs(strategy_cfg)} "
            "and task.fitness"
        )


def check_finite_center(generation: int, center: dict[str, Any], strategy_cfg: Any) -> None:
    broken = [name for name, tensor in center.items() if not bool(torch.isfinite(tensor).all())]
    if broken:
        raise RunError(
            f"generation {generation}: the update made {len(broken)} adapter tensor(s) non-finite "
            f"(e.g. {broken[0]}); look at {knobs(strategy_cfg)}"
        )


def timing_sums(results: list[UnitResult]) -> dict[str, float]:
    keys = ("materialise", "generate", "reward", "perplexity")
    return {f"seconds_{k}": float(sum(r.timings[k] for r in results)) for k in keys}


def routed_prompts(specs: list[Any]) -> tuple[int, ...]:
    """The generation's prompts when the strategy routes its candidates to prompts (the
    ecology's episodes): every prompt some spec names, in order; () when none does."""
    routed = [prompts_of(spec) for spec in specs]
    if all(r is None for r in routed):
        return ()
    return tuple(sorted({i for r in routed if r is not None for i in r}))


def prompt_batch(plan: RunPlan, generation: int) -> tuple[int, ...]:
    """The generation's training prompts: a pure function of (seed, generation)."""
    run = plan.run
    rng = np.random.default_rng(noise_key(run.seed, "prompts", generation))
    picked = rng.choice(len(plan.splits.train), size=run.task.prompts_per_generation, replace=False)
    return tuple(int(i) for i in picked)
