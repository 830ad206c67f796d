"""strategy=es: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from evora.config.checks import choice, require
from evora.strategies.adapter_init import check_init
from evora.strategies.shaping import SHAPINGS


@dataclass(frozen=True)
class ESConfig:
    name: str = "es"
    population: int = 30
    sigma: float = 0.001
    lr: float = 5e-4
    antithetic: bool = True
    shaping: str = "zscore"  # zscore | centered_rank | none | per_prompt
    optimizer: str = "sgd"  # sgd | adam
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    noise_reuse: int = 1  # each generation's draws serve this many generations (EGGROLL's noise reuse); 1: fresh
    noise_scale: str = "uniform"  # uniform | per_layer
    init: str = "random"  # random | path
    init_a_std: Optional[float] = None  # None: 1/sqrt(in_features)
    init_b_std: float = 0.0
    init_path: Optional[str] = None


def check_es(es: ESConfig, run: Any = None) -> None:
    require(es.population >= 2, "strategy.population", es.population, "must be an integer >= 2")
    if es.antithetic:
        require(
            es.population % 2 == 0,
            "strategy.population",
            es.population,
            "must be even when strategy.antithetic=true (allowed: 2, 4, 6, ...)",
        )
    require(es.sigma > 0, "strategy.sigma", es.sigma, "must be > 0")
    require(es.lr > 0, "strategy.lr", es.lr, "must be > 0")
    require(es.weight_decay >= 0, "strategy.weight_decay", es.weight_decay, "must be >= 0")
    require(es.noise_reuse >= 1, "strategy.noise_reuse", es.noise_reuse, "must be an integer >= 1")
    choice("strategy.shaping", es.shaping, SHAPINGS)
    choice("strategy.optimizer", es.optimizer, ("sgd", "adam"))
    require(0 <= es.beta1 < 1, "strategy.beta1", es.beta1, "must be in [0, 1)")
    require(0 <= es.beta2 < 1, "strategy.beta2", es.beta2, "must be in [0, 1)")
    require(es.eps > 0, "strategy.eps", es.eps, "must be > 0")
    check_init(es)
