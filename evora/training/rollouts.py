"""What a trainer asks of whoever samples its completions, and what comes back: plain data,
so the trainer (TRL's `rollout_func`, `grpo_trl.py`) knows nothing of where they are sampled.
In a run they are sampled on the engine workers (`distributed/rollouts.py`); in a test, by
any function of this signature."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from evora.lora import Tensors


@dataclass(frozen=True)
class Policy:
    """The policy a step's completions are sampled from, on the engines: their own weights, with
    `weights` set into them first where given, and `adapter` over them where given."""

    adapter: Tensors | None = None  # a LoRA (PEFT names, fp32): the trained adapter
    weights: Tensors | None = None  # matrices by checkpoint name (fp32): full-weight training's


@dataclass(frozen=True)
class RolloutRequest:
    """One optimizer step's completions: one row per completion (each prompt `G` times in a row,
    as TRL orders a group), each sampled from its own seeded stream, so that how the rows are cut
    into work units, and over how many workers, never changes a token."""

    step: int  # the optimizer step they are sampled for (names the adapter on the engines)
    prompts: tuple[tuple[int, ...], ...]  # token ids, one row per completion
    seeds: tuple[int, ...]  # one per row
    max_tokens: int
    temperature: float
    top_p: float
    logprobs: bool  # also each completion token's log-probability under the policy (importance sampling)
    rows_per_unit: int  # rows sampled in one engine call: fixed, so 1 or N workers give the same tokens
    policy: Policy = field(default_factory=lambda: Policy(), compare=False, repr=False)  # at this step


@dataclass(frozen=True)
class Rollout:
    completion_ids: tuple[int, ...]  # EOS included where one was generated
    logprobs: tuple[float, ...] | None = None  # per completion token, when the request asked for them


RolloutSampler = Callable[[RolloutRequest], list[Rollout]]  # rows in, one rollout each, in row order
