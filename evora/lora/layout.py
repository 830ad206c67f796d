"""The shape of an adapter: which modules get LoRA, their sizes, rank and scale.

Tensor names follow PEFT (`base_model.model.<module>.lora_A.weight`, [rank, in];
`...lora_B.weight`, [out, rank]) so adapters load in PeftModel and vLLM as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evora.errors import ConfigError

_LAYER_INDEX = re.compile(r"\.(\d+)\.")
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class ModuleSlot:
    name: str  # module path in the model, e.g. model.layers.1.mlp.down_proj
    layer: int | None
    in_features: int
    out_features: int

    @property
    def a_key(self) -> str:
        return f"{PEFT_PREFIX}{self.name}.lora_A.weight"

    @property
    def b_key(self) -> str:
        return f"{PEFT_PREFIX}{self.name}.lora_B.weight"


@dataclass(frozen=True)
class AdapterLayout:
    modules: tuple[ModuleSlot, ...]
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    layers: tuple[int, ...] | None
    base_model: str  # written to adapter_config.json as base_model_name_or_path

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Tensor name -> shape, in a fixed order (modules in model order, A before B)."""
        out: dict[str, tuple[int, int]] = {}
        for slot in self.modules:
            out[slot.a_key] = (self.rank, slot.in_features)
            out[slot.b_key] = (slot.out_features, self.rank)
        return out

    def num_parameters(self) -> int:
        return sum(a * b for a, b in self.shapes().values())


def layer_of(module_name: str) -> int | None:
    match = _LAYER_INDEX.search(module_name)
    return int(match.group(1)) if match else None


def build_layout(
    linear_shapes: dict[str, tuple[int, int]],
    *,
    rank: int,
    alpha: float,
    target_modules: list[str] | tuple[str, ...],
    layers: list[int] | tuple[int, ...] | None,
    base_model: str,
) -> AdapterLayout:
    """Select the target modules from `linear_shapes` (module name -> (out, in))."""
    wanted_layers = None if layers is None else set(layers)
    slots = []
    for name, (out_features, in_features) in linear_shapes.items():
        if name.rsplit(".", 1)[-1] not in target_modules:
            continue
        layer = layer_of(name)
        if wanted_layers is not None and layer not in wanted_layers:
            continue
        slots.append(ModuleSlot(name, layer, in_features, out_features))
    if not slots:
        raise ConfigError(
            f"lora.target_modules={list(target_modules)}: no linear module of the model matches"
            f" in layers {layers if layers is not None else 'all'}; model modules end in: "
            + ", ".join(sorted({n.rsplit(".", 1)[-1] for n in linear_shapes}))
        )
    return AdapterLayout(
        tuple(slots),
        rank,
        float(alpha),
        tuple(target_modules),
        None if layers is None else tuple(sorted(layers)),
        base_model,
    )


def linear_shapes_of_model(
    model_path: str, *, revision: str | None = None, trust_remote_code: bool = False
) -> dict[str, tuple[int, int]]:
    """Module name -> (out, in) of every nn.Linear, from the model's config alone (meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, revision=revision, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return {
        name: tuple(module.weight.shape)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    }
