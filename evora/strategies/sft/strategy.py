"""LoRA supervised fine-tuning on the task's train split (prompt -> reference completion,
loss on the completion), as a gradient strategy of the shared loop: each generation trains
`steps_per_generation` optimizer steps on the driver (`evora/training/lora_sft.py`, the
trainer PBT members use), ending early once the run's budget is spent.

The trainer is kept between generations; its state (adapter, AdamW moments, step) is the
strategy state, so a resumed run continues the same batches (they are a function of the
run seed and the step).
"""

from __future__ import annotations

from evora.lora.keys import noise_key
from evora.strategies.protocol import Spend, Told, TrainingContext
from evora.strategies.trained import TrainedAdapter, TrainedState
from evora.training.lora_sft import LoraSFT, TrainSettings
from evora.training.lora_spec import LoraSpec


class SupervisedFineTuning(TrainedAdapter):
    init_salt = "sft-init"

    def improve(self, state: TrainedState, generation: int, context: TrainingContext) -> Told:
        trainer = self.trainer_at(state, context)
        before = trainer.tokens_trained
        taken, loss = 0, 0.0
        for _ in range(self.cfg.steps_per_generation):
            loss += trainer.train(1)
            taken += 1
            if context.spent(Spend(tokens_trained=trainer.tokens_trained - before)):
                break
        stats = {"loss": loss / taken, "steps": float(taken), "step": float(trainer.step)}
        return Told(self.state_of(trainer), stats, spend=Spend(tokens_trained=trainer.tokens_trained - before))

    def build_trainer(self, state: TrainedState, context: TrainingContext) -> LoraSFT:
        layout, cfg = context.layout, self.cfg
        settings = TrainSettings(
            learning_rate=cfg.learning_rate,
            batch_size=cfg.batch_size,
            gradient_accumulation=cfg.gradient_accumulation,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            warmup_ratio=cfg.warmup_ratio,
            total_steps=context.planned_steps,
            seed=noise_key(self.seed, "sft"),
        )
        pairs = [(context.prompt_ids(e), context.target_ids(e)) for e in context.train]
        return LoraSFT(
            context.model_path,
            LoraSpec.of_layout(layout, cfg.dropout),
            settings,
            pairs,
            context.pad_id,
            adapter=state.adapter,
            optimizer_state=state.optimizer,
            step=state.step,
            device=context.device,
        )
