"""TRL's side of a chunked GRPO run (`evora/training/grpo.py`): its config from our settings,
the reward in its signature, and the `GRPOTrainer` subclass and callback that read and write
what the owning `GRPOTraining` shares with them (`TrainerRun`).

Where a sampler is given (`TrainerRun.sample`: the run's engine workers), completions come
through TRL's `rollout_func` (TRL's tokenizer and `generate` are then not used for them) and TRL
keeps everything else: rewards, advantages, loss, clipping, KL and the optimizer step. Its
importance-sampling correction is tied to its vLLM switch (`use_vllm`), which would also build
TRL's own vLLM backend; so `use_vllm` stays off in the config and is turned on after
construction, with `vllm_generation` an object whose `sync_weights` has nothing to do: each
request carries the policy (`RolloutRequest.policy`: the adapter, or the trained matrices)."""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler

from evora.lora.keys import noise_key
from evora.training.full_spec import Trained
from evora.training.grpo_order import StepSampler, prompt_order
from evora.training.grpo_settings import Counters, GRPOSettings, Reward
from evora.training.rollouts import RolloutRequest, RolloutSampler

SKIPPED_STATS = ("epoch", "num_tokens")  # chunk-local running totals, not per-step values


@dataclass
class TrainerRun:
    """What the trainer subclass reads from its owner: order, seeds, counters."""

    seed: int
    n_prompts: int
    settings: GRPOSettings
    special_tokens: bool
    trains: Trained  # what is trained: it gives the engines the policy (`Trained.policy`)
    step0: int = 0  # optimizer steps taken before the current chunk
    counters: Counters = field(default_factory=Counters)
    sample: RolloutSampler | None = None  # None: TRL samples with transformers' generate on the driver
    prompt_ids: tuple[tuple[int, ...], ...] = ()  # each train prompt's ids, as the engines render it (with `sample`)
    batch: tuple[int, ...] = ()  # the train indices of the rows TRL is generating now


class PolicyTravelsWithRequests:
    """TRL's `vllm_generation` where it calls only `sync_weights` (before a rollout, once a step):
    the engines get the policy (adapter or weights) with every request: nothing to sync ahead."""

    def sync_weights(self) -> None:
        return None


def rollout_seed(seed: int, step: int, row: int) -> int:
    """The seed of one completion's stream: by step and row, never by unit or worker."""
    return noise_key(seed, "grpo-rollout", step, row)


def reward_function(reward: Reward) -> Callable[..., list[float]]:
    """TRL's reward signature: dataset columns arrive as keyword lists, here `index`."""

    def reward_fn(prompts: list[str], completions: list[str], index: list[int], **_: Any) -> list[float]:
        return [float(r) for r in reward(list(completions), [int(i) for i in index])]

    reward_fn.__name__ = "reward"  # TRL logs per-function stats under this name
    return reward_fn


def from_trl(name: str) -> Any:
    """A trl class, imported only when used (trl pulls W&B in, which the pure packages must not),
    with vLLM hidden from trl while it imports (`trl_without_vllm`)."""
    with trl_without_vllm():
        import trl

        return getattr(trl, name)  # trl imports lazily: the attribute is the real import


@contextlib.contextmanager
def trl_without_vllm() -> Iterator[None]:
    """trl's modules ask `is_vllm_available()` as they import and, where vLLM is installed (evora's
    engines), import vLLM's client and generation stack: about 3 CPU-s of a GRPO driver's start
    here, and a warning that the installed vLLM is newer than trl knows. evora never uses trl's own
    vLLM (rollouts come from its engine workers, `rollout_func`), so trl imports with the check
    answering no; trl's vLLM classes, which evora never builds, would then refuse to start. Written
    for trl 1.16 (`trl.import_utils.is_vllm_available`); with another layout trl imports as it
    would have, and at worst vLLM with it."""
    import trl.import_utils as trl_imports

    available = vars(trl_imports).get("is_vllm_available")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
        if available is None:  # another layout
            yield
            return
        trl_imports.is_vllm_available = lambda min_version=None: False
        try:
            yield
        finally:
            trl_imports.is_vllm_available = available


def rollout_func(prompts: list, trainer: Any) -> dict[str, Any]:
    """TRL's `rollout_func`: the rows the trainer is generating (`evora_run.batch`), sampled by
    `evora_run.sample` from the policy as it is now."""
    run, settings = trainer.evora_run, trainer.evora_run.settings
    assert run.sample is not None and len(run.batch) == len(prompts)
    step = run.step0 + trainer.state.global_step
    rows = tuple(run.prompt_ids[i] for i in run.batch)
    request = RolloutRequest(
        step=step,
        prompts=rows,
        seeds=tuple(rollout_seed(run.seed, step, row) for row in range(len(rows))),
        max_tokens=settings.max_completion_length,
        temperature=settings.temperature,
        top_p=settings.top_p,
        logprobs=settings.corrects_sampling,
        rows_per_unit=settings.rows_per_unit,
        policy=run.trains.policy(trainer.model),
    )
    rollouts = run.sample(request)
    completions = [list(r.completion_ids) for r in rollouts]
    if request.logprobs:  # the engines' teacher-forced pass over prompt and completion
        run.counters.scored += sum(len(p) + len(c) for p, c in zip(rows, completions))
    logprobs = [list(r.logprobs or ()) for r in rollouts] if request.logprobs else None
    return {"prompt_ids": [list(p) for p in rows], "completion_ids": completions, "logprobs": logprobs}


def correct_sampling(trainer: Any) -> None:
    """TRL's importance-sampling correction, without TRL's vLLM backend (see the module doc)."""
    trainer.use_vllm = True
    trainer.vllm_generation = PolicyTravelsWithRequests()
    trainer._last_loaded_step = -1


@functools.cache
def trainer_class() -> type:
    """GRPOTrainer with our data order, RNG and counters."""
    GRPOTrainer = from_trl("GRPOTrainer")

    class EvoraGRPOTrainer(GRPOTrainer):  # type: ignore[misc, valid-type]  # a class only known at run time
        def __init__(self, *args: Any, evora_run: TrainerRun, **kwargs: Any):
            self.evora_run = evora_run
            with warnings.catch_warnings():  # that rollout_func is experimental: its use is pinned with TRL
                warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
                super().__init__(*args, rollout_func=rollout_func if evora_run.sample else None, **kwargs)
            if evora_run.sample is not None and evora_run.settings.corrects_sampling:
                correct_sampling(self)

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
            started = time.perf_counter()
            out = super()._generate(prompts)
            self.evora_run.counters.rollout_seconds += time.perf_counter() - started
            prompt_ids, completion_ids = out[0], out[1]
            self.evora_run.counters.prompt += sum(len(ids) for ids in prompt_ids)
            self.evora_run.counters.generated += sum(len(ids) for ids in completion_ids)
            return out

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            run = self.evora_run
            run.batch = tuple(int(row["index"]) for row in inputs)
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
        use_vllm=False,  # see the module doc: turned on after construction for the correction
        vllm_importance_sampling_correction=settings.corrects_sampling,
        vllm_importance_sampling_mode=settings.importance_sampling if settings.corrects_sampling else "sequence_mask",
        vllm_importance_sampling_clip_max=settings.importance_sampling_cap,
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
