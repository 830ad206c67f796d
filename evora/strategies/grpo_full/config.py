"""strategy=grpo_full: its config schema and the rules checked before Ray starts.

Defaults are the ES paper's GRPO baseline, on the weights it trains (the run's selected matrices,
`lora.target_modules`: every linear layer of every block for the paper's runs): group size 30, 2
questions per step, learning rate 1e-5, no KL term. Deviation, by design: embeddings, norms and
the output head stay frozen, as the engine workers keep only the selected matrices in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.strategies.full_weights import check_full_weight
from evora.strategies.grpo.config import GRPOFields, check_grpo_fields


@dataclass(frozen=True)
class GRPOFullConfig(GRPOFields):
    name: str = "grpo_full"
    delta_rank: int = 16  # rank of adapters/delta, the trained weights' change as a PEFT LoRA (truncated SVD)


def check_grpo_full(cfg: GRPOFullConfig, run: Any) -> None:
    check_grpo_fields(cfg, run)
    check_full_weight(1, cfg.delta_rank)
