"""What a GRPO run is set up with (`evora/training/grpo.py`): the LoRA to train, TRL's
settings, the reward's signature and the token counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from evora.training.lora_spec import LoraSpec as LoraSpec  # re-exported: grpo.py's callers import it

Reward = Callable[[list[str], list[int]], list[float]]  # (completions, prompt indices) -> rewards


@dataclass(frozen=True)
class GRPOSettings:
    learning_rate: float
    num_generations: int  # group size G: completions per prompt
    prompts_per_step: int  # distinct prompts per optimizer step
    beta: float  # KL coefficient to the base model; 0 loads no reference
    max_completion_length: int
    temperature: float
    epsilon: float  # clip range (lower; also upper unless epsilon_high)
    max_grad_norm: float
    weight_decay: float
    seed: int
    # TRL's defaults from here on
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    epsilon_high: float | None = None
    top_p: float = 1.0
    top_k: int = 0
    mask_truncated_completions: bool = False
    micro_batches: int = 1  # gradient accumulation: the step's completions in this many forward/backward passes
    gradient_checkpointing: bool = False  # TRL defaults to True; off is faster for the small models here
    # Importance-sampling correction of the sampler's log-probabilities against the policy's (TRL's
    # vllm_importance_sampling_*): none, or TRL's mode; only where completions come from engines.
    importance_sampling: str = "none"
    importance_sampling_cap: float = 3.0  # C_max: *_truncate clips ratios above it, *_mask zeroes them
    rows_per_unit: int = 8  # completions sampled in one engine call (RolloutRequest.rows_per_unit)

    @property
    def corrects_sampling(self) -> bool:
        return self.importance_sampling != "none"

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


@dataclass
class Counters:
    prompt: int = 0
    generated: int = 0
    trained: int = 0
    scored: int = 0
    rollout_seconds: float = 0.0  # wall time of sampling the completions (TRL's `_generate`), wherever it ran
