"""strategy=eggroll: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from evora.config.checks import choice, require
from evora.strategies.full_weights import check_decay, check_full_weight
from evora.strategies.shaping import SHAPINGS

DISTRIBUTIONS = ("fixed", "snes")


@dataclass(frozen=True)
class EggrollConfig:
    name: str = "eggroll"
    population: int = 30  # candidates per generation, in antithetic pairs
    rank: int = 1  # r of each perturbation E = B A / sqrt(r)
    sigma: float = 0.001
    lr: float = 5e-4
    shaping: str = "zscore"  # zscore | centered_rank | none | per_prompt
    optimizer: str = "sgd"  # sgd | adam (two fp32 moments of every selected matrix on every worker)
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    weight_decay_anchor: str = "zero"  # zero: decay towards 0 | start: towards the model\'s own weights
    noise_reuse: int = 1  # each generation's factors serve this many generations (EGGROLL's noise reuse); 1: fresh
    distribution: str = "fixed"  # fixed: one sigma (the paper's) | snes: a sigma per matrix, adapted by SNES's rule
    sigma_lr: Optional[float] = None  # distribution=snes: eta_sigma; None: SNES's (3 + ln d) / (5 sqrt d), d matrices
    snapshot_every: int = 10  # generations between fp32 snapshots of the selected matrices
    delta_rank: int = 16  # rank of adapters/delta, the accumulated update as a PEFT LoRA (truncated SVD)


def check_eggroll(cfg: EggrollConfig, run: Any = None) -> None:
    require(cfg.population >= 2, "strategy.population", cfg.population, "must be an integer >= 2")
    require(
        cfg.population % 2 == 0,
        "strategy.population",
        cfg.population,
        "must be even: candidates come in antithetic pairs (allowed: 2, 4, 6, ...)",
    )
    require(1 <= cfg.rank <= 512, "strategy.rank", cfg.rank, "must be an integer in 1..512 (vLLM's largest LoRA rank)")
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    require(cfg.lr > 0, "strategy.lr", cfg.lr, "must be > 0")
    check_decay(cfg.weight_decay, cfg.weight_decay_anchor)
    require(cfg.noise_reuse >= 1, "strategy.noise_reuse", cfg.noise_reuse, "must be an integer >= 1")
    choice("strategy.shaping", cfg.shaping, SHAPINGS)
    choice("strategy.distribution", cfg.distribution, DISTRIBUTIONS)
    require(cfg.sigma_lr is None or cfg.sigma_lr > 0, "strategy.sigma_lr", cfg.sigma_lr, "must be > 0, or null")
    choice("strategy.optimizer", cfg.optimizer, ("sgd", "adam"))
    require(0 <= cfg.beta1 < 1, "strategy.beta1", cfg.beta1, "must be in [0, 1)")
    require(0 <= cfg.beta2 < 1, "strategy.beta2", cfg.beta2, "must be in [0, 1)")
    require(cfg.eps > 0, "strategy.eps", cfg.eps, "must be > 0")
    check_full_weight(cfg.snapshot_every, cfg.delta_rank)
