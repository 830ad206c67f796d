"""Initial adapters: A and B drawn with given scales, or read from a PEFT folder.

PEFT's default (B = 0) makes the adapter a no-op; ES perturbs B first-order only while
A is non-zero, so A defaults to a 1/sqrt(in_features) scale (the ES-over-LoRA notes draw both).
"""

from __future__ import annotations

import math

import torch

from evora.errors import ConfigError
from evora.lora.layout import AdapterLayout
from evora.lora.noise import gaussian, noise_key
from evora.lora.peft_io import load_adapter_tensors


def random_adapter(layout: AdapterLayout, seed: int, a_std: float | None, b_std: float) -> dict[str, torch.Tensor]:
    tensors = {}
    for slot in layout.modules:
        std_a = a_std if a_std is not None else 1.0 / math.sqrt(slot.in_features)
        shapes = {
            slot.a_key: ((layout.rank, slot.in_features), std_a),
            slot.b_key: ((slot.out_features, layout.rank), b_std),
        }
        for name, (shape, std) in shapes.items():
            tensors[name] = gaussian(noise_key(seed, "init", name), shape) * std if std > 0 else torch.zeros(shape)
    return tensors


def adapter_from_path(layout: AdapterLayout, path: str) -> dict[str, torch.Tensor]:
    loaded = load_adapter_tensors(path)
    for name, shape in layout.shapes().items():
        if name not in loaded:
            raise ConfigError(
                f'strategy.init_path="{path}": adapter has no tensor {name}; '
                "its rank, target modules or layers differ from lora.*"
            )
        if tuple(loaded[name].shape) != shape:
            raise ConfigError(
                f'strategy.init_path="{path}": {name} has shape {tuple(loaded[name].shape)}, the layout needs {shape}'
            )
    return {name: loaded[name].clone() for name in layout.shapes()}
