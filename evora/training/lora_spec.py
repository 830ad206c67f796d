"""The LoRA a trainer adds to the base model (rank, alpha, target modules, layers, dropout):
one typed spec for every LoRA trainer (`LoraSFT`, `LoraGRPO`), turned into PEFT's
`LoraConfig` in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.lora.layout import AdapterLayout


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
