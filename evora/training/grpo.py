"""GRPO training of a LoRA adapter through TRL's `GRPOTrainer`, driven in chunks.

What: each optimizer step draws `prompts_per_step` prompts, samples `num_generations`
completions of each with transformers' `generate` (TRL's vLLM mode is off), scores them
with the caller's reward, and takes one AdamW step on the group-relative advantages
(TRL's loss, clipping and KL to the base model, as `GRPOSettings` sets them).

How it is chunked: one `GRPOTrainer` lives as long as the `LoraGRPO`; each `train(k)`
sets `args.max_steps = k` and calls `GRPOTrainer.train()` again. What makes chunks
continue one run rather than restart it:

- the optimizer is ours (AdamW over the LoRA tensors, constant learning rate, a constant
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

So `adapter()` + `state()` (+ the same constructor arguments) continue a run exactly: a
run of 2 + 2 steps, with or without a rebuild in between, ends on the adapter of a run of 4.

Prompts are text as the model sees them; the tokenizer adds its special tokens (BOS) unless
`special_tokens=False`, for chat-templated text that holds its own (`_tokenize_prompts`).

The reference model (beta > 0) is the base model: the adapter is added from `peft_config`
by TRL and is loaded afterwards, so TRL computes reference log-probs with the adapter
disabled, never against a frozen copy of the adapter we started from.

Token counters, cumulative since construction (real tokens: padding never counts):
- tokens_prompt: prompt tokens of every row given to `generate` (TRL's `_generate`
  output): each prompt counts once per completion, as transformers prefills every row;
- tokens_generated: completion tokens kept by TRL (up to and including EOS);
- tokens_trained: prompt + completion tokens (the attention mask) of every micro-batch
  through `compute_loss`, the policy's forward and backward;
- tokens_scored: the same tokens once per forward-only pass TRL made in
  `_generate_and_score_completions`: the reference pass when beta > 0, the old-policy
  pass when TRL computes old log-probs (only when generations are reused, not here).

TRL internals relied on (overridden or read): `GRPOTrainer._get_train_sampler`,
`_tokenize_prompts`, `_generate`, `_generate_and_score_completions`, `compute_loss`,
`_send_telemetry` (silenced: no network pings), and the keys `prompt_mask`,
`completion_mask`, `ref_per_token_logps`, `old_per_token_logps` of its batches.
"""

from __future__ import annotations

import functools
import random
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from evora.lora import Tensors
from evora.lora.noise import noise_key

Reward = Callable[[list[str], list[int]], list[float]]  # (completions, prompt indices) -> rewards
SKIPPED_STATS = ("epoch", "num_tokens")  # chunk-local running totals, not per-step values


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    layers: tuple[int, ...] | None = None
    dropout: float = 0.0

    def peft_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=list(self.target_modules),
            layers_to_transform=list(self.layers) if self.layers else None,
            lora_dropout=self.dropout,
            task_type="CAUSAL_LM",
        )


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

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


@dataclass
class Counters:
    prompt: int = 0
    generated: int = 0
    trained: int = 0
    scored: int = 0


@dataclass
class _Run:
    """What the trainer subclass reads from its owner: order, seeds, counters."""

    seed: int
    n_prompts: int
    settings: GRPOSettings
    special_tokens: bool
    step0: int = 0  # optimizer steps taken before the current chunk
    counters: Counters = field(default_factory=Counters)


def prompt_order(n_prompts: int, per_step: int, seed: int, first_step: int, steps: int) -> list[int]:
    """Prompt indices of steps [first_step, first_step + steps), `per_step` each: passes over
    the prompts, each a fresh seeded permutation, so any step's prompts are known up front."""
    order, permutations = [], {}
    for position in range(first_step * per_step, (first_step + steps) * per_step):
        epoch, offset = divmod(position, n_prompts)
        if epoch not in permutations:
            permutations[epoch] = list(range(n_prompts))
            random.Random(noise_key(seed, "grpo-order", epoch)).shuffle(permutations[epoch])
        order.append(permutations[epoch][offset])
    return order


class StepSampler(Sampler[int]):
    """Dataset rows in the order TRL's RepeatSampler would give them: per step, each prompt
    `group` times in a row, the step's whole batch `repeats` times (once per micro-batch:
    TRL generates from the first and serves the others from its buffer)."""

    def __init__(self, order: list[int], per_step: int, group: int, repeats: int):
        self.order, self.per_step, self.group, self.repeats = order, per_step, group, repeats

    def __iter__(self) -> Iterator[int]:
        for start in range(0, len(self.order), self.per_step):
            batch = self.order[start : start + self.per_step]
            for _ in range(self.repeats):
                for index in batch:
                    yield from [index] * self.group

    def __len__(self) -> int:
        return len(self.order) * self.group * self.repeats


@contextmanager
def own_rng(device: torch.device) -> Iterator[None]:
    """Run code that reseeds the global RNGs (TRL's set_seed, our per-step seeds) without
    changing the caller's random, numpy and torch streams."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def reward_function(reward: Reward) -> Callable[..., list[float]]:
    """TRL's reward signature: dataset columns arrive as keyword lists, here `index`."""

    def reward_fn(prompts: list[str], completions: list[str], index: list[int], **_: Any) -> list[float]:
        return [float(r) for r in reward(list(completions), [int(i) for i in index])]

    reward_fn.__name__ = "reward"  # TRL logs per-function stats under this name
    return reward_fn


def from_trl(name: str) -> Any:
    """A trl class, imported only when used (trl pulls W&B and vLLM in, which the pure packages
    must not), without trl's warning that the installed vLLM is newer than it knows: we never use it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
        import trl

        return getattr(trl, name)  # trl imports lazily: the attribute is the real import


@functools.cache
def trainer_class() -> type:
    """GRPOTrainer with our data order, RNG and counters."""
    GRPOTrainer = from_trl("GRPOTrainer")

    class EvoraGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, evora_run: _Run, **kwargs: Any):
            self.evora_run = evora_run
            super().__init__(*args, **kwargs)

        def _send_telemetry(self) -> None:  # no pings to the hub from training workers
            return None

        def _get_train_sampler(self, dataset: Any = None) -> Sampler:
            run, per_step = self.evora_run, self.evora_run.settings.prompts_per_step
            order = prompt_order(run.n_prompts, per_step, run.seed, run.step0, self.args.max_steps)
            return StepSampler(order, per_step, run.settings.num_generations, self.args.steps_per_generation)

        def _tokenize_prompts(self, prompts: list) -> tuple[list[list[int]], None, dict]:
            # chat-templated text carries its own BOS: the tokenizer must not add a second one
            ids = self._tokenizer(list(prompts), add_special_tokens=self.evora_run.special_tokens)["input_ids"]
            return ids, None, {}

        def _generate(self, prompts: list) -> tuple:
            out = super()._generate(prompts)
            prompt_ids, completion_ids = out[0], out[1]
            self.evora_run.counters.prompt += sum(len(ids) for ids in prompt_ids)
            self.evora_run.counters.generated += sum(len(ids) for ids in completion_ids)
            return out

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            run = self.evora_run
            torch.manual_seed(noise_key(run.seed, "grpo-sample", run.step0 + self.state.global_step))
            out = super()._generate_and_score_completions(inputs)
            passes = int("ref_per_token_logps" in out) + int("old_per_token_logps" in out)
            self.evora_run.counters.scored += passes * int(out["prompt_mask"].sum() + out["completion_mask"].sum())
            return out

        def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
            self.evora_run.counters.trained += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
            return super().compute_loss(model, inputs, *args, **kwargs)

    return EvoraGRPOTrainer


@functools.cache
def callback_class() -> type:
    from transformers import TrainerCallback

    class ChunkCallback(TrainerCallback):
        """Records each step's logs and ends the chunk after a step where stop() is True."""

        def __init__(self) -> None:
            self.logs: list[dict[str, float]] = []
            self.stop: Callable[[], bool] | None = None

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:  # a step's log; the end-of-train summary has train_loss instead
                self.logs.append({k: float(v) for k, v in logs.items() if isinstance(v, (int, float))})

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self.stop is not None and self.stop():
                control.should_training_stop = True
            return control

    return ChunkCallback


def mean_stats(logs: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for log in logs for k in log if k not in SKIPPED_STATS}
    return {k: sum(log[k] for log in logs if k in log) / sum(k in log for log in logs) for k in sorted(keys)}


def grpo_config(settings: GRPOSettings, device: torch.device, output_dir: str) -> Any:
    if settings.completions_per_step % settings.micro_batches:
        raise ValueError(
            f"prompts_per_step * num_generations ({settings.completions_per_step}) must divide into "
            f"micro_batches ({settings.micro_batches})"
        )
    on_gpu = device.type == "cuda"
    return from_trl("GRPOConfig")(
        output_dir=output_dir,
        use_cpu=not on_gpu,
        bf16=on_gpu and torch.cuda.is_bf16_supported(),  # TRL defaults bf16 to True, even on the CPU
        fp16=False,
        use_vllm=False,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.max_grad_norm,
        per_device_train_batch_size=settings.completions_per_step // settings.micro_batches,
        gradient_accumulation_steps=settings.micro_batches,
        steps_per_generation=settings.micro_batches,  # one generation per optimizer step, never reused
        num_iterations=1,
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        beta=settings.beta,
        epsilon=settings.epsilon,
        epsilon_high=settings.epsilon_high,
        loss_type=settings.loss_type,
        scale_rewards=settings.scale_rewards,
        mask_truncated_completions=settings.mask_truncated_completions,
        gradient_checkpointing=settings.gradient_checkpointing,
        seed=settings.seed,
        max_steps=1,  # set per chunk
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )


class LoraGRPO:
    def __init__(
        self,
        model_path: str,
        lora: LoraSpec,
        settings: GRPOSettings,
        prompts: list[str],
        reward: Reward,
        adapter: Tensors | None = None,
        optimizer_state: dict | None = None,
        step: int = 0,
        device: str = "cpu",
        special_tokens: bool = True,  # False for chat-templated prompts, which hold their own BOS
    ):
        if not prompts:
            raise ValueError("GRPO needs at least one prompt")
        self.settings, self.step = settings, step
        self.device = torch.device(device if device != "cuda" or torch.cuda.is_available() else "cpu")
        self._run = _Run(settings.seed, len(prompts), settings, special_tokens)
        self._output_dir = tempfile.mkdtemp(prefix="evora-grpo-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._output_dir, ignore_errors=True)
        self._callback = callback_class()()
        with own_rng(self.device):
            self._trainer = self._build_trainer(model_path, lora, prompts, reward)
            self.model = self._trainer.model
            self._load_adapter(adapter)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        if optimizer_state is not None and self._fits(optimizer_state):
            self.optimizer.load_state_dict(optimizer_state)
        self._trainer.optimizer = self.optimizer
        self._trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    def _build_trainer(self, model_path: str, lora: LoraSpec, prompts: list[str], reward: Reward) -> Any:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.trainer_callback import PrinterCallback

        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)
        tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left", truncation_side="left")
        trainer = trainer_class()(
            model=base,
            reward_funcs=reward_function(reward),
            args=grpo_config(self.settings, self.device, self._output_dir),
            train_dataset=Dataset.from_dict({"prompt": list(prompts), "index": list(range(len(prompts)))}),
            processing_class=tokenizer,
            callbacks=[self._callback],
            peft_config=lora.peft_config(),
            evora_run=self._run,
        )
        trainer.remove_callback(PrinterCallback)  # disable_tqdm swaps the progress bar for printed logs
        return trainer

    def _load_adapter(self, adapter: Tensors | None) -> None:
        from peft import set_peft_model_state_dict
        from peft.tuners.lora import LoraLayer

        if adapter is not None:
            set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in adapter.items()})
            return
        # a fresh adapter's A init is seeded from the run's seed, not from whatever TRL seeded before wrapping
        torch.manual_seed(noise_key(self.settings.seed, "grpo-init"))
        for module in self.model.modules():
            if isinstance(module, LoraLayer):
                module.reset_lora_parameters("default", True)

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

    def adapter(self) -> Tensors:
        """The adapter in PEFT naming, fp32 on the CPU."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().float().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}

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
