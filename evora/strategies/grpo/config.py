"""strategy=grpo: its config schema and the rules checked before Ray starts.

Defaults are the ES paper's GRPO baseline (its baselines/README.md, run with GRPO-Zero):
group size 30 (= the ES population), 2 questions per step, learning rate 1e-5, AdamW
betas (0.9, 0.999), weight decay 0, gradient clipping 1.0, no KL term, sampling at
temperature 1, no importance-sampling correction. Deviation, by design: the paper trains every
weight; strategy=grpo trains a LoRA adapter (so a learning rate of 1e-5 moves it slowly; raise it
for LoRA), and strategy=grpo_full the weights themselves.
Completions are sampled on the run's engine workers (`rollouts=engines`), or, for comparison,
with transformers' `generate` on the driver (`rollouts=driver`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.config.checks import choice, require
from evora.strategies.budget import BudgetFields, check_budget

LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo")
ROLLOUTS = ("engines", "driver")
SCALE_REWARDS = ("group", "batch", "none")  # TRL's scale_rewards
# TRL's vllm_importance_sampling_mode values, and none
IMPORTANCE_SAMPLING = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class GRPOFields(BudgetFields):
    """What strategy=grpo (a LoRA) and strategy=grpo_full (the model's own matrices) share."""

    learning_rate: float = 1.0e-5  # AdamW learning rate (constant)
    num_generations: int = 30  # group size G: completions sampled per prompt
    prompts_per_step: int = 2  # distinct prompts per optimizer step
    steps_per_generation: int = 1  # optimizer steps per generation (held-out every eval_every generations)
    beta: float = 0.0  # KL coefficient to the base model (0: no reference model, as GRPO-Zero)
    epsilon: float = 0.2  # PPO-style clip range of the ratio (one update per batch: the ratio is 1)
    temperature: float = 1.0  # sampling temperature of the group's completions
    max_grad_norm: float = 1.0  # gradient clipping
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    loss_type: str = "dapo"  # TRL's loss: dapo (per token over the batch) | grpo | dr_grpo | bnpo | cispo | sapo
    scale_rewards: str = "group"  # advantages divided by the group's reward std | batch | none (Dr. GRPO)
    epsilon_high: float | None = None  # upper clip range (DAPO's clip-higher; cispo's epsilon max); None: epsilon
    rollouts: str = "engines"  # where completions are sampled: engines (the run's workers) | driver (transformers)
    rows_per_unit: int = 8  # completions one engine call samples (fixed: worker counts do not change a token)
    importance_sampling: str = "none"  # correction for the sampler's log-probabilities (TRL's modes), engines only
    importance_sampling_cap: float = 3.0  # its C_max
    micro_batches: int = 1  # gradient accumulation: a step's completions in this many forward/backward passes


@dataclass(frozen=True)
class GRPOConfig(GRPOFields):
    name: str = "grpo"
    dropout: float = 0.0  # LoRA dropout


def check_grpo(cfg: GRPOConfig, run: Any) -> None:
    check_grpo_fields(cfg, run)
    require(0 <= cfg.dropout < 1, "strategy.dropout", cfg.dropout, "must be in [0, 1)")


def check_grpo_fields(cfg: GRPOFields, run: Any) -> None:
    for key in ("num_generations", "prompts_per_step", "steps_per_generation", "micro_batches", "rows_per_unit"):
        require(vars(cfg)[key] >= 1, f"strategy.{key}", vars(cfg)[key], "must be an integer >= 1")
    require(cfg.num_generations >= 2, "strategy.num_generations", cfg.num_generations, "must be >= 2 (a group)")
    completions = cfg.num_generations * cfg.prompts_per_step
    require(
        completions % cfg.micro_batches == 0,
        "strategy.micro_batches",
        cfg.micro_batches,
        f"must divide num_generations x prompts_per_step ({completions})",
    )
    require(
        cfg.prompts_per_step <= run.task.train_size,
        "strategy.prompts_per_step",
        cfg.prompts_per_step,
        f"must be <= task.train_size ({run.task.train_size})",
    )
    require(cfg.learning_rate > 0, "strategy.learning_rate", cfg.learning_rate, "must be > 0")
    require(cfg.beta >= 0, "strategy.beta", cfg.beta, "must be >= 0")
    require(cfg.epsilon > 0, "strategy.epsilon", cfg.epsilon, "must be > 0")
    require(cfg.temperature > 0, "strategy.temperature", cfg.temperature, "must be > 0")
    require(cfg.max_grad_norm > 0, "strategy.max_grad_norm", cfg.max_grad_norm, "must be > 0")
    require(cfg.weight_decay >= 0, "strategy.weight_decay", cfg.weight_decay, "must be >= 0")
    choice("strategy.loss_type", cfg.loss_type, LOSS_TYPES)
    choice("strategy.rollouts", cfg.rollouts, ROLLOUTS)
    choice("strategy.scale_rewards", cfg.scale_rewards, SCALE_REWARDS)
    choice("strategy.importance_sampling", cfg.importance_sampling, IMPORTANCE_SAMPLING)
    require(cfg.epsilon_high is None or cfg.epsilon_high > 0, "strategy.epsilon_high", cfg.epsilon_high, "must be > 0")
    cap = cfg.importance_sampling_cap
    require(cap > 0, "strategy.importance_sampling_cap", cap, "must be > 0")
    if cfg.importance_sampling != "none":
        require(
            cfg.rollouts == "engines",
            "strategy.importance_sampling",
            cfg.importance_sampling,
            "corrects the engines' sampling: needs strategy.rollouts=engines",
        )
        # the engines' log-probabilities are teacher-forced at temperature 1 (Engine.score): the
        # sampling distribution's only when sampling itself is at temperature 1
        require(
            cfg.temperature == 1.0,
            "strategy.importance_sampling",
            cfg.importance_sampling,
            f"needs strategy.temperature=1.0 (got {cfg.temperature}): the engines score at temperature 1",
        )
    check_budget(cfg)
