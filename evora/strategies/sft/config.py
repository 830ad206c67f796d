"""strategy=sft: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.config.checks import require
from evora.strategies.budget import BudgetFields, check_budget


@dataclass(frozen=True)
class SFTConfig(BudgetFields):
    name: str = "sft"
    learning_rate: float = 2.0e-4  # AdamW peak learning rate
    steps_per_generation: int = 10  # optimizer steps between two checkpoints (held-out every eval_every of them)
    batch_size: int = 4  # (prompt, reference) pairs per micro-batch
    gradient_accumulation: int = 1  # micro-batches per optimizer step
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    max_grad_norm: float = 1.0  # gradient clipping
    warmup_ratio: float = 0.0  # linear warm-up over this fraction of the planned steps, then linear decay
    dropout: float = 0.0  # LoRA dropout


def check_sft(cfg: SFTConfig, run: Any) -> None:
    for key in ("steps_per_generation", "batch_size", "gradient_accumulation"):
        require(vars(cfg)[key] >= 1, f"strategy.{key}", vars(cfg)[key], "must be an integer >= 1")
    require(cfg.learning_rate > 0, "strategy.learning_rate", cfg.learning_rate, "must be > 0")
    require(cfg.weight_decay >= 0, "strategy.weight_decay", cfg.weight_decay, "must be >= 0")
    require(cfg.max_grad_norm > 0, "strategy.max_grad_norm", cfg.max_grad_norm, "must be > 0")
    require(0 <= cfg.warmup_ratio < 1, "strategy.warmup_ratio", cfg.warmup_ratio, "must be in [0, 1)")
    require(0 <= cfg.dropout < 1, "strategy.dropout", cfg.dropout, "must be in [0, 1)")
    check_budget(cfg)
    budgeted = any(vars(cfg)[k] is not None for k in ("budget_flops", "budget_tokens", "budget_seconds", "match"))
    require(
        not budgeted or cfg.warmup_ratio == 0,
        "strategy.warmup_ratio",
        cfg.warmup_ratio,
        "must be 0 with a budget (the run's length is not known in advance)",
    )
