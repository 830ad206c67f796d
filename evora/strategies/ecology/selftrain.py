"""plasticity=sft: an organelle learns from its own successes (reward-filtered self-training).

`tell` keeps, as plain data in the state, every served episode rewarded at least
`sft_min_reward` with the organelle's own completion ({"organelle", "example",
"completion"}); `refine`, on the driver right after, gives each organelle that still lives
`sft_steps` steps of the SFT baseline's trainer (`SupervisedFineTuning`, a fresh AdamW)
on those prompts with its completions (ended by EOS) as the targets, not the task's
reference answers. Each organelle's training is seeded by (run seed, generation, its id).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from evora.lora.keys import noise_key
from evora.strategies.ecology.config import EcologyConfig
from evora.strategies.protocol import GenerationResults, Spend, Tensors, Told, TrainingContext
from evora.strategies.sft.config import SFTConfig
from evora.strategies.sft.strategy import SupervisedFineTuning
from evora.strategies.trained import TrainedState

SALT = "ecology-sft"


def successes(
    served: list[tuple[str, int, tuple[int, ...]]], results: GenerationResults, min_reward: float
) -> list[dict[str, Any]]:
    """The self-training examples of a generation: one per served episode (organelle id, its
    row, its prompts) rewarded at least `min_reward` whose completion is not empty."""
    if results.texts is None:
        raise ValueError("strategy.plasticity=sft: the generation's results carry no completion texts")
    column = {p: j for j, p in enumerate(results.prompt_indices)}
    kept = []
    for organelle, row, prompts in served:
        for prompt in prompts:
            reward, text = float(results.rewards[row, column[prompt]]), results.texts[row][column[prompt]]
            if np.isfinite(reward) and reward >= min_reward and text.strip():
                kept.append({"organelle": organelle, "example": prompt, "completion": text})
    return kept


def train_organelle(
    cfg: EcologyConfig,
    run_seed: int,
    organelle: dict[str, Any],
    batch: list[dict[str, Any]],
    generation: int,
    context: TrainingContext,
) -> Told:
    """`cfg.sft_steps` steps of the SFT trainer on the organelle's own successful completions."""
    examples = tuple(replace(context.train[b["example"]], target=b["completion"]) for b in batch)
    sft = SFTConfig(learning_rate=cfg.sft_learning_rate, steps_per_generation=cfg.sft_steps)
    trainer = SupervisedFineTuning(sft, noise_key(run_seed, SALT, generation, organelle["id"]))
    own = replace(context, train=examples, planned_steps=cfg.sft_steps)  # targets: the completions, via `target`
    return trainer.improve(TrainedState(organelle["adapter"]), generation, own)


def step_norm(before: Tensors, after: Tensors) -> float:
    total = torch.zeros((), dtype=torch.float64)
    for k, v in before.items():  # summed in order, as the stat always was
        total = total + ((after[k].double() - v.double()) ** 2).sum()
    return float(torch.sqrt(total))


def self_train(cfg: EcologyConfig, run_seed: int, state: Any, generation: int, context: TrainingContext) -> Told:
    """The state with every living organelle that had successes trained on them, and its batch emptied."""
    organelles, losses, norms, examples = [], [], [], 0
    spend = Spend()
    for fields in state.organelles:
        batch = [b for b in state.sft_batch if b["organelle"] == fields["id"]]
        if not batch:  # no success this generation, or born after the episodes
            organelles.append(fields)
            continue
        told = train_organelle(cfg, run_seed, fields, batch, generation, context)
        organelles.append({**fields, "adapter": told.state.adapter})
        losses.append(told.stats["loss"])
        norms.append(step_norm(fields["adapter"], told.state.adapter))
        examples += len(batch)
        spend.add(told.spend)
    stats = {
        "sft_organelles": float(len(losses)),
        "sft_examples": float(examples),
        "sft_loss": float(np.mean(losses)) if losses else 0.0,
        "sft_step_norm": float(np.mean(norms)) if norms else 0.0,
    }
    return Told(replace(state, organelles=organelles, sft_batch=[]), stats, spend=spend)
