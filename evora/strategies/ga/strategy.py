"""A genetic algorithm over LoRA adapters (the LoRALab and GPT-2 GA designs, made distributed).

Each generation: the `keep_top` best members of the last generation come back unchanged
(elites), and the rest are offspring of the `parents` best, picked by truncation or
tournament selection: a crossover of two parents (A and B of a module stay together,
`operators.py`) followed by mutation, or a mutation of one parent. Offspring travel as
specs (parents, seed, mutation scale); the parents' adapters travel once per generation
in the payload. With `encoding=seeds` (no crossover), members are the initial adapter
plus a chain of mutation seeds (Such et al. 2017), and only the chains travel.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from evora.lora.keys import noise_key
from evora.strategies.adapter_init import initial_adapter, noise_scales
from evora.strategies.ga.config import GAConfig
from evora.strategies.ga.memetic import refine_elite
from evora.strategies.ga.operators import CROSSOVERS, mutate
from evora.strategies.protocol import (
    GenerationResults,
    StrategyContext,
    Tensors,
    Told,
    TrainingContext,
    clone_tensors,
)
from evora.strategies.shaping import shaping_input

ELITE, MUTATE, CROSSOVER, INIT = "elite", "mutate", "crossover", "init"


@dataclass(frozen=True)
class GASpec:
    generation: int  # 0-based; the member is born in generation + 1
    index: int
    op: str  # elite | mutate | crossover
    parents: tuple[int, ...]  # positions in the payload's parent pool
    seed: int
    sigma: float  # this member's mutation scale
    prompts: tuple[int, ...] | None = None  # evaluated on every prompt of its unit

    @property
    def label(self) -> str:
        return member_id(self.generation + 1, self.index, self.op)


def member_id(born: int, index: int, op: str) -> str:
    """Human-readable variant id: generation born, position, operator."""
    return f"g{born}-{index:02d}-{op}"


@dataclass
class GAState:
    """The parents of the next generation, best first."""

    STATE_VERSION: ClassVar[int] = 1
    pool: list[Tensors]  # their adapters (with encoding=seeds: rebuilt from base + chains on the workers)
    ids: list[str]
    fitness: list[float]
    sigmas: list[float]  # each one's mutation scale
    noise_scales: dict[str, float] = field(default_factory=dict)
    base: Tensors | None = None  # encoding=seeds: the initial adapter every chain starts from
    chains: list[list[list[float]]] | None = None  # encoding=seeds: [(seed, sigma), ...] per parent


@dataclass(frozen=True)
class GAPayload:
    generation: int
    noise_scales: dict[str, float]
    pool: list[Tensors] | None = None  # encoding=tensors
    base: Tensors | None = None  # encoding=seeds
    chains: list[list[list[float]]] | None = None


class GeneticAlgorithm:
    state_type: ClassVar[type] = GAState

    def __init__(self, cfg: GAConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    # --- state ----------------------------------------------------------------------

    def initial_state(self, context: StrategyContext) -> GAState:
        return self.start(initial_adapter(self.cfg, context), noise_scales(self.cfg, context))

    def start(self, adapter: Tensors, scales: dict[str, float] | None = None) -> GAState:
        initial = clone_tensors(adapter)
        state = GAState(
            pool=[initial],
            ids=[member_id(0, 0, INIT)],
            fitness=[float("nan")],
            sigmas=[self.cfg.mutation_scale],
            noise_scales=dict(scales or {}),
        )
        if self.cfg.encoding == "seeds":
            state.base, state.chains = initial, [[]]
        return state

    def center(self, state: GAState) -> Tensors:
        return state.pool[0]  # the best member of the last generation

    @property
    def refines(self) -> bool:
        """Memetic: the loop gives it a TrainingContext and calls `refine` after each tell."""
        return self.cfg.refine != "none"

    @property
    def keeps_texts(self) -> bool:
        return False  # refinement trains on reference answers, not on the candidates' completions

    def refine(self, state: GAState, generation: int, context: TrainingContext) -> Told | None:
        return refine_elite(self.cfg, self.run_seed, state, generation, context)

    def _payload(self, state: GAState, generation: int) -> GAPayload:
        if self.cfg.encoding == "seeds":
            return GAPayload(generation, state.noise_scales, base=state.base, chains=state.chains)
        return GAPayload(generation, state.noise_scales, pool=state.pool)

    # --- ask --------------------------------------------------------------------------

    def ask(self, state: GAState, generation: int) -> tuple[list[GASpec], GAPayload]:
        rng = random.Random(noise_key(self.run_seed, "ga-ask", generation))
        pool_size, cfg = len(state.pool), self.cfg
        specs = [GASpec(generation, i, ELITE, (i,), 0, state.sigmas[i]) for i in range(min(cfg.keep_top, pool_size))]
        parents: tuple[int, ...]
        for index in range(len(specs), cfg.population):
            if pool_size >= 2 and rng.random() < cfg.crossover_rate:
                first = self._select(rng, state.fitness)
                second = self._select(rng, state.fitness, exclude=first)
                parents = (first, second)
                op, sigma = CROSSOVER, (state.sigmas[first] + state.sigmas[second]) / 2
            else:
                parents = (self._select(rng, state.fitness),)
                op, sigma = MUTATE, state.sigmas[parents[0]]
            if cfg.self_adaptive:
                sigma *= math.exp(cfg.adaptation_rate * rng.gauss(0.0, 1.0))
            seed = noise_key(self.run_seed, "ga", generation, index)
            specs.append(GASpec(generation, index, op, parents, seed, sigma))
        return specs, self._payload(state, generation)

    def _select(self, rng: random.Random, fitness: list[float], exclude: int | None = None) -> int:
        """A parent position: uniform (truncation: the pool is the truncated population), or
        the fittest of `tournament_size` distinct candidates (ties: the earlier position)."""
        candidates = [i for i in range(len(fitness)) if i != exclude]
        if self.cfg.selection == "truncation":
            return rng.choice(candidates)
        entrants = rng.sample(candidates, min(self.cfg.tournament_size, len(candidates)))
        known = [i for i in entrants if not math.isnan(fitness[i])]
        return min(known, key=lambda i: (-fitness[i], i)) if known else min(entrants)

    # --- materialise ------------------------------------------------------------------

    def _parent(self, payload: GAPayload, position: int) -> Tensors:
        if payload.pool is not None:
            return payload.pool[position]
        if payload.base is None or payload.chains is None:
            raise ValueError("a GA payload carries a parent pool (encoding=tensors) or a base and chains (seeds)")
        member = payload.base
        for seed, sigma in payload.chains[position]:  # seed: an int (noise_key), kept in a list of floats
            member = mutate(member, int(seed), sigma, self.cfg.mutation_rate, payload.noise_scales)
        return member

    def materialise(self, payload: GAPayload, spec: GASpec) -> Tensors:
        first = self._parent(payload, spec.parents[0])
        if spec.op == ELITE:
            return first
        if spec.op == CROSSOVER:
            first = CROSSOVERS[self.cfg.crossover](first, self._parent(payload, spec.parents[1]), spec.seed)
        return mutate(first, spec.seed, spec.sigma, self.cfg.mutation_rate, payload.noise_scales)

    # --- tell -------------------------------------------------------------------------

    def survivors(self, fitness: np.ndarray) -> list[int]:
        """Positions of the next generation's parents, best first (ties: lower index)."""
        score = [float(f) if not math.isnan(f) else -math.inf for f in fitness]  # NaN never survives
        return sorted(range(len(score)), key=lambda i: (-score[i], i))[: self.cfg.parents]

    def tell(self, state: GAState, specs: list[GASpec], results: GenerationResults) -> Told:
        if [s.index for s in specs] != list(range(len(specs))):
            raise ValueError("specs must be the whole population in index order")
        fitness = shaping_input(results, self.cfg.shaping)  # shaping=none: the fitness itself
        keep = self.survivors(fitness)
        payload = self._payload(state, specs[0].generation)
        new = GAState(
            pool=[self.materialise(payload, specs[i]) for i in keep],
            ids=[specs[i].label if specs[i].op != ELITE else state.ids[specs[i].parents[0]] for i in keep],
            fitness=[float(fitness[i]) for i in keep],
            sigmas=[specs[i].sigma for i in keep],
            noise_scales=state.noise_scales,
        )
        if self.cfg.encoding == "seeds":
            new.base, new.chains = state.base, [self._chain(state, specs[i]) for i in keep]
        stats = {
            "best_fitness": float(fitness[keep[0]]),
            "parents_fitness_mean": float(np.mean(new.fitness)),
            "mutation_scale_mean": float(np.mean(new.sigmas)),
        }
        return Told(new, stats, self.lineage(state, specs, fitness, new))

    @staticmethod
    def _chain(state: GAState, spec: GASpec) -> list[list[float]]:
        if state.chains is None:
            raise ValueError("GA state without mutation chains: encoding is not seeds")
        parent_chain = state.chains[spec.parents[0]]
        return parent_chain if spec.op == ELITE else [*parent_chain, [spec.seed, spec.sigma]]

    def lineage(self, state: GAState, specs: list[GASpec], fitness: np.ndarray, new: GAState) -> list[dict[str, Any]]:
        """One family-tree record per member: id, parents, operator, fitness, survived."""
        survived = set(new.ids)
        records = []
        for spec in specs:
            ident = state.ids[spec.parents[0]] if spec.op == ELITE else spec.label
            records.append(
                {
                    "generation": spec.generation + 1,
                    "id": ident,
                    "index": spec.index,
                    "op": spec.op,
                    "parents": [state.ids[p] for p in spec.parents] if spec.op != ELITE else [],
                    "fitness": float(fitness[spec.index]),
                    "mutation_scale": spec.sigma,
                    "survived": ident in survived,
                }
            )
        return records
