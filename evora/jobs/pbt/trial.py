"""One PBT member as a Ray Tune trainable: train, score on the engine workers, report with a
checkpoint; repeat until the last generation. Tune's dict encoding of a member (its
hyperparameters, target modules joined by commas) becomes a typed `LoraSpec` here, once."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from evora.config.schema import RunConfig
from evora.distributed.worker_spec import engine_spec, load_tokenizer, resolve_task
from evora.lora import Tensors
from evora.lora.keys import noise_key
from evora.lora.layout import Adaptable, AdapterLayout, build_layout
from evora.lora.peft_io import load_adapter_tensors, save_adapter
from evora.lora.resize import resize_adapter
from evora.strategies.pbt.space import KEYS, member_id, modules_of
from evora.tasks import Splits, Task
from evora.tasks.fitness import parse_fitness
from evora.tasks.prompts import PromptRenderer
from evora.training.lora_sft import LoraSFT, Pair, TrainSettings
from evora.training.lora_spec import LoraSpec


@dataclass(frozen=True)
class TrialContext:
    run: RunConfig
    model_path: str
    service: str  # name of the EvaluationService actor
    shapes: dict[str, Adaptable]  # adaptable module name -> shape and kind
    resolved: tuple[Task, Splits] | None = None  # the run plan's task and splits; None: built from the config


def layout_for(hp: dict[str, Any], context: TrialContext) -> AdapterLayout:
    return build_layout(
        context.shapes,
        rank=hp["rank"],
        alpha=hp["rank"] * hp["alpha_multiplier"],
        target_modules=modules_of(hp["target_modules"]),
        layers=context.run.lora.layers,
        base_model=context.model_path,
    )


def lora_of(hp: dict[str, Any], context: TrialContext) -> LoraSpec:
    """The member's LoRA from Tune's encoding (an `auto` module option resolved for PEFT)."""
    layout = layout_for(hp, context)
    layers = tuple(context.run.lora.layers) if context.run.lora.layers else None
    return LoraSpec(layout.rank, layout.alpha, tuple(layout.target_modules), layers, hp["dropout"])


@dataclass
class Start:
    """What a trial starts from: nothing, its own checkpoint, or another trial's (exploit)."""

    adapter: Tensors | None = None
    optimizer: dict | None = None
    step: int = 0
    generation: int = 0
    parent: str = ""
    member: str = ""  # kept on a resume; a new member (fresh or cloned) is named from its hyperparameters


def starting_point(folder: Path | None, hp: dict[str, Any], trial_id: str, context: TrialContext) -> Start:
    if folder is None:
        return Start()
    meta = torch.load(folder / "trainer.pt", map_location="cpu", weights_only=True)
    adapter = load_adapter_tensors(folder / "adapter")
    old, new = layout_for(meta["hp"], context), layout_for(hp, context)
    if (old.rank, old.scale, old.target_modules) != (new.rank, new.scale, new.target_modules):
        adapter = resize_adapter(adapter, old, new, noise_key(context.run.seed, "pbt-resize", trial_id, meta["step"]))
    if meta["trial"] == trial_id:  # its own checkpoint: a resume, the same member
        return Start(adapter, meta["optimizer"], meta["step"], meta["generation"], meta["parent"], meta["member"])
    return Start(adapter, meta["optimizer"], meta["step"], meta["generation"], parent=meta["member"])


def training_pairs(
    run: RunConfig, model_path: str, resolved: tuple[Task, Splits] | None = None
) -> tuple[list[Pair], int]:
    task, splits = resolved or resolve_task(run.task, run.seed)
    tokenizer = load_tokenizer(engine_spec(run, model_path))
    renderer = PromptRenderer(tokenizer, run.task.prompt_format, task.plain_template, run.task.system_prompt)
    pairs = [(renderer.ids(e), renderer.target_ids(e)) for e in splits.train]
    return pairs, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def trainer_for(context: TrialContext, hp: dict[str, Any], start: Start, trial_id: str) -> LoraSFT:
    """The member's trainer, from where it starts (fresh, its own checkpoint, or a clone)."""
    run, space = context.run, context.run.strategy
    pairs, pad_id = training_pairs(run, context.model_path, context.resolved)
    settings = TrainSettings(
        learning_rate=hp["learning_rate"],
        batch_size=space.batch_size,
        gradient_accumulation=space.gradient_accumulation,
        weight_decay=space.weight_decay,
        max_grad_norm=space.max_grad_norm,
        warmup_ratio=space.warmup_ratio,
        total_steps=run.generations * space.steps_per_generation,
        seed=noise_key(run.seed, "pbt-trial", trial_id),
    )
    device = "cuda" if run.hardware.trial_gpus > 0 else "cpu"
    return LoraSFT(
        context.model_path,
        lora_of(hp, context),
        settings,
        pairs,
        pad_id,
        start.adapter,
        start.optimizer,
        start.step,
        device,
    )


@dataclass(frozen=True)
class Member:
    """Who reports: the trial, the member it trains, its parent and hyperparameters."""

    trial: str
    member: str
    parent: str
    hp: dict[str, Any]


def report(who: Member, trainer: LoraSFT, adapter: Tensors, layout: AdapterLayout, result: dict[str, Any]) -> None:
    """One generation's result to Tune, with the checkpoint a resume or an exploit starts from."""
    generation = result["generation"]
    with tempfile.TemporaryDirectory() as folder:
        save_adapter(Path(folder) / "adapter", adapter, layout)
        meta = {"trial": who.trial, "member": who.member, "parent": who.parent, "generation": generation, "hp": who.hp}
        torch.save({**meta, **trainer.state()}, Path(folder) / "trainer.pt")
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))


def pbt_trial(config: dict[str, Any], context: TrialContext) -> None:
    """One member: train, score, report with a checkpoint; repeat until the last generation."""
    run, space = context.run, context.run.strategy
    hp = {key: config[key] for key in KEYS}
    trial_id = tune.get_context().get_trial_id()
    checkpoint = tune.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else tempfile.TemporaryDirectory() as folder:
        start = starting_point(Path(folder) if checkpoint else None, hp, trial_id, context)
    trainer = trainer_for(context, hp, start, trial_id)
    service: Any = ray.get_actor(context.service)
    layout, fitness = layout_for(hp, context), parse_fitness(space.fitness)
    who = Member(trial_id, start.member or member_id(hp, start.generation), start.parent, hp)
    generation = start.generation
    while generation < run.generations:
        trained_before = trainer.tokens_trained
        loss = trainer.train(space.steps_per_generation)
        generation += 1
        adapter = trainer.trained()
        metrics: dict[str, float] = ray.get(service.metrics.remote(adapter, layout, space.eval_split))
        result = {
            "fitness": fitness(metrics),
            **metrics,
            "loss": loss,
            "generation": generation,
            "member": who.member,
            "parent": who.parent,
            "step": trainer.step,
            "tokens_trained": trainer.tokens_trained - trained_before,
        }
        report(who, trainer, adapter, layout, result)
