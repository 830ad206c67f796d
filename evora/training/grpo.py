"""GRPO training of a LoRA adapter, or of the model's own matrices, through TRL's `GRPOTrainer`,
driven in chunks.

What: each optimizer step draws `prompts_per_step` prompts, samples `num_generations`
completions of each, scores them with the caller's reward, and takes one AdamW step on the
group-relative advantages (TRL's loss, clipping and KL to the base model, as `GRPOSettings` sets
them) over what `trains` names: a LoRA, or the model's own matrices (`full_spec.py`). The
completions come from the caller's sampler where one is given (a run's engine workers, through
TRL's `rollout_func`: `grpo_trl.py`), else from transformers' `generate` in this process (TRL's
own vLLM mode stays off: it pins an older vLLM than evora's).

How it is chunked: one `GRPOTrainer` lives as long as the `GRPOTraining`; each `train(k)`
sets `args.max_steps = k` and calls `GRPOTrainer.train()` again. What makes chunks
continue one run rather than restart it:

- the optimizer is ours (AdamW over the trained tensors, constant learning rate, a constant
  `LambdaLR`), handed to the trainer, so `Trainer.create_optimizer` keeps it and its state;
- the prompts come from `_get_train_sampler`, overridden to yield the prompts of steps
  [step, step + k) of a fixed order: one seeded permutation per pass over the prompts, a
  pure function of (seed, step), so neither a new chunk nor a rebuilt object goes back
  to the start;
- the sampling RNG is reseeded from (seed, step) before each generation
  (`_generate_and_score_completions`), so a step's completions depend only on the
  adapter and the step, not on what the caller's process drew in between; TRL's own
  `set_seed` calls run inside a saved-and-restored RNG state and leave the caller's
  streams alone;
- a callback ends a chunk after any step where `stop()` is True and records the logs
  (`GRPOTrainer.log`, one per step since logging_steps=1) that `train` averages.

So `trained()` + `state()` (+ the same constructor arguments) continue a run exactly: a
run of 2 + 2 steps, with or without a rebuild in between, ends on the tensors of a run of 4.

Prompts are text as the model sees them; the tokenizer adds its special tokens (BOS) unless
`special_tokens=False`, for chat-templated text that holds its own (`_tokenize_prompts`).

The reference model (beta > 0) is the base model: the adapter is added from `peft_config`
by TRL and is loaded afterwards, so TRL computes reference log-probs with the adapter
disabled, never against a frozen copy of the adapter we started from; with full weights, TRL
loads a second copy of the model from its path.

Token counters, cumulative since construction (real tokens: padding never counts):
- tokens_prompt: prompt tokens of every row given to `generate` (TRL's `_generate`
  output): each prompt counts once per completion, as transformers prefills every row;
- tokens_generated: completion tokens kept by TRL (up to and including EOS);
- tokens_trained: prompt + completion tokens (the attention mask) of every micro-batch
  through `compute_loss`, the policy's forward and backward;
- tokens_scored: the same tokens once per forward-only pass TRL made in
  `_generate_and_score_completions`: the reference pass when beta > 0, the old-policy
  pass when TRL computes old log-probs (here only for the importance-sampling correction),
  and the sampler's pass for the completions' log-probabilities (the same correction);
- with a sampler, tokens_prompt and tokens_generated are what the engines prefilled and generated.

TRL internals relied on (overridden or read): `GRPOTrainer._get_train_sampler`,
`_tokenize_prompts`, `_generate`, `_generate_and_score_completions`, `compute_loss`,
`_send_telemetry` (silenced: no network pings), and the keys `prompt_mask`,
`completion_mask`, `ref_per_token_logps`, `old_per_token_logps` of its batches; with a sampler,
`rollout_func` and, for the importance-sampling correction, `use_vllm`, `vllm_generation`
and `_last_loaded_step` (`grpo_trl.py` says why).

Where the parts live: the settings (`grpo_settings.py`), the prompt order, sampler and RNG
(`grpo_order.py`), TRL's config, trainer subclass and callback (`grpo_trl.py`); this module
holds `GRPOTraining`, which drives them, and re-exports the names callers import from here.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import torch

from evora.lora import Tensors
from evora.lora.keys import noise_key
from evora.training.full_spec import FullSpec, Trained
from evora.training.grpo_order import StepSampler, own_rng, prompt_order
from evora.training.grpo_settings import Counters, GRPOSettings, LoraSpec, Reward
from evora.training.grpo_trl import (
    SKIPPED_STATS,
    TrainerRun,
    callback_class,
    from_trl,
    grpo_config,
    mean_stats,
    reward_function,
    trainer_class,
)
from evora.training.rollouts import RolloutSampler

__all__ = [
    "SKIPPED_STATS",
    "Counters",
    "FullSpec",
    "GRPOSettings",
    "GRPOTraining",
    "LoraSpec",
    "Reward",
    "StepSampler",
    "TrainerRun",
    "callback_class",
    "from_trl",
    "grpo_config",
    "mean_stats",
    "own_rng",
    "prompt_order",
    "reward_function",
    "trainer_class",
]


class GRPOTraining:
    def __init__(
        self,
        model_path: str,
        trains: Trained,  # a LoraSpec or a FullSpec
        settings: GRPOSettings,
        prompts: list[str],
        reward: Reward,
        trained: Tensors | None = None,  # a saved state's (None: a fresh start)
        optimizer_state: dict | None = None,
        step: int = 0,
        device: str = "cpu",
        special_tokens: bool = True,  # False for chat-templated prompts, which hold their own BOS
        sample: RolloutSampler | None = None,  # where completions are sampled (None: transformers, here)
        prompt_ids: list[list[int]] | None = None,  # each prompt's ids as the sampler's engines render it
    ):
        if not prompts:
            raise ValueError("GRPO needs at least one prompt")
        if sample is not None and (prompt_ids is None or len(prompt_ids) != len(prompts)):
            raise ValueError("a sampler needs every prompt's token ids")
        self.settings, self.step = settings, step
        self.device = torch.device(device if device != "cuda" or torch.cuda.is_available() else "cpu")
        ids = tuple(tuple(p) for p in prompt_ids or ())
        self.trains = trains
        self._run = TrainerRun(
            settings.seed, len(prompts), settings, special_tokens, trains, sample=sample, prompt_ids=ids
        )
        self._output_dir = tempfile.mkdtemp(prefix="evora-grpo-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._output_dir, ignore_errors=True)
        self._callback = callback_class()()
        with own_rng(self.device):
            self._trainer = self._build_trainer(model_path, prompts, reward)
            self.model = self._trainer.model
            trains.load(self.model, trained, noise_key(settings.seed, "grpo-init"))
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        if optimizer_state is not None and self._fits(optimizer_state):
            self.optimizer.load_state_dict(optimizer_state)
        self._trainer.optimizer = self.optimizer
        self._trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    def _build_trainer(self, model_path: str, prompts: list[str], reward: Reward) -> Any:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.trainer_callback import PrinterCallback

        base: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        base = base.to(self.device)
        self.trains.prepare(base)
        tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left", truncation_side="left")
        trainer = trainer_class()(
            model=base,
            reward_funcs=reward_function(reward),
            args=grpo_config(self.settings, self.device, self._output_dir),
            train_dataset=Dataset.from_dict({"prompt": list(prompts), "index": list(range(len(prompts)))}),
            processing_class=tokenizer,
            callbacks=[self._callback],
            peft_config=self.trains.peft_config(),
            evora_run=self._run,
        )
        trainer.remove_callback(PrinterCallback)  # disable_tqdm swaps the progress bar for printed logs
        return trainer

    def _fits(self, optimizer_state: dict) -> bool:
        ours = [p.shape for group in self.optimizer.param_groups for p in group["params"]]
        theirs = [s["exp_avg"].shape for s in optimizer_state.get("state", {}).values()]
        return len(ours) == len(theirs) and all(a == b for a, b in zip(ours, theirs))

    def train(self, steps: int, stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """Up to `steps` optimizer steps, ending early after any step where stop() is True;
        the mean of TRL's per-step logs (loss, reward, kl, entropy, ...) and 'steps' taken."""
        if steps <= 0:
            return {"steps": 0.0}
        self._callback.logs, self._callback.stop = [], stop
        self._run.step0 = self.step
        self._trainer.args.max_steps = steps
        with own_rng(self.device):
            self._trainer.train()
        taken = self._trainer.state.global_step
        self.step += taken
        self.model.eval()
        return {**mean_stats(self._callback.logs), "steps": float(taken)}

    def trained(self) -> Tensors:
        """What it trains, fp32 on the CPU: the adapter in PEFT naming, or the matrices by checkpoint name."""
        return self.trains.tensors(self.model)

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "optimizer": self.optimizer.state_dict()}

    def close(self) -> None:
        """Remove the trainer's scratch directory now rather than at garbage collection."""
        self._cleanup()

    @property
    def tokens_prompt(self) -> int:
        return self._run.counters.prompt

    @property
    def tokens_generated(self) -> int:
        return self._run.counters.generated

    @property
    def tokens_trained(self) -> int:
        return self._run.counters.trained

    @property
    def tokens_scored(self) -> int:
        return self._run.counters.scored

    @property
    def rollout_seconds(self) -> float:
        return self._run.counters.rollout_seconds
