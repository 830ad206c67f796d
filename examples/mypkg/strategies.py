"""A strategy from outside evora: `evora strategy.name=mypkg.strategies:RandomSearch`
(with PYTHONPATH=examples). docs/architecture.md walks through it; a test runs it end to end.

Random search around the best adapter so far: each generation tries `population` seeded
perturbations of it and keeps the fittest if it beats the best. Only seeds cross the
network; the best adapter travels once per generation in the payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from evora.config.checks import require
from evora.lora.init import random_adapter
from evora.lora.noise import gaussian, noise_key
from evora.strategies import register_strategy
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told


@dataclass(frozen=True)
class RandomSearchConfig:
    name: str = "random_search"
    population: int = 8  # perturbations tried per generation
    scale: float = 0.02  # their standard deviation


def check(cfg: RandomSearchConfig, run: object) -> None:
    require(cfg.population >= 1, "strategy.population", cfg.population, "must be an integer >= 1")
    require(cfg.scale > 0, "strategy.scale", cfg.scale, "must be > 0")


@dataclass
class RandomSearchState:
    STATE_VERSION: ClassVar[int] = 1
    best: Tensors
    best_fitness: float = float("-inf")


@dataclass(frozen=True)
class Payload:
    best: Tensors


@register_strategy(
    "random_search",
    config=RandomSearchConfig,
    summary="random search around the best adapter",
    validate=check,
    center="incumbent",
    console_keys=(("best_fitness", "best"),),
)
class RandomSearch:
    state_type = RandomSearchState

    def __init__(self, cfg: RandomSearchConfig, run_seed: int):
        self.cfg, self.run_seed = cfg, run_seed

    def initial_state(self, context: StrategyContext) -> RandomSearchState:
        return RandomSearchState(best=random_adapter(context.layout, context.seed, None, 0.0))

    def ask(self, state: RandomSearchState, generation: int) -> tuple[list[CandidateSpec], Payload]:
        return [CandidateSpec(generation, i, member=i) for i in range(self.cfg.population)], Payload(state.best)

    def materialise(self, payload: Payload, spec: CandidateSpec) -> Tensors:
        return {
            name: value
            + self.cfg.scale
            * gaussian(
                noise_key(self.run_seed, "random-search", spec.generation, spec.member, name), tuple(value.shape)
            )
            for name, value in payload.best.items()
        }

    def tell(self, state: RandomSearchState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        winner = int(np.argmax(results.fitness))
        # results hold every candidate on every prompt: count the prompts the winner solved
        solved = int(results.correct[winner].sum())
        stats = {"best_fitness": max(state.best_fitness, float(results.fitness[winner])), "winner_solved": solved}
        if results.fitness[winner] <= state.best_fitness:
            return Told(state, stats)
        return Told(
            RandomSearchState(self.materialise(Payload(state.best), specs[winner]), float(results.fitness[winner])),
            stats,
        )

    def center(self, state: RandomSearchState) -> Tensors:
        return state.best
