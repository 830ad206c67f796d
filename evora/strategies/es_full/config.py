"""strategy=es_full: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.config.checks import choice, require
from evora.strategies.full_weights import check_decay, check_full_weight
from evora.strategies.shaping import SHAPINGS


@dataclass(frozen=True)
class EsFullConfig:
    name: str = "es_full"
    population: int = 30  # candidates per generation (N); the paper's 30
    sigma: float = 0.001  # noise standard deviation; the paper's 0.001
    lr: float = 5e-4  # alpha of the update W += alpha / N sum_n z_n eps_n (no 1/sigma); the paper's 5e-4
    antithetic: bool = False  # members in +/- pairs (population even); the paper draws N independent members
    shaping: str = "zscore"  # zscore (the paper's) | centered_rank | none | per_prompt
    weight_decay: float = 0.0  # decoupled: W -= lr * weight_decay * W after each update
    weight_decay_anchor: str = "zero"  # zero: decay towards 0 | start: towards the model\'s own weights
    snapshot_every: int = 10  # generations between fp32 snapshots of the selected matrices
    delta_rank: int = 16  # rank of adapters/delta, the accumulated update as a PEFT LoRA (truncated SVD)


def check_es_full(cfg: EsFullConfig, run: Any = None) -> None:
    require(cfg.population >= 2, "strategy.population", cfg.population, "must be an integer >= 2")
    if cfg.antithetic:
        require(
            cfg.population % 2 == 0,
            "strategy.population",
            cfg.population,
            "must be even with strategy.antithetic=true: candidates come in +/- pairs (allowed: 2, 4, 6, ...)",
        )
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    require(cfg.lr > 0, "strategy.lr", cfg.lr, "must be > 0")
    check_decay(cfg.weight_decay, cfg.weight_decay_anchor)
    choice("strategy.shaping", cfg.shaping, SHAPINGS)
    check_full_weight(cfg.snapshot_every, cfg.delta_rank)
