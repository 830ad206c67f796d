"""GRPO with a LoRA adapter through TRL's GRPOTrainer (`evora/training/grpo.py`), as a
gradient strategy of the shared loop: each generation takes `steps_per_generation`
optimizer steps on the driver, ending early once the run's budget is spent. Completions
are sampled on the run's engine workers (`context.sample`; `rollouts=driver`: with transformers
on the driver, as TRL samples without vLLM) and scored by the task's reward through the same
bounded scoring as every strategy."""

from __future__ import annotations

from typing import Any

from evora.lora import Tensors
from evora.lora.keys import noise_key
from evora.strategies.protocol import Spend, Told, TrainingContext
from evora.strategies.trained import TrainedAdapter
from evora.training.full_spec import Trained
from evora.training.grpo import GRPOSettings, GRPOTraining, LoraSpec

COUNTERS = ("tokens_prompt", "tokens_generated", "tokens_scored", "tokens_trained")


class GroupRelativePolicyOptimization(TrainedAdapter):
    init_salt = "grpo-init"

    def improve(self, state: Any, generation: int, context: TrainingContext) -> Told:
        trainer = self.trainer_at(state, context)
        before = {name: getattr(trainer, name) for name in COUNTERS}

        def spend() -> Spend:
            return Spend(**{name: getattr(trainer, name) - before[name] for name in COUNTERS})

        sampling = trainer.rollout_seconds
        stats = trainer.train(self.cfg.steps_per_generation, stop=lambda: context.spent(spend()))
        stats |= {"step": float(trainer.step), "seconds_rollout": trainer.rollout_seconds - sampling}
        return Told(self.state_after(trainer, generation), stats, spend=spend())

    def state_after(self, trainer: GRPOTraining, generation: int) -> Any:
        return self.state_of(trainer)

    def trains(self, context: TrainingContext) -> Trained:
        """What the trainer trains: the run's LoRA."""
        layout = context.layout
        return LoraSpec(layout.rank, layout.alpha, layout.target_modules, layout.layers, self.cfg.dropout)

    def trained_tensors(self, state: Any) -> Tensors | None:
        return state.adapter

    def build_trainer(self, state: Any, context: TrainingContext) -> GRPOTraining:
        if self._trainer is not None:
            self._trainer.close()
        cfg = self.cfg
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
            epsilon_high=cfg.epsilon_high,
            scale_rewards=cfg.scale_rewards,
            micro_batches=cfg.micro_batches,
            importance_sampling=cfg.importance_sampling,
            importance_sampling_cap=cfg.importance_sampling_cap,
            rows_per_unit=cfg.rows_per_unit,
        )
        on_engines = cfg.rollouts == "engines"
        if on_engines and context.sample is None:
            raise RuntimeError("strategy.rollouts=engines, but this run's driver was given no engine sampler")
        return GRPOTraining(
            context.model_path,
            self.trains(context),
            settings,
            [context.prompt_text(e) for e in context.train],
            context.rewards,
            trained=self.trained_tensors(state),
            optimizer_state=state.optimizer,
            step=state.step,
            device=context.device,
            special_tokens=context.special_tokens,
            sample=context.sample if on_engines else None,
            prompt_ids=[context.prompt_ids(e) for e in context.train] if on_engines else None,
        )
