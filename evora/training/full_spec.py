"""What a trainer trains, as a typed spec with the same four operations whatever it is: a LoRA
over the model (`LoraSpec`) or the model's own matrices (`FullSpec`, full-weight GRPO).

    spec.peft_config()              # PEFT's config for the trainer to wrap the model in (None: none)
    spec.prepare(model)             # before training: which parameters take gradients
    spec.load(model, tensors, seed) # a saved state's trained tensors (None: a fresh start, from seed)
    spec.tensors(model)             # the trained tensors now, fp32 copies on the CPU
    spec.policy(model)              # what the engines sample the policy with (`Policy`)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from evora.lora import Tensors
from evora.training.rollouts import Policy


class Trained(Protocol):
    def peft_config(self) -> Any: ...

    def prepare(self, model: Any) -> None: ...

    def load(self, model: Any, tensors: Tensors | None, seed: int) -> None: ...

    def tensors(self, model: Any) -> Tensors: ...

    def policy(self, model: Any) -> Policy: ...


@dataclass(frozen=True)
class FullSpec:
    """Full-weight training of `matrices` (checkpoint names, `model.layers.0.mlp.down_proj.weight`:
    the run's selected modules, the matrices the engine workers keep in step); every other weight
    is frozen, as the engines' other weights never move."""

    matrices: tuple[str, ...]

    def peft_config(self) -> None:
        return None

    def prepare(self, model: Any) -> None:
        wanted = set(self.matrices)
        missing = sorted(wanted - {name for name, _ in model.named_parameters()})
        if missing:
            raise KeyError(f"full-weight training: the model has no parameter named {missing[0]}")
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name in wanted)

    def load(self, model: Any, tensors: Tensors | None, seed: int) -> None:
        if tensors is None:  # a fresh start: the model's own weights
            return
        with torch.no_grad():
            for name in self.matrices:
                model.get_parameter(name).copy_(tensors[name])

    def tensors(self, model: Any) -> Tensors:
        return {name: model.get_parameter(name).detach().float().cpu().clone() for name in self.matrices}

    def policy(self, model: Any) -> Policy:
        return Policy(weights=self.tensors(model))
