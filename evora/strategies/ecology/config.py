"""strategy=ecology: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from evora.config.checks import choice, fail, require
from evora.strategies.adapter_init import check_init

CONDITIONS = ("frozen", "single", "full")  # the ecology work's three conditions
PLASTICITY = ("es", "sft", "none")
ROUTERS = ("ucb", "thompson")


@dataclass(frozen=True)
class EcologyConfig:
    name: str = "ecology"
    condition: str = "full"  # frozen: the base model only | single: one adapter, no ecology | full
    organelles: int = 4  # founders
    max_population: int = 8
    # The energy economy (energy units; episodes earn reward x reward_price, pay episode_fee + token_price x tokens).
    initial_energy: float = 2.0  # each founder's
    endowment: float = 1.0  # a newborn's, paid by its parents
    energy_floor: float = 0.0  # at or below it an organelle retires
    reward_price: float = 1.0
    episode_fee: float = 0.05
    token_price: float = 0.01
    upkeep: float = 0.2  # charged to every living organelle each generation: the idle starve
    # Routing: a bandit per family over organelles, on episode ROI.
    router: str = "ucb"  # ucb | thompson
    exploration: float = 0.5  # UCB's bonus weight; Thompson's prior spread
    routing_confidence: float = 1.0  # the final map: standard errors a specialist must lead the single best by
    # Learning within an organelle.
    plasticity: str = "es"  # es: an antithetic ES step from its own episodes | sft: SFT on its successes | none
    probes: int = 2  # plasticity=es: antithetic pairs per organelle per generation
    sigma: float = 0.3  # plasticity=es: probe noise
    lr: float = 0.1  # plasticity=es: step size
    sft_min_reward: float = 1.0  # plasticity=sft: an episode's reward at or above it makes its completion a target
    sft_steps: int = 2  # plasticity=sft: optimizer steps per trained organelle per generation
    sft_learning_rate: float = 1.0e-3  # plasticity=sft: AdamW learning rate (the SFT baseline's trainer)
    # Reproduction and merging.
    window: int = 8  # episodes an organelle's recent ROI is measured over
    uplift_threshold: float = 0.2  # mean recent ROI an organelle must clear to reproduce
    merge_rate: float = 0.5  # chance that a birth merges the two best eligible organelles (else a mutated copy)
    mutation_scale: float = 0.3  # noise of a mutated copy
    max_births: int = 2  # per generation
    # Quality-diversity archive (MAP-Elites): cell = (the family it serves best, cost-per-episode bin).
    cost_bins: list[float] = field(default_factory=lambda: [0.08, 0.12])  # bin edges of cost per episode
    fill_niches: bool = True  # an empty family niche gets a mutated copy of its nearest elite
    noise_scale: str = "uniform"
    init: str = "random"
    init_a_std: Optional[float] = None
    init_b_std: float = 0.0
    init_path: Optional[str] = None


def check_ecology(cfg: EcologyConfig, run: Any = None) -> None:
    choice("strategy.condition", cfg.condition, CONDITIONS)
    choice("strategy.plasticity", cfg.plasticity, PLASTICITY)
    choice("strategy.router", cfg.router, ROUTERS)
    require(cfg.organelles >= 1, "strategy.organelles", cfg.organelles, "must be >= 1")
    require(
        cfg.max_population >= cfg.organelles,
        "strategy.max_population",
        cfg.max_population,
        f"must be >= strategy.organelles ({cfg.organelles})",
    )
    for key in ("reward_price", "episode_fee", "token_price", "upkeep", "endowment", "exploration", "mutation_scale"):
        require(vars(cfg)[key] >= 0, f"strategy.{key}", vars(cfg)[key], "must be >= 0 (no negative prices)")
    require(cfg.routing_confidence >= 0, "strategy.routing_confidence", cfg.routing_confidence, "must be >= 0")
    require(cfg.initial_energy > 0, "strategy.initial_energy", cfg.initial_energy, "must be > 0")
    for key in ("initial_energy", "endowment"):
        if cfg.energy_floor >= vars(cfg)[key]:
            raise fail("strategy.energy_floor", cfg.energy_floor, f"must be below strategy.{key} ({vars(cfg)[key]})")
    require(cfg.probes >= 1, "strategy.probes", cfg.probes, "must be >= 1")
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    require(cfg.lr > 0, "strategy.lr", cfg.lr, "must be > 0")
    require(cfg.sft_steps >= 1, "strategy.sft_steps", cfg.sft_steps, "must be an integer >= 1")
    require(cfg.sft_learning_rate > 0, "strategy.sft_learning_rate", cfg.sft_learning_rate, "must be > 0")
    require(cfg.window >= 1, "strategy.window", cfg.window, "must be >= 1")
    require(0 <= cfg.merge_rate <= 1, "strategy.merge_rate", cfg.merge_rate, "must be in [0, 1]")
    require(cfg.max_births >= 0, "strategy.max_births", cfg.max_births, "must be >= 0")
    edges = list(cfg.cost_bins)
    require(edges == sorted(edges) and all(e > 0 for e in edges), "strategy.cost_bins", edges, "must rise, above 0")
    check_init(cfg)
