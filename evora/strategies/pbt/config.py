"""strategy=pbt: its config schema (the LoRALab-style search space) and the rules checked
before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evora.config.checks import choice, require
from evora.config.schema import VLLM_LORA_RANKS
from evora.errors import ConfigError
from evora.tasks.fitness import parse_fitness


@dataclass(frozen=True)
class PBTConfig:
    name: str = "pbt"
    population: int = 6
    steps_per_generation: int = 50  # optimizer steps a trial trains between two evaluations
    batch_size: int = 4
    gradient_accumulation: int = 2
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    warmup_ratio: float = 0.1
    ranks: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256])
    alpha_multipliers: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    learning_rates: list[float] = field(default_factory=lambda: [1e-5, 2e-5, 5e-5, 1e-4, 2e-4])
    lr_factors: list[float] = field(default_factory=lambda: [0.5, 0.8, 1.25, 2.0])
    lr_min: float = 1e-6
    lr_max: float = 1e-2
    dropouts: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.15])
    target_modules: list[list[str]] = field(default_factory=lambda: [["auto"]])  # [auto]: found from the model
    mutation_probability: float = 0.3  # chance that each hyperparameter changes on explore
    resample_probability: float = 0.5  # a change is a fresh draw from the list; else a neighbour / factor
    keep_top_fraction: float = 0.3333  # the top fraction is cloned into the bottom fraction (at most 0.5)
    fitness: str = "accuracy - perplexity / 100"  # the LoRALab fitness, from reward, accuracy, perplexity, tokens
    eval_split: str = "selection"  # where trials are scored; held-out stays for the final report


def _nonempty(key: str, values: list) -> None:
    require(len(values) > 0, f"strategy.{key}", list(values), "must list at least one value")


def check_pbt(pbt: PBTConfig, run: Any) -> None:
    require(pbt.population >= 2, "strategy.population", pbt.population, "must be an integer >= 2")
    for key in ("steps_per_generation", "batch_size", "gradient_accumulation"):
        require(vars(pbt)[key] >= 1, f"strategy.{key}", vars(pbt)[key], "must be an integer >= 1")
    _check_space(pbt)
    _check_schedule(pbt, run)


def _check_space(pbt: PBTConfig) -> None:
    """The hyperparameters' search space: every option list, and the learning rate's bounds."""
    for key in ("ranks", "alpha_multipliers", "learning_rates", "lr_factors", "dropouts", "target_modules"):
        _nonempty(key, vars(pbt)[key])
    for rank in pbt.ranks:
        require(
            rank in VLLM_LORA_RANKS,
            "strategy.ranks",
            list(pbt.ranks),
            f"rank {rank} is not one vLLM serves; allowed: {', '.join(map(str, VLLM_LORA_RANKS))}",
        )
    for rate in pbt.learning_rates:
        require(rate > 0, "strategy.learning_rates", list(pbt.learning_rates), "every learning rate must be > 0")
    require(0 < pbt.lr_min < pbt.lr_max, "strategy.lr_min", pbt.lr_min, f"must be in (0, strategy.lr_max={pbt.lr_max})")
    for factor in pbt.lr_factors:
        require(factor > 0, "strategy.lr_factors", list(pbt.lr_factors), "every factor must be > 0")
    for value in pbt.alpha_multipliers:
        require(value > 0, "strategy.alpha_multipliers", list(pbt.alpha_multipliers), "every multiplier must be > 0")
    for value in pbt.dropouts:
        require(0 <= value < 1, "strategy.dropouts", list(pbt.dropouts), "every dropout must be in [0, 1)")
    for modules in pbt.target_modules:
        require(
            len(modules) > 0,
            "strategy.target_modules",
            [list(m) for m in pbt.target_modules],
            "every option must name at least one module",
        )


def _check_schedule(pbt: PBTConfig, run: Any) -> None:
    """Exploration, training and evaluation settings."""
    for key in ("mutation_probability", "resample_probability"):
        require(0 <= vars(pbt)[key] <= 1, f"strategy.{key}", vars(pbt)[key], "must be in [0, 1]")
    require(
        0 < pbt.keep_top_fraction <= 0.5,
        "strategy.keep_top_fraction",
        pbt.keep_top_fraction,
        "must be in (0, 0.5]: the top fraction is cloned into the bottom fraction",
    )
    require(pbt.weight_decay >= 0, "strategy.weight_decay", pbt.weight_decay, "must be >= 0")
    require(pbt.max_grad_norm > 0, "strategy.max_grad_norm", pbt.max_grad_norm, "must be > 0")
    require(0 <= pbt.warmup_ratio < 1, "strategy.warmup_ratio", pbt.warmup_ratio, "must be in [0, 1)")
    choice("strategy.eval_split", pbt.eval_split, ("selection", "heldout"))
    try:
        parse_fitness(pbt.fitness)
    except ConfigError as error:
        raise ConfigError(str(error).replace("task.fitness", "strategy.fitness")) from None
    if pbt.eval_split == "selection":
        require(
            run.task.selection_size > 0,
            "strategy.eval_split",
            "selection",
            "needs task.selection_size > 0, or strategy.eval_split=heldout",
        )
    require(
        run.hardware.trial_cpus > 0 or run.hardware.trial_gpus > 0,
        "hardware.trial_cpus",
        run.hardware.trial_cpus,
        "a training trial needs CPUs or GPUs",
    )
