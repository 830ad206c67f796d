"""Search strategies: ask/tell units that know nothing about Ray, vLLM or W&B."""

from __future__ import annotations

from typing import Any

from evora.strategies.base import Strategy


def build_strategy(cfg: Any, run_seed: int, noise_scales: dict[str, float] | None = None) -> Strategy | None:
    """The strategy for a strategy config (dispatch on its schema type). None for PBT: its
    members are trained by gradient descent (evora.tune), and workers only evaluate them."""
    from evora.config.schema import ESConfig, GAConfig, PBTConfig

    if isinstance(cfg, PBTConfig):
        return None
    from evora.strategies.es import EvolutionStrategy
    from evora.strategies.ga import GeneticAlgorithm

    builders = {ESConfig: EvolutionStrategy, GAConfig: GeneticAlgorithm}
    return builders[type(cfg)](cfg, run_seed, noise_scales)
