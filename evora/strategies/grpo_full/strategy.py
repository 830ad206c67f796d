"""GRPO over the model's own matrices (`strategy=grpo_full`): the same TRL trainer and rollouts as
`strategy=grpo`, training the run's selected matrices instead of a LoRA over them, as the ES
paper's GRPO baselines do.

Where the weights are: the driver's trainer holds them with AdamW's moments (16 bytes a trained
weight); each step's rollouts carry them to the engine workers (`Policy.weights`, written into the
engines' own); and after each generation every worker's fp32 master copies are set to them, with
checksums compared, snapshotted every generation, and exported as es_full's are (model/ and
adapters/delta), through the full-weight machinery (`distributed/full_weights.py`). Its update is
the trained matrices themselves: a worker's copies become exactly the trainer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.strategies.full_weights import matrix_name
from evora.strategies.grpo.strategy import GroupRelativePolicyOptimization
from evora.strategies.master_weights import MasterWeights, start_copies
from evora.strategies.protocol import StrategyContext, TrainingContext, clone_tensors
from evora.training.full_spec import FullSpec, Trained
from evora.training.grpo import GRPOTraining


@dataclass
class TrainedWeightsState:
    STATE_VERSION: ClassVar[int] = 1
    weights: Tensors | None = None  # the trained matrices (checkpoint names, fp32); None: the model's own
    optimizer: dict[str, Any] | None = None  # AdamW's state_dict; None before the first step
    step: int = 0
    generation: int = 0  # generations trained: `weights` are the engines' after this many updates


@dataclass(frozen=True)
class WeightsUpdate:
    generation: int  # the generation it follows (0-based)
    weights: Tensors


class FullWeightGRPO(GroupRelativePolicyOptimization):
    state_type: ClassVar[type] = TrainedWeightsState

    def initial_state(self, context: StrategyContext) -> TrainedWeightsState:
        return TrainedWeightsState()

    def center(self, state: TrainedWeightsState) -> Tensors:
        return {}  # no adapter: the engines' own (trained) weights are the center

    def trains(self, context: TrainingContext) -> Trained:
        """What the trainer trains: the run's selected matrices."""
        return FullSpec(tuple(matrix_name(slot.name) for slot in context.layout.modules))

    def trained_tensors(self, state: TrainedWeightsState) -> Tensors | None:
        return state.weights

    def state_after(self, trainer: GRPOTraining, generation: int) -> TrainedWeightsState:
        optimizer = self.optimizer_copy(trainer)
        return TrainedWeightsState(clone_tensors(trainer.trained()), optimizer, trainer.step, generation + 1)

    # --- the engines' weights (MovesWeights) --------------------------------------------

    @property
    def snapshot_every(self) -> int:
        return 1  # the state holds the newest weights only: a worker never replays an older update

    @property
    def delta_rank(self) -> int:
        return int(self.cfg.delta_rank)

    @property
    def anchored(self) -> bool:
        return False

    def update_of(self, state: TrainedWeightsState, generation: int) -> WeightsUpdate:
        if state.weights is None or generation != state.generation - 1:
            held = state.generation
            raise ValueError(f"grpo_full holds the weights after generation {held}, not after {generation + 1}")
        return WeightsUpdate(generation, state.weights)

    def apply(self, master: MasterWeights, update: WeightsUpdate) -> float:
        """The master copies set to the trained matrices; returns the change's norm."""
        if update.generation != master.generation:
            raise ValueError(f"update of generation {update.generation} on weights of generation {master.generation}")
        squares = 0.0
        for name in sorted(master.tensors):
            weight, trained = master.tensors[name], update.weights[name].to(master.device)
            squares += float(torch.linalg.vector_norm(trained - weight, dtype=torch.float64)) ** 2
            weight.copy_(trained)
        master.generation += 1
        return math.sqrt(squares)

    def start_master(self, tensors: Tensors, transposed: frozenset[str] = frozenset()) -> MasterWeights:
        return start_copies(tensors, transposed, anchored=False)

    def master_bytes(self, layout: AdapterLayout) -> int:
        """A worker's fp32 master copies of the trained matrices."""
        return 4 * trained_weights(layout)

    def driver_bytes(self, layout: AdapterLayout, parameters: int) -> int:
        """The model in fp32 (4 bytes a weight), per trained weight its gradient and AdamW's two
        moments (12 more), and a second fp32 model for the KL term's reference where beta > 0."""
        return 4 * parameters * (1 + (self.cfg.beta > 0)) + 12 * trained_weights(layout)


def trained_weights(layout: AdapterLayout) -> int:
    return sum(slot.out_features * slot.in_features for slot in layout.modules)
