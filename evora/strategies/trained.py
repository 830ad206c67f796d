"""What the gradient strategies (sft, grpo) share: their state (an adapter, its optimizer's
state, the step) and the trainer they keep between generations, rebuilt from the state
after a restart."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from evora.lora import Tensors
from evora.lora.init import random_adapter
from evora.lora.keys import noise_key
from evora.strategies.protocol import StrategyContext, TrainingContext, clone_tensors


@dataclass
class TrainedState:
    STATE_VERSION: ClassVar[int] = 1
    adapter: Tensors
    optimizer: dict[str, Any] | None = None  # AdamW's state_dict; None before the first step
    step: int = 0


class TrainedAdapter:
    """Base of a gradient strategy: subclasses name `init_salt` and build their trainer."""

    state_type: ClassVar[type] = TrainedState
    init_salt: ClassVar[str]

    def __init__(self, cfg: Any, run_seed: int):
        self.cfg = cfg
        self.seed = run_seed
        self._trainer: Any = None  # kept between generations; rebuilt from the state after a restart

    def initial_state(self, context: StrategyContext) -> Any:  # a TrainedState here; a subclass's own
        # B = 0: the adapter starts as the base model (PEFT's convention); A seeded by the run.
        return TrainedState(random_adapter(context.layout, noise_key(context.seed, self.init_salt), None, 0.0))

    def center(self, state: Any) -> Tensors:
        return state.adapter

    def trainer_at(self, state: TrainedState, context: TrainingContext) -> Any:
        if self._trainer is None or self._trainer.step != state.step:
            self._trainer = self.build_trainer(state, context)
        return self._trainer

    def build_trainer(self, state: TrainedState, context: TrainingContext) -> Any:
        raise NotImplementedError

    @staticmethod
    def optimizer_copy(trainer: Any) -> dict[str, Any]:
        """The trainer's optimizer state, copied: its tensors change in place at the next step."""
        return copy.deepcopy(trainer.optimizer.state_dict())

    @classmethod
    def state_of(cls, trainer: Any) -> TrainedState:
        return TrainedState(clone_tensors(trainer.trained()), cls.optimizer_copy(trainer), trainer.step)
