"""RandOpt, iterated (Gan and Isola 2026, "Neural Thickets: Diverse Task Experts Are Dense Around
Pretrained Weights", and its iterative repository): each round draws N random perturbations of
the model, keeps the top K by the task's fitness as an ensemble, and distils the ensemble's
answers into one model with the SFT baseline's trainer; the next round perturbs that model.

Here the model is a LoRA adapter: a perturbation is the round's adapter plus sigma times a
seeded Gaussian (candidates travel as seeds, as ES's do), and the distilled model is the
adapter trained on the ensemble's completions (`ensemble.py`). `perturbation=eggroll` perturbs
the weights instead, as the paper does, by EGGROLL's low-rank sigma E (E = B A / sqrt(r), B and A
seeded Gaussians) on each target matrix: the adapter's last r rank slots, zero in the round's
adapter, carry it, so a candidate is still one LoRA, s B' A' = s B_c A_c + sigma E. Zero slots
stay zero under distillation (both factors zero: no gradient, and AdamW keeps zeros at zero).

A round is a generation of the run: `tell` keeps the ensemble's completions of the round's
prompts, `refine` (on the driver, right after) votes, picks the completions to distil and
trains. Held-out evaluations score the single distilled model, as the repository's accuracy is
measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from evora.errors import ConfigError
from evora.lora.layout import ModuleSlot
from evora.lora.noise import device_of, gaussian, in_parallel, noise_key, perturbed_adapter, tensors_to
from evora.strategies.adapter_init import initial_adapter, noise_scales
from evora.strategies.protocol import (
    CandidateSpec,
    GenerationResults,
    StrategyContext,
    Tensors,
    Told,
    TrainingContext,
    clone_tensors,
)
from evora.strategies.randopt.config import RandOptConfig
from evora.strategies.randopt.ensemble import targets, top_k, vote
from evora.strategies.sft.config import SFTConfig
from evora.strategies.sft.strategy import SupervisedFineTuning
from evora.strategies.trained import TrainedState

SALT = "randopt-sft"


@dataclass
class RandOptState:
    STATE_VERSION: ClassVar[int] = 1
    center: Tensors  # the round's model: what the perturbations are drawn around, and what is exported
    start: Tensors  # the starting adapter (distil_from=start trains from it every round)
    scales: dict[str, float]  # sigma's multiplier per tensor (noise_scale=per_layer); empty: uniform
    # The last tell's ensemble on its prompts, for refine: {"example", "completions", "correct"}, members in rank order.
    ensemble: list[dict[str, Any]] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)  # distilled so far: {"example", "completion"}
    step: int = 0
    modules: list[str] = field(default_factory=list)  # the adapter's modules (perturbation=eggroll's matrices)
    lora_scale: float = 1.0  # the adapter's alpha / rank


@dataclass(frozen=True)
class RandOptPayload:
    generation: int
    center: Tensors
    scales: dict[str, float]
    modules: tuple[str, ...] = ()
    lora_scale: float = 1.0


class RandOpt:
    state_type: ClassVar[type] = RandOptState

    def __init__(self, cfg: RandOptConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    @property
    def refines(self) -> bool:
        return True  # every round distils

    @property
    def keeps_texts(self) -> bool:
        return True  # the ensemble's completions are what it distils

    def initial_state(self, context: StrategyContext) -> RandOptState:
        start = clone_tensors(initial_adapter(self.cfg, context))
        modules = [slot.name for slot in context.layout.modules]
        if self.cfg.perturbation == "eggroll":
            start = self.cleared(start, modules)
        return RandOptState(
            clone_tensors(start),
            start,
            noise_scales(self.cfg, context),
            modules=modules,
            lora_scale=context.layout.scale,
        )

    def cleared(self, adapter: Tensors, modules: list[str]) -> Tensors:
        """The adapter with its last perturbation_rank slots zero (perturbation=eggroll's): a random
        start's are cleared; an adapter from strategy.init_path must have them zero already."""
        r = self.cfg.perturbation_rank
        for module in modules:
            slot = ModuleSlot(module, None, 0, 0)
            a, b = adapter[slot.a_key], adapter[slot.b_key]
            if self.cfg.init == "path" and (a[-r:].any() or b[:, -r:].any()):
                raise ConfigError(
                    f'strategy.init_path="{self.cfg.init_path}": {module} uses the last {r} rank slots, which '
                    f"strategy.perturbation=eggroll keeps for the perturbation: pad the adapter with {r} zero slots "
                    "to lora.rank, or use perturbation=lora"
                )
            a[-r:], b[:, -r:] = 0.0, 0.0
        return adapter

    def ask(self, state: RandOptState, generation: int) -> tuple[list[CandidateSpec], RandOptPayload]:
        specs = [CandidateSpec(generation, i, member=i) for i in range(self.cfg.population)]
        payload = RandOptPayload(generation, state.center, state.scales, tuple(state.modules), state.lora_scale)
        return specs, payload

    def payload_to(self, payload: Any, device: str) -> Any:
        if not isinstance(payload, RandOptPayload):
            return payload
        return replace(payload, center=tensors_to(payload.center, device))

    def materialise(self, payload: RandOptPayload, spec: CandidateSpec) -> Tensors:
        if self.cfg.perturbation == "eggroll":
            return self.low_rank_perturbed(payload, spec)
        sigma, scales = self.cfg.sigma, payload.scales
        return perturbed_adapter(
            payload.center, self.run_seed, spec.generation, spec.member, lambda k: sigma * scales.get(k, 1.0)
        )

    def low_rank_perturbed(self, payload: RandOptPayload, spec: CandidateSpec) -> Tensors:
        """The round's adapter with sigma E_m of each matrix in its last r slots (B scaled by
        sigma / (sqrt(r) * the adapter's scale), so that the LoRA adds sigma B_m A_m / sqrt(r))."""
        r = self.cfg.perturbation_rank

        def one(module: str) -> Tensors:
            slot = ModuleSlot(module, None, 0, 0)
            a, b = payload.center[slot.a_key].clone(), payload.center[slot.b_key].clone()
            sigma = self.cfg.sigma * payload.scales.get(slot.b_key, 1.0)
            key = (self.run_seed, "randopt-eggroll", spec.generation, spec.member, module)
            a[-r:] = gaussian(noise_key(*key, "A"), (r, a.shape[1]), a.device)
            b[:, -r:] = gaussian(noise_key(*key, "B"), (b.shape[0], r), b.device) * (
                sigma / (math.sqrt(r) * payload.lora_scale)
            )
            return {slot.a_key: a, slot.b_key: b}

        out = dict(payload.center)
        for perturbed in in_parallel(one, list(payload.modules), device_of(payload.center)):
            out |= perturbed
        return out

    def tell(self, state: RandOptState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        if results.texts is None:
            raise ValueError("strategy=randopt: the generation's results carry no completion texts")
        rows = top_k(results.fitness, self.cfg.top_k)
        ensemble = [
            {
                "example": int(example),
                "completions": [results.texts[row][column] for row in rows],
                "correct": [bool(results.correct[row, column]) for row in rows],
            }
            for column, example in enumerate(results.prompt_indices)
        ]
        fitness = results.fitness
        stats = {"fitness_mean": float(np.mean(fitness)), "top_k_fitness": float(np.mean(fitness[rows]))}
        return Told(replace(state, ensemble=ensemble, step=state.step + 1), stats)

    def refine(self, state: RandOptState, generation: int, context: TrainingContext) -> Told:
        """The ensemble's vote on each prompt, and the round's model distilled from its completions."""
        answer = context.answer
        if answer is None and self.cfg.targets == "vote":
            raise ConfigError(
                "strategy.targets=vote: the task gives no canonical answers to vote on; use targets=correct"
            )
        chosen, right = [], 0
        for entry in state.ensemble:
            example = entry["example"]
            answers = [answer(c, example) if answer is not None else None for c in entry["completions"]]
            voted = vote(answers)
            right += voted.member is not None and entry["correct"][voted.member]
            picked = targets(entry["completions"], answers, entry["correct"], self.cfg.targets, self.cfg.per_prompt)
            chosen += [{"example": example, "completion": text} for text in picked]
        examples = unique([*state.examples, *chosen]) if self.cfg.cumulative else chosen
        stats = {"distil_examples": float(len(examples))}
        if answer is not None:  # the vote's accuracy on the round's prompts, where the task's answers can be counted
            stats["ensemble_accuracy"] = right / max(len(state.ensemble), 1)
        if not examples:
            return Told(replace(state, ensemble=[], examples=examples), {**stats, "distil_steps": 0.0})
        told = self.distil(
            state.center if self.cfg.distil_from == "current" else state.start, examples, generation, context
        )
        stats |= {"distil_steps": told.stats["steps"], "distil_loss": told.stats["loss"]}
        distilled = replace(state, center=told.state.adapter, ensemble=[], examples=examples)
        return Told(distilled, stats, spend=told.spend)

    def distil(
        self, adapter: Tensors, examples: list[dict[str, Any]], generation: int, context: TrainingContext
    ) -> Told:
        """`sft_epochs` passes of the SFT trainer (a fresh AdamW) over the examples, their
        completions as the targets."""
        cfg = self.cfg
        steps = max(1, math.ceil(cfg.sft_epochs * len(examples) / cfg.sft_batch_size))
        sft = SFTConfig(learning_rate=cfg.sft_learning_rate, steps_per_generation=steps, batch_size=cfg.sft_batch_size)
        trainer = SupervisedFineTuning(sft, noise_key(self.run_seed, SALT, generation))
        train = tuple(replace(context.train[e["example"]], target=e["completion"]) for e in examples)
        return trainer.improve(TrainedState(adapter), generation, replace(context, train=train, planned_steps=steps))

    def center(self, state: RandOptState) -> Tensors:
        return state.center


def unique(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The examples without repeats of a (prompt, completion), in first-seen order."""
    return list({(e["example"], e["completion"]): e for e in examples}.values())
