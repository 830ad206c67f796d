"""Evolutionary merging of existing LoRA adapters: CMA-ES (Hansen's `cma` package, through its
ask/tell and stop() and nothing else) searches the weights of a combination of the adapters
(`combine.py`), as LoraHub and mergekit-evolve search merge recipes. A candidate is one row of
the generation's weights, which the payload carries with the sources; the fitness is the task's,
so any task (task=lm_eval too) scores merges.

After each tell the strategy asks CMA-ES's `stop()`, as pycma's own loop does
(`while not es.stop()`): when it names a termination criterion (tolfun, tolflatfitness, tolx, ...)
the run ends there (`Told.stop`), or, with `on_cma_stop=restart`, a fresh CMA-ES starts from the
current mean with the initial sigma.

The state is what CMA-ES was told: its start, the fitness of every generation, and after which
tells it restarted. CMA-ES draws its samples from a generator of its own (`randn`, seeded from the
run seed, and a new one for each restart; never NumPy's global one), so replaying the tells (and
stop() after each: pycma counts flat generations there) from the start rebuilds it exactly: after a
resume, on any driver. The driver keeps the replayed optimiser between generations and replays
only when the state is not the one it last told.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from evora.lora.keys import noise_key
from evora.strategies.merge.combine import combine, group_count
from evora.strategies.merge.config import RESTART, MergeConfig
from evora.strategies.merge.sources import load_sources
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told


@dataclass
class MergeState:
    STATE_VERSION: ClassVar[int] = 2  # 2: restarts
    sources: list[Tensors]  # each adapter's factors on the run's layout (sources.py)
    rank: int  # the run's lora.rank: the combination's
    start: list[float]  # CMA-ES's initial mean, sources x groups (1, or each adapter's layer groups)
    told: list[list[float]]  # each generation's fitness (maximised), in candidate order
    mean: list[float]  # CMA-ES's mean after the last tell: the merge the state stands for
    step: int = 0
    restarts: list[int] = field(default_factory=list)  # after how many tells a fresh CMA-ES began (on_cma_stop=restart)


@dataclass(frozen=True)
class MergePayload:
    generation: int
    weights: np.ndarray  # [candidates, sources x groups]
    sources: tuple[Tensors, ...]
    rank: int


@dataclass
class Replayed:
    """CMA-ES after the tells of `told` (restarted after those `restarts` count), and the
    candidates its next ask gave."""

    told: list[list[float]]
    restarts: list[int]
    optimiser: Any  # cma.CMAEvolutionStrategy
    asked: np.ndarray


def stop_reason(optimiser: Any) -> str | None:
    """CMA-ES's termination criteria met after its last tell (`stop()`: name=threshold), or None."""
    return ", ".join(f"{name}={value}" for name, value in optimiser.stop().items()) or None


class Merge:
    state_type: ClassVar[type] = MergeState

    def __init__(self, cfg: MergeConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed
        self.replayed: Replayed | None = None

    def initial_state(self, context: StrategyContext) -> MergeState:
        sources = load_sources(self.cfg.adapters, context.layout)
        groups = group_count(sources[0], self.cfg.granularity)
        weight = self.cfg.init_weight if self.cfg.init_weight is not None else 1.0 / len(sources)
        start = [weight] * (len(sources) * groups)
        return MergeState(sources, context.layout.rank, start, [], list(start))

    def options(self, restart: int = 0) -> dict[str, Any]:
        """cma's options: its samples from a generator of the run's (one per restart), silent, no files."""
        key = noise_key(self.run_seed, "merge") if restart == 0 else noise_key(self.run_seed, "merge", restart)
        generator = np.random.default_rng(key)
        options: dict[str, Any] = {
            "seed": math.nan,  # cma then leaves NumPy's global generator alone
            "randn": lambda *shape: generator.standard_normal(shape),
            "verbose": -9,
            "verb_log": 0,
            "verb_disp": 0,
        }
        if self.cfg.population:
            options["popsize"] = self.cfg.population
        if self.cfg.bounds is not None:
            options["bounds"] = list(self.cfg.bounds)
        return options

    def fresh(self, mean: Sequence[float], restart: int) -> Any:
        """A new CMA-ES at `mean` with the initial sigma: the first (restart 0), or a restart's."""
        import cma  # on the driver only, which asks and tells: workers and the CLI never import it

        return cma.CMAEvolutionStrategy(list(mean), self.cfg.sigma, self.options(restart))

    def restarted(self, optimiser: Any, restart: int) -> Any:
        """on_cma_stop=restart: a fresh CMA-ES from `optimiser`'s mean at the initial sigma, the `restart`-th."""
        return self.fresh(optimiser.result.xfavorite, restart)

    def optimiser(self, state: MergeState) -> Replayed:
        replayed = self.replayed
        if replayed is not None and replayed.told == state.told and replayed.restarts == state.restarts:
            return replayed
        optimiser = self.fresh(state.start, 0)
        for done, fitness in enumerate(state.told, start=1):
            optimiser.tell(optimiser.ask(), [-f for f in fitness])
            stop_reason(optimiser)  # as the run asked it: stop() keeps pycma's count of flat generations
            if done in state.restarts:
                optimiser = self.restarted(optimiser, state.restarts.index(done) + 1)
        told, restarts = [list(f) for f in state.told], list(state.restarts)
        self.replayed = Replayed(told, restarts, optimiser, np.array(optimiser.ask()))
        return self.replayed

    def ask(self, state: MergeState, generation: int) -> tuple[list[CandidateSpec], MergePayload]:
        weights = self.optimiser(state).asked
        specs = [CandidateSpec(generation, i, member=i) for i in range(len(weights))]
        return specs, MergePayload(generation, weights, tuple(state.sources), state.rank)

    def materialise(self, payload: MergePayload, spec: CandidateSpec) -> Tensors:
        weights = payload.weights[spec.index].reshape(len(payload.sources), -1)
        return combine(payload.sources, weights, payload.rank, self.cfg.combine)

    def tell(self, state: MergeState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        replayed = self.optimiser(state)
        asked, optimiser = replayed.asked, replayed.optimiser
        fitness = self.regularised([float(f) for f in results.fitness], asked)
        optimiser.tell(asked, [-f for f in fitness])
        reason, sigma = stop_reason(optimiser), float(optimiser.sigma)
        told, mean = [*state.told, fitness], [float(v) for v in optimiser.result.xfavorite]
        restarts = state.restarts
        if reason is not None and self.cfg.on_cma_stop == RESTART:  # a fresh CMA-ES from the mean, at sigma0
            restarts = [*restarts, len(told)]
            optimiser = self.restarted(optimiser, len(restarts))
        self.replayed = Replayed(told, restarts, optimiser, np.array(optimiser.ask()))
        next_state = MergeState(state.sources, state.rank, state.start, told, mean, state.step + 1, restarts)
        best = int(np.argmax(fitness))
        record = {"generation": specs[0].generation + 1, "mean": mean, "best": [float(v) for v in asked[best]]}
        record |= {"best_fitness": fitness[best], "cma_sigma": sigma, "cma_stop": reason}
        stats = self.stats(next_state, sigma)
        return Told(next_state, stats, records={"merge_weights.jsonl": [record]}, stop=self.ends(reason))

    def ends(self, reason: str | None) -> str | None:
        """Told.stop: CMA-ES's reason, where the run stops on it (on_cma_stop=stop); None otherwise."""
        if reason is None or self.cfg.on_cma_stop == RESTART:
            return None
        return f"CMA-ES's stop() says {reason} (strategy.on_cma_stop=restart would restart it instead)"

    def regularised(self, fitness: list[float], asked: np.ndarray) -> list[float]:
        """LoraHub's regulariser, on the weights' mean magnitude (strategy.l1; 0: none)."""
        if not self.cfg.l1:
            return fitness
        return [f - self.cfg.l1 * float(np.mean(np.abs(x))) for f, x in zip(fitness, asked)]

    def stats(self, state: MergeState, sigma: float) -> dict[str, float]:
        per_adapter = np.array(state.mean).reshape(len(state.sources), -1).mean(axis=1)
        weights = {f"weight_{i}": float(w) for i, w in enumerate(per_adapter)}
        return {"cma_sigma": sigma, "cma_restarts": float(len(state.restarts)), **weights}

    def center(self, state: MergeState) -> Tensors:
        weights = np.array(state.mean).reshape(len(state.sources), -1)
        return combine(state.sources, weights, state.rank, self.cfg.combine)
