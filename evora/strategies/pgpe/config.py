"""strategy=pgpe: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from evora.config.checks import choice, require
from evora.strategies.adapter_init import check_init
from evora.strategies.shaping import SHAPINGS


@dataclass(frozen=True)
class PGPEConfig:
    name: str = "pgpe"
    population: int = 30  # candidates: population / 2 directions, each evaluated as +eps and -eps
    sigma: float = 0.001  # the initial standard deviation of every value
    lr: float = 0.002  # the centre's step: ClipUp's step size (its speed limit is max_speed)
    sigma_lr: float = 0.1  # the standard deviations' learning rate
    sigma_max_change: Optional[float] = 0.2  # a sigma moves at most this share of itself a step; null: free
    optimizer: str = "clipup"  # clipup: normalised gradient, momentum, a speed limit (Toklu et al. 2020) | sgd
    momentum: float = 0.9  # ClipUp's
    max_speed: Optional[float] = None  # ClipUp's speed limit; None: 2 * lr
    shaping: str = "centered_rank"  # centered_rank (0-centred ranks in [-0.5, 0.5]) | zscore | nes | none | per_prompt
    noise_scale: str = "uniform"  # uniform | per_layer: the initial sigma times each layer's mean |W|
    init: str = "random"  # random | path
    init_a_std: Optional[float] = None  # None: 1/sqrt(in_features)
    init_b_std: float = 0.0
    init_path: Optional[str] = None


def check_pgpe(cfg: PGPEConfig, run: Any = None) -> None:
    require(
        cfg.population >= 2 and cfg.population % 2 == 0,
        "strategy.population",
        cfg.population,
        "must be even and >= 2 (PGPE evaluates each direction as a pair)",
    )
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    require(cfg.lr > 0, "strategy.lr", cfg.lr, "must be > 0")
    require(cfg.sigma_lr >= 0, "strategy.sigma_lr", cfg.sigma_lr, "must be >= 0")
    change = cfg.sigma_max_change
    require(change is None or 0 < change < 1, "strategy.sigma_max_change", change, "must be in (0, 1), or null")
    choice("strategy.optimizer", cfg.optimizer, ("clipup", "sgd"))
    require(0 <= cfg.momentum < 1, "strategy.momentum", cfg.momentum, "must be in [0, 1)")
    require(cfg.max_speed is None or cfg.max_speed > 0, "strategy.max_speed", cfg.max_speed, "must be > 0, or null")
    choice("strategy.shaping", cfg.shaping, SHAPINGS)
    check_init(cfg)
