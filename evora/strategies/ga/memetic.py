"""The memetic GA (the GPT-2 GA document's "GA proposes, gradient refines"): every
`refine_every` generations the elite gets `refine_steps` gradient steps (SFT on the
reference answers, or GRPO on the task's reward) and the refined adapter replaces it in
the parent pool (Lamarckian: offspring inherit what it learned). The steps run on the
driver through the gradient strategies' own code, each refinement with a fresh optimizer
and its own seed; their tokens are the run's compute like any other."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from evora.lora.keys import noise_key
from evora.strategies.ga.config import GAConfig
from evora.strategies.grpo.config import GRPOConfig
from evora.strategies.grpo.strategy import GroupRelativePolicyOptimization
from evora.strategies.protocol import GradientStrategy, Told, TrainingContext
from evora.strategies.sft.config import SFTConfig
from evora.strategies.sft.strategy import SupervisedFineTuning
from evora.strategies.trained import TrainedState

REFINED = "refine"


def refiner(cfg: GAConfig, seed: int) -> GradientStrategy:
    """The gradient strategy a refinement runs."""
    if cfg.refine == "sft":
        sft = SFTConfig(learning_rate=cfg.refine_learning_rate, steps_per_generation=cfg.refine_steps)
        return SupervisedFineTuning(sft, seed)
    grpo = GRPOConfig(
        learning_rate=cfg.refine_learning_rate,
        steps_per_generation=cfg.refine_steps,
        num_generations=cfg.refine_group_size,
    )
    return GroupRelativePolicyOptimization(grpo, seed)


def refine_elite(cfg: GAConfig, run_seed: int, state: Any, generation: int, context: TrainingContext) -> Told | None:
    """After generation `generation` (0-based): the state with its elite refined, or None when not due."""
    if cfg.refine == "none" or (generation + 1) % cfg.refine_every:
        return None
    strategy = refiner(cfg, noise_key(run_seed, "ga-refine", generation))
    # each refinement is a run of its own: a fresh optimizer whose schedule spans its steps
    told = strategy.improve(TrainedState(state.pool[0]), generation, replace(context, planned_steps=cfg.refine_steps))
    refined_id = f"{state.ids[0]}+{cfg.refine}{generation + 1}"
    new = replace(state, pool=[told.state.adapter, *state.pool[1:]], ids=[refined_id, *state.ids[1:]])
    record = {
        "generation": generation + 1,
        "id": refined_id,
        "op": REFINED,
        "parents": [state.ids[0]],
        "fitness": state.fitness[0],  # before refinement; the refined elite is scored next generation
        "steps": int(told.stats.get("steps", cfg.refine_steps)),
        "survived": True,
    }
    stats = {f"refine_{k}": v for k, v in told.stats.items() if k in ("loss", "reward", "steps")}
    return Told(new, stats, [record], told.spend)
