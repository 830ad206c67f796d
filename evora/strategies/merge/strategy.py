"""Evolutionary merging of existing LoRA adapters: CMA-ES (Hansen's `cma` package, through its
ask/tell and nothing else) searches the weights of a combination of the adapters
(`combine.py`), as LoraHub and mergekit-evolve search merge recipes. A candidate is one row of
the generation's weights, which the payload carries with the sources; the fitness is the task's,
so any task (task=lm_eval too) scores merges.

The state is what CMA-ES was told: its start, and the fitness of every generation. CMA-ES draws
its samples from a generator of its own (`randn`, seeded from the run seed; never NumPy's global
one), so replaying the tells from the start rebuilds it exactly: after a resume, on any driver.
The driver keeps the replayed optimiser between generations and replays only when the state is
not the one it last told.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from evora.lora.noise import noise_key
from evora.strategies.merge.combine import combine, group_count
from evora.strategies.merge.config import MergeConfig
from evora.strategies.merge.sources import load_sources
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told


@dataclass
class MergeState:
    STATE_VERSION: ClassVar[int] = 1
    sources: list[Tensors]  # each adapter's factors on the run's layout (sources.py)
    rank: int  # the run's lora.rank: the combination's
    start: list[float]  # CMA-ES's initial mean, sources x groups (1, or each adapter's layer groups)
    told: list[list[float]]  # each generation's fitness (maximised), in candidate order
    mean: list[float]  # CMA-ES's mean after the last tell: the merge the state stands for
    step: int = 0


@dataclass(frozen=True)
class MergePayload:
    generation: int
    weights: np.ndarray  # [candidates, sources x groups]
    sources: tuple[Tensors, ...]
    rank: int


@dataclass
class Replayed:
    """CMA-ES after the tells of `told`, and the candidates its next ask gave."""

    told: list[list[float]]
    optimiser: Any  # cma.CMAEvolutionStrategy
    asked: np.ndarray


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

    def options(self) -> dict[str, Any]:
        """cma's options: its samples from a generator of the run's, silent, no files."""
        generator = np.random.default_rng(noise_key(self.run_seed, "merge"))
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

    def optimiser(self, state: MergeState) -> Replayed:
        if self.replayed is not None and self.replayed.told == state.told:
            return self.replayed
        import cma  # on the driver only, which asks and tells: workers and the CLI never import it

        optimiser = cma.CMAEvolutionStrategy(state.start, self.cfg.sigma, self.options())
        for fitness in state.told:
            optimiser.tell(optimiser.ask(), [-f for f in fitness])
        self.replayed = Replayed([list(f) for f in state.told], optimiser, np.array(optimiser.ask()))
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
        asked = replayed.asked
        fitness = [float(f) for f in results.fitness]
        if self.cfg.l1:  # LoraHub's regulariser, on the weights' mean magnitude
            fitness = [f - self.cfg.l1 * float(np.mean(np.abs(x))) for f, x in zip(fitness, asked)]
        optimiser = replayed.optimiser
        optimiser.tell(asked, [-f for f in fitness])
        told = [*state.told, fitness]
        mean = [float(v) for v in optimiser.result.xfavorite]
        self.replayed = Replayed(told, optimiser, np.array(optimiser.ask()))
        best = int(np.argmax(fitness))
        per_adapter = np.array(mean).reshape(len(state.sources), -1).mean(axis=1)
        stats = {"cma_sigma": float(optimiser.sigma), **{f"weight_{i}": float(w) for i, w in enumerate(per_adapter)}}
        record = {"generation": specs[0].generation + 1, "mean": mean, "best": [float(v) for v in asked[best]]}
        record |= {"best_fitness": fitness[best], "cma_sigma": float(optimiser.sigma)}
        next_state = MergeState(state.sources, state.rank, state.start, told, mean, state.step + 1)
        return Told(next_state, stats, records={"merge_weights.jsonl": [record]})

    def center(self, state: MergeState) -> Tensors:
        weights = np.array(state.mean).reshape(len(state.sources), -1)
        return combine(state.sources, weights, state.rank, self.cfg.combine)
