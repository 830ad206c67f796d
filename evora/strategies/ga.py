"""A genetic algorithm over LoRA adapters (seeds 000 and 004, made distributed).

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
from dataclasses import dataclass
from typing import Any

import numpy as np

from evora.config.schema import GAConfig
from evora.lora.noise import noise_key
from evora.strategies.base import Tensors
from evora.strategies.operators import CROSSOVERS, mutate

ELITE, MUTATE, CROSSOVER, INIT = "elite", "mutate", "crossover", "init"


@dataclass(frozen=True)
class GASpec:
    generation: int  # 0-based; the member is born in generation + 1
    index: int
    op: str  # elite | mutate | crossover
    parents: tuple[int, ...]  # positions in the payload's parent pool
    seed: int
    sigma: float  # this member's mutation scale

    @property
    def label(self) -> str:
        return member_id(self.generation + 1, self.index, self.op)


def member_id(born: int, index: int, op: str) -> str:
    """Human-readable variant id: generation born, position, operator."""
    return f"g{born}-{index:02d}-{op}"


class GeneticAlgorithm:
    center_name = "elite"

    def __init__(self, cfg: GAConfig, run_seed: int, noise_scales: dict[str, float] | None = None):
        self.cfg = cfg
        self.run_seed = run_seed
        self.noise_scales = dict(noise_scales or {})

    # --- state ----------------------------------------------------------------------

    def initial_state(self, adapter: Tensors) -> dict[str, Any]:
        initial = {k: v.detach().float().clone() for k, v in adapter.items()}
        state: dict[str, Any] = {"pool": [initial], "ids": [member_id(0, 0, INIT)], "fitness": [float("nan")],
                                 "sigmas": [self.cfg.mutation_scale]}
        if self.cfg.encoding == "seeds":
            state.update(base=initial, chains=[[]])
        return state

    def center(self, state: dict[str, Any]) -> Tensors:
        return state["pool"][0]  # the best member of the last generation

    def _payload(self, state: dict[str, Any], generation: int) -> dict[str, Any]:
        if self.cfg.encoding == "seeds":
            return {"generation": generation, "base": state["base"], "chains": state["chains"]}
        return {"generation": generation, "pool": state["pool"]}

    # --- ask --------------------------------------------------------------------------

    def ask(self, state: dict[str, Any], generation: int) -> tuple[list[GASpec], dict[str, Any]]:
        rng = random.Random(noise_key(self.run_seed, "ga-ask", generation))
        pool_size, cfg = len(state["pool"]), self.cfg
        specs = [GASpec(generation, i, ELITE, (i,), 0, state["sigmas"][i]) for i in range(min(cfg.keep_top, pool_size))]
        for index in range(len(specs), cfg.population):
            if pool_size >= 2 and rng.random() < cfg.crossover_rate:
                first = self._select(rng, state["fitness"])
                second = self._select(rng, state["fitness"], exclude=first)
                parents = (first, second)
                op, sigma = CROSSOVER, (state["sigmas"][first] + state["sigmas"][second]) / 2
            else:
                parents = (self._select(rng, state["fitness"]),)
                op, sigma = MUTATE, state["sigmas"][parents[0]]
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

    def _parent(self, payload: dict[str, Any], position: int) -> Tensors:
        if "pool" in payload:
            return payload["pool"][position]
        member = payload["base"]
        for seed, sigma in payload["chains"][position]:
            member = mutate(member, seed, sigma, self.cfg.mutation_rate, self.noise_scales)
        return member

    def materialise(self, payload: dict[str, Any], spec: GASpec) -> Tensors:
        first = self._parent(payload, spec.parents[0])
        if spec.op == ELITE:
            return first
        if spec.op == CROSSOVER:
            first = CROSSOVERS[self.cfg.crossover](first, self._parent(payload, spec.parents[1]), spec.seed)
        return mutate(first, spec.seed, spec.sigma, self.cfg.mutation_rate, self.noise_scales)

    # --- tell -------------------------------------------------------------------------

    def survivors(self, fitness: np.ndarray) -> list[int]:
        """Positions of the next generation's parents, best first (ties: lower index)."""
        score = [float(f) if not math.isnan(f) else -math.inf for f in fitness]  # NaN never survives
        return sorted(range(len(score)), key=lambda i: (-score[i], i))[:self.cfg.parents]

    def tell(self, state: dict[str, Any], specs: list[GASpec], fitness: np.ndarray
             ) -> tuple[dict[str, Any], dict[str, float]]:
        if [s.index for s in specs] != list(range(len(specs))):
            raise ValueError("specs must be the whole population in index order")
        keep = self.survivors(fitness)
        payload = self._payload(state, specs[0].generation)
        new_state: dict[str, Any] = {
            "pool": [self.materialise(payload, specs[i]) for i in keep],
            "ids": [specs[i].label if specs[i].op != ELITE else state["ids"][specs[i].parents[0]] for i in keep],
            "fitness": [float(fitness[i]) for i in keep],
            "sigmas": [specs[i].sigma for i in keep],
        }
        if self.cfg.encoding == "seeds":
            new_state["base"] = state["base"]
            new_state["chains"] = [self._chain(state, specs[i]) for i in keep]
        stats = {"best_fitness": float(fitness[keep[0]]), "parents_fitness_mean": float(np.mean(new_state["fitness"])),
                 "mutation_scale_mean": float(np.mean(new_state["sigmas"]))}
        return new_state, stats

    @staticmethod
    def _chain(state: dict[str, Any], spec: GASpec) -> list[list[float]]:
        parent_chain = state["chains"][spec.parents[0]]
        return parent_chain if spec.op == ELITE else [*parent_chain, [spec.seed, spec.sigma]]

    def lineage(self, state: dict[str, Any], specs: list[GASpec], fitness: np.ndarray,
                new_state: dict[str, Any]) -> list[dict[str, Any]]:
        """One family-tree record per member: id, parents, operator, fitness, survived."""
        survived = set(new_state["ids"])
        records = []
        for spec in specs:
            ident = state["ids"][spec.parents[0]] if spec.op == ELITE else spec.label
            records.append({"generation": spec.generation + 1, "id": ident, "index": spec.index, "op": spec.op,
                            "parents": [state["ids"][p] for p in spec.parents] if spec.op != ELITE else [],
                            "fitness": float(fitness[spec.index]), "mutation_scale": spec.sigma,
                            "survived": ident in survived})
        return records
