"""Search strategies: ask/tell units that know nothing about Ray, vLLM or W&B."""

from __future__ import annotations

from typing import Any

from evora.strategies.base import Strategy


def build_strategy(cfg: Any, run_seed: int, noise_scales: dict[str, float] | None = None) -> Strategy:
    """The strategy for a strategy config (dispatch on its schema type)."""
    from evora.config.schema import ESConfig, GAConfig
    from evora.strategies.es import EvolutionStrategy
    from evora.strategies.ga import GeneticAlgorithm

    builders = {ESConfig: EvolutionStrategy, GAConfig: GeneticAlgorithm}
    return builders[type(cfg)](cfg, run_seed, noise_scales)
