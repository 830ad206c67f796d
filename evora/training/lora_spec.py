"""The LoRA a trainer adds to the base model (rank, alpha, target modules, layers, dropout):
one typed spec for every LoRA trainer (`LoraSFT`, `GRPOTraining`), turned into PEFT's
`LoraConfig` in one place, with what GRPO does with it (`full_spec.Trained`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.training.rollouts import Policy


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    layers: tuple[int, ...] | None = None
    dropout: float = 0.0

    @classmethod
    def of_layout(cls, layout: AdapterLayout, dropout: float = 0.0) -> LoraSpec:
        """The spec of an adapter layout (its rank, alpha, resolved modules and layers)."""
        return cls(layout.rank, layout.alpha, tuple(layout.target_modules), layout.layers, dropout)

    def peft_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT takes any number: scaling = alpha / r
            target_modules=list(self.target_modules),
            layers_to_transform=list(self.layers) if self.layers else None,
            lora_dropout=self.dropout,
            task_type="CAUSAL_LM",
        )

    def prepare(self, model: Any) -> None:
        return None  # the trainer's PEFT wrapping (peft_config) freezes every other weight

    def load(self, model: Any, tensors: Tensors | None, seed: int) -> None:
        from peft import set_peft_model_state_dict
        from peft.tuners.lora import LoraLayer

        if tensors is not None:
            device = next(model.parameters()).device
            set_peft_model_state_dict(model, {k: v.to(device) for k, v in tensors.items()})
            return
        # a fresh adapter's A init from `seed`, not from whatever was seeded before wrapping
        torch.manual_seed(seed)
        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.reset_lora_parameters("default", True)

    def tensors(self, model: Any) -> Tensors:
        """The LoRA being trained, PEFT-named, fp32 copies on the CPU."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().float().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}

    def policy(self, model: Any) -> Policy:
        return Policy(adapter=self.tensors(model))
