"""The shape of an adapter: which modules get LoRA, their sizes, rank and scale.

Tensor names follow PEFT (`base_model.model.<module>.lora_A.weight`, [rank, in];
`...lora_B.weight`, [out, rank]) so adapters load in PeftModel and vLLM as they are.
Modules are named as the model's checkpoint names their weights (docs/architecture.md,
"Layouts"): a mixture's experts one by one (`mlp.experts.3.down_proj`), the way vLLM's MoE
LoRA and PEFT's conversion to fused expert parameters read them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from evora.errors import ConfigError

_LAYER_INDEX = re.compile(r"\.(\d+)\.")
PEFT_PREFIX = "base_model.model."
AUTO = "auto"  # lora.target_modules=auto: every projection of the model's repeated layers

LINEAR, CONV1D, EXPERT = "linear", "conv1d", "expert"


class Adaptable(NamedTuple):
    """A weight LoRA can adapt: [out, in] as the layer computes it, and how it is stored."""

    out_features: int
    in_features: int
    kind: str = LINEAR  # linear: nn.Linear; conv1d: transformers' Conv1D, stored [in, out]; expert: one of a mixture's


@dataclass(frozen=True)
class ModuleSlot:
    name: str  # module path in the checkpoint, e.g. model.layers.1.mlp.down_proj
    layer: int | None
    in_features: int
    out_features: int
    kind: str = LINEAR

    @property
    def a_key(self) -> str:
        return f"{PEFT_PREFIX}{self.name}.lora_A.weight"

    @property
    def b_key(self) -> str:
        return f"{PEFT_PREFIX}{self.name}.lora_B.weight"

    @property
    def stored_transposed(self) -> bool:
        """The checkpoint stores the weight [in, out] (GPT-2's Conv1D; PEFT's fan_in_fan_out)."""
        return self.kind == CONV1D


@dataclass(frozen=True)
class AdapterLayout:
    modules: tuple[ModuleSlot, ...]
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # resolved suffixes (never "auto")
    layers: tuple[int, ...] | None
    base_model: str  # written to adapter_config.json as base_model_name_or_path

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def fan_in_fan_out(self) -> bool:
        return any(slot.stored_transposed for slot in self.modules)

    @property
    def has_experts(self) -> bool:
        return any(slot.kind == EXPERT for slot in self.modules)

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


def suffix_of(module_name: str) -> str:
    return module_name.rsplit(".", 1)[-1]


def auto_targets(adaptable: dict[str, Adaptable]) -> tuple[str, ...]:
    """The attention and MLP projections: every adaptable module inside the model's repeated
    layers (embeddings and the output head are outside them), in model order."""
    return tuple(dict.fromkeys(suffix_of(name) for name in adaptable if layer_of(name) is not None))


def resolve_targets(target_modules: str | Sequence[str], adaptable: dict[str, Adaptable]) -> tuple[str, ...]:
    """Module suffixes; `auto`, alone or in a list (a PBT module set), stands for auto_targets."""
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    if AUTO in names:
        return auto_targets(adaptable)
    return tuple(names)


def build_layout(
    adaptable: dict[str, Adaptable] | dict[str, tuple[int, int]],
    *,
    rank: int,
    alpha: float,
    target_modules: str | Sequence[str],
    layers: Sequence[int] | None,
    base_model: str,
) -> AdapterLayout:
    """Select the target modules (suffixes, or `auto`) from the model's adaptable modules
    (module name -> Adaptable, or (out, in) for a plain linear layer)."""
    modules = {name: Adaptable(*shape) for name, shape in adaptable.items()}
    targets = resolve_targets(target_modules, modules)
    wanted_layers = None if layers is None else set(layers)
    slots = [
        ModuleSlot(name, layer_of(name), shape.in_features, shape.out_features, shape.kind)
        for name, shape in modules.items()
        if suffix_of(name) in targets and (wanted_layers is None or layer_of(name) in wanted_layers)
    ]
    if not slots:
        raise ConfigError(no_match(targets, layers, modules))
    return AdapterLayout(
        tuple(slots),
        rank,
        float(alpha),
        targets,
        None if layers is None else tuple(sorted(layers)),
        base_model,
    )


def no_match(targets: Sequence[str], layers: Sequence[int] | None, modules: dict[str, Adaptable]) -> str:
    real = ", ".join(auto_targets(modules)) or "none"
    return (
        f"lora.target_modules={list(targets)}: no adaptable module of the model matches in layers "
        f"{list(layers) if layers is not None else 'all'}; the model's are: {real} "
        f"(lora.target_modules={AUTO} takes them all)"
    )
