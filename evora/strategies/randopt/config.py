"""strategy=randopt: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from evora.config.checks import choice, require
from evora.strategies.adapter_init import check_init

TARGETS = ("correct", "vote")
DISTIL_FROM = ("current", "start")
PERTURBATIONS = ("lora", "eggroll")


@dataclass(frozen=True)
class RandOptConfig:
    name: str = "randopt"
    population: int = 30  # N: random perturbations drawn and scored each round (a round is a generation)
    sigma: float = 0.001  # the perturbations' standard deviation: theta + sigma * noise
    # lora: noise on the adapter's tensors | eggroll: sigma E on each target matrix, E = B A / sqrt(r)
    # EGGROLL's rank-r full-weight perturbation, carried by the adapter's last perturbation_rank slots
    perturbation: str = "lora"
    perturbation_rank: int = 1  # r of perturbation=eggroll
    top_k: int = 8  # K: the best perturbations, the ensemble
    targets: str = (
        "correct"  # correct: the members' correct completions, the vote's first | vote: the vote's, unchecked
    )
    per_prompt: int = 8  # at most this many distinct completions of a prompt to distil (n_canonical)
    cumulative: bool = True  # each round distils on every round's examples so far (deduplicated)
    distil_from: str = "current"  # current: the round's model | start: the starting adapter every round
    sft_epochs: float = 2.0  # passes over the distillation examples
    sft_learning_rate: float = 1.0e-4  # AdamW's, a fresh optimizer each round
    sft_batch_size: int = 4
    noise_scale: str = "uniform"  # uniform | per_layer: sigma times each layer's mean |W|
    init: str = "random"  # random | path
    init_a_std: Optional[float] = None  # None: 1/sqrt(in_features)
    init_b_std: float = 0.0  # 0: the starting adapter is the base model
    init_path: Optional[str] = None


def check_randopt(cfg: RandOptConfig, run: Any = None) -> None:
    require(cfg.population >= 2, "strategy.population", cfg.population, "must be an integer >= 2")
    require(
        1 <= cfg.top_k <= cfg.population,
        "strategy.top_k",
        cfg.top_k,
        f"must be in 1..strategy.population ({cfg.population})",
    )
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    choice("strategy.targets", cfg.targets, TARGETS)
    choice("strategy.perturbation", cfg.perturbation, PERTURBATIONS)
    require(cfg.perturbation_rank >= 1, "strategy.perturbation_rank", cfg.perturbation_rank, "must be an integer >= 1")
    if cfg.perturbation == "eggroll" and run is not None:
        require(
            cfg.perturbation_rank < run.lora.rank,
            "strategy.perturbation_rank",
            cfg.perturbation_rank,
            f"must be below lora.rank ({run.lora.rank}) under strategy.perturbation=eggroll: the adapter's "
            "last perturbation_rank slots carry the perturbation, the others are distilled",
        )
    choice("strategy.distil_from", cfg.distil_from, DISTIL_FROM)
    require(cfg.per_prompt >= 1, "strategy.per_prompt", cfg.per_prompt, "must be an integer >= 1")
    require(cfg.sft_epochs > 0, "strategy.sft_epochs", cfg.sft_epochs, "must be > 0")
    require(cfg.sft_learning_rate > 0, "strategy.sft_learning_rate", cfg.sft_learning_rate, "must be > 0")
    require(cfg.sft_batch_size >= 1, "strategy.sft_batch_size", cfg.sft_batch_size, "must be an integer >= 1")
    check_init(cfg)
