"""GRPO with a LoRA adapter through TRL's GRPOTrainer (`evora/training/grpo.py`), as a
gradient strategy of the shared loop: each generation takes `steps_per_generation`
optimizer steps on the driver, ending early once the run's budget is spent. Completions
are sampled with transformers (TRL's vLLM mode pins an older vLLM than evora's) and scored
by the task's reward through the same bounded scoring as every strategy."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from evora.lora import Tensors
from evora.lora.init import random_adapter
from evora.lora.noise import noise_key
from evora.strategies.grpo.config import GRPOConfig
from evora.strategies.protocol import StrategyContext, Told, TrainingContext, clone_tensors
from evora.training.grpo import GRPOSettings, LoraGRPO, LoraSpec

COUNTERS = ("tokens_prompt", "tokens_generated", "tokens_scored", "tokens_trained")


@dataclass
class GRPOState:
    STATE_VERSION: ClassVar[int] = 1
    adapter: Tensors
    optimizer: dict[str, Any] | None = None  # AdamW's state_dict; None before the first step
    step: int = 0


class GroupRelativePolicyOptimization:
    state_type = GRPOState

    def __init__(self, cfg: GRPOConfig, run_seed: int):
        self.cfg = cfg
        self.seed = run_seed
        self._trainer: LoraGRPO | None = None  # kept between generations; rebuilt from the state after a restart

    def initial_state(self, context: StrategyContext) -> GRPOState:
        return GRPOState(random_adapter(context.layout, noise_key(context.seed, "grpo-init"), None, 0.0))

    def center(self, state: GRPOState) -> Tensors:
        return state.adapter

    def improve(self, state: GRPOState, generation: int, context: TrainingContext) -> Told:
        trainer = self._trainer_at(state, context)
        before = {name: getattr(trainer, name) for name in COUNTERS}

        def spend() -> dict[str, int]:
            return {name: getattr(trainer, name) - before[name] for name in COUNTERS}

        stats = trainer.train(self.cfg.steps_per_generation, stop=lambda: context.spent(spend()))
        told_state = GRPOState(
            clone_tensors(trainer.adapter()), copy.deepcopy(trainer.optimizer.state_dict()), trainer.step
        )
        return Told(told_state, {**stats, "step": float(trainer.step)}, spend=spend())

    def _trainer_at(self, state: GRPOState, context: TrainingContext) -> LoraGRPO:
        if self._trainer is not None and self._trainer.step == state.step:
            return self._trainer
        if self._trainer is not None:
            self._trainer.close()
        cfg, layout = self.cfg, context.layout
        settings = GRPOSettings(
            learning_rate=cfg.learning_rate,
            num_generations=cfg.num_generations,
            prompts_per_step=cfg.prompts_per_step,
            beta=cfg.beta,
            max_completion_length=context.max_tokens,
            temperature=cfg.temperature,
            epsilon=cfg.epsilon,
            max_grad_norm=cfg.max_grad_norm,
            weight_decay=cfg.weight_decay,
            seed=noise_key(self.seed, "grpo") % 2**32,  # TRL seeds numpy too (32-bit)
            loss_type=cfg.loss_type,
            micro_batches=cfg.micro_batches,
        )
        lora = LoraSpec(layout.rank, layout.alpha, layout.target_modules, layout.layers, cfg.dropout)
        self._trainer = LoraGRPO(
            context.model_path,
            lora,
            settings,
            [context.prompt_text(e) for e in context.train],
            context.rewards,
            adapter=state.adapter,
            optimizer_state=state.optimizer,
            step=state.step,
            device=context.device,
            special_tokens=context.special_tokens,
        )
        return self._trainer
