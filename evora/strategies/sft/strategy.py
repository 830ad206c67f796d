"""LoRA supervised fine-tuning on the task's train split (prompt -> reference completion,
loss on the completion), as a gradient strategy of the shared loop: each generation trains
`steps_per_generation` optimizer steps on the driver (`evora/training/lora_sft.py`, the
trainer PBT members use), ending early once the run's budget is spent.

The trainer is kept between generations; its state (adapter, AdamW moments, step) is the
strategy state, so a resumed run continues the same batches (they are a function of the
run seed and the step).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from evora.lora import Tensors
from evora.lora.init import random_adapter
from evora.lora.noise import noise_key
from evora.strategies.protocol import StrategyContext, Told, TrainingContext, clone_tensors
from evora.strategies.sft.config import SFTConfig
from evora.training.lora_sft import LoraSFT, TrainSettings


@dataclass
class SFTState:
    STATE_VERSION: ClassVar[int] = 1
    adapter: Tensors
    optimizer: dict[str, Any] | None = None  # AdamW's state_dict; None before the first step
    step: int = 0


class SupervisedFineTuning:
    state_type = SFTState

    def __init__(self, cfg: SFTConfig, run_seed: int):
        self.cfg = cfg
        self.seed = run_seed
        self._trainer: LoraSFT | None = None  # kept between generations; rebuilt from the state after a restart

    def initial_state(self, context: StrategyContext) -> SFTState:
        # B = 0: the adapter starts as the base model (PEFT's convention); A seeded by the run.
        return SFTState(random_adapter(context.layout, noise_key(context.seed, "sft-init"), None, 0.0))

    def center(self, state: SFTState) -> Tensors:
        return state.adapter

    def improve(self, state: SFTState, generation: int, context: TrainingContext) -> Told:
        trainer = self._trainer_at(state, context)
        before = trainer.tokens_trained
        taken, loss = 0, 0.0
        for _ in range(self.cfg.steps_per_generation):
            loss += trainer.train(1)
            taken += 1
            if context.spent({"tokens_trained": trainer.tokens_trained - before}):
                break
        spend = {"tokens_trained": trainer.tokens_trained - before}
        told_state = SFTState(
            clone_tensors(trainer.adapter()), copy.deepcopy(trainer.optimizer.state_dict()), trainer.step
        )
        return Told(told_state, {"loss": loss / taken, "steps": float(taken), "step": float(trainer.step)}, spend=spend)

    def _trainer_at(self, state: SFTState, context: TrainingContext) -> LoraSFT:
        if self._trainer is not None and self._trainer.step == state.step:
            return self._trainer
        layout, cfg = context.layout, self.cfg
        hyperparameters = {
            "rank": layout.rank,
            "alpha_multiplier": layout.alpha / layout.rank,
            "dropout": cfg.dropout,
            "target_modules": ",".join(layout.target_modules),
            "learning_rate": cfg.learning_rate,
        }
        settings = TrainSettings(
            cfg.batch_size,
            cfg.gradient_accumulation,
            cfg.weight_decay,
            cfg.max_grad_norm,
            cfg.warmup_ratio,
            context.planned_steps,
            layout.layers,
            noise_key(self.seed, "sft"),
        )
        pairs = [(context.prompt_ids(e), context.target_ids(e)) for e in context.train]
        self._trainer = LoraSFT(
            context.model_path,
            hyperparameters,
            settings,
            pairs,
            context.pad_id,
            adapter=state.adapter,
            optimizer_state=state.optimizer,
            step=state.step,
            device=context.device,
        )
        return self._trainer
