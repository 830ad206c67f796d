"""strategy=snes: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from evora.config.checks import choice, require
from evora.strategies.adapter_init import check_init
from evora.strategies.shaping import SHAPINGS

# `none` is refused: raw rewards are not 0-centred, so divided by their absolute sum (EvoTorch's rule
# for non-NES weights) they step toward the average draw; centred, they are `zscore`'s weights.
# On the organism `none` did not learn (docs/strategies/snes.md).
SNES_SHAPINGS = tuple(s for s in SHAPINGS if s != "none")


@dataclass(frozen=True)
class SNESConfig:
    name: str = "snes"
    population: int = 30  # lambda (the paper's default is 4 + floor(3 ln d), d the values searched)
    sigma: float = 0.001  # the initial standard deviation of every value
    lr: float = 1.0  # eta_mu: the paper's 1
    sigma_lr: Optional[float] = None  # eta_sigma; None: the paper's (3 + ln d) / (5 sqrt d)
    shaping: str = "nes"  # nes: the paper's rank utilities | zscore | centered_rank | per_prompt
    antithetic: bool = False  # the paper samples each candidate's noise; true: mirrored pairs
    noise_scale: str = "uniform"  # uniform | per_layer: the initial sigma times each layer's mean |W|
    init: str = "random"  # random | path
    init_a_std: Optional[float] = None  # None: 1/sqrt(in_features)
    init_b_std: float = 0.0
    init_path: Optional[str] = None


def check_snes(cfg: SNESConfig, run: Any = None) -> None:
    require(cfg.population >= 2, "strategy.population", cfg.population, "must be an integer >= 2")
    if cfg.antithetic:
        require(cfg.population % 2 == 0, "strategy.population", cfg.population, "must be even when antithetic")
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    require(cfg.lr > 0, "strategy.lr", cfg.lr, "must be > 0")
    require(cfg.sigma_lr is None or cfg.sigma_lr > 0, "strategy.sigma_lr", cfg.sigma_lr, "must be > 0, or null")
    rule = "snes needs 0-centred weights and raw rewards are not (centred, they are zscore's)"
    require(cfg.shaping != "none", "strategy.shaping", cfg.shaping, rule)
    choice("strategy.shaping", cfg.shaping, SNES_SHAPINGS)
    check_init(cfg)
