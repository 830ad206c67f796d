"""Genetic operators on LoRA adapters (tensor dicts in PEFT naming).

A LoRA module's update is the product B @ A, so A and B of one module always come from
the same parent: swapping A from one parent with B from another yields a product
neither parent had. Every operator is a pure function of its inputs and a seed.
"""

from __future__ import annotations

import random

import torch

from evora.lora import Tensors
from evora.lora.layout import layer_of
from evora.lora.noise import gaussian, noise_key
from evora.lora.resize import truncate_product

A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"


def _layer(module: str) -> int:
    """The module's layer index; -1 for a module outside the numbered layers."""
    layer = layer_of(module)
    return -1 if layer is None else layer


def module_pairs(tensors: Tensors) -> dict[str, tuple[str, str]]:
    """Module name -> (A key, B key), in the adapter's tensor order."""
    pairs: dict[str, tuple[str, str]] = {}
    for key in tensors:
        if key.endswith(A_SUFFIX):
            module = key[: -len(A_SUFFIX)]
            pairs[module] = (key, module + B_SUFFIX)
    return pairs


def _take(child: Tensors, parent: Tensors, pair: tuple[str, str]) -> None:
    for key in pair:
        child[key] = parent[key]


def _ordered(child: Tensors, like: Tensors) -> Tensors:
    return {key: child[key] for key in like}


def crossover_modules(first: Tensors, second: Tensors, seed: int) -> Tensors:
    """Module-wise uniform crossover: each module's (A, B) from one parent, by a fair coin."""
    rng = random.Random(noise_key(seed, "module-crossover"))
    child: Tensors = {}
    for pair in module_pairs(first).values():
        _take(child, first if rng.random() < 0.5 else second, pair)
    return _ordered(child, first)


def crossover_layers(first: Tensors, second: Tensors, seed: int) -> Tensors:
    """One-point crossover over layers: modules of layers before a random cut point from
    the first parent, the rest from the second. With one layer it takes a parent whole."""
    pairs = module_pairs(first)
    layers = sorted({_layer(m) for m in pairs})
    rng = random.Random(noise_key(seed, "layer-crossover"))
    cut = rng.randint(1, len(layers) - 1) if len(layers) > 1 else rng.randint(0, 1)
    early = set(layers[:cut])
    child: Tensors = {}
    for module, pair in pairs.items():
        _take(child, first if _layer(module) in early else second, pair)
    return _ordered(child, first)


def blend_pair(
    a1: torch.Tensor, b1: torch.Tensor, a2: torch.Tensor, b2: torch.Tensor, weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of rank r whose product is the best rank-r approximation (Eckart-Young) of
    weight * B1 A1 + (1 - weight) * B2 A2, from the thin factors (see lora.resize)."""
    left = torch.cat([weight * b1, (1 - weight) * b2], dim=1)  # out x 2r
    right = torch.cat([a1, a2], dim=0)  # 2r x in
    return truncate_product(left, right, a1.shape[0])


def crossover_blend(first: Tensors, second: Tensors, seed: int) -> Tensors:
    """Per module, a convex combination of the parents' updates B A with a random weight,
    brought back to rank r (see blend_pair); the adapter stays an exact rank-r LoRA."""
    rng = random.Random(noise_key(seed, "blend-crossover"))
    child: Tensors = {}
    for a_key, b_key in module_pairs(first).values():
        child[a_key], child[b_key] = blend_pair(first[a_key], first[b_key], second[a_key], second[b_key], rng.random())
    return _ordered(child, first)


CROSSOVERS = {"module": crossover_modules, "layer": crossover_layers, "blend": crossover_blend}


def mutate(parent: Tensors, seed: int, sigma: float, rate: float, scales: dict[str, float] | None = None) -> Tensors:
    """Gaussian mutation: each module is mutated with probability `rate`, both its A and B,
    by sigma (times the tensor's scale) times noise drawn from the seed and tensor name."""
    rng = random.Random(noise_key(seed, "mutated-modules"))
    scales = scales or {}
    child = dict(parent)
    for pair in module_pairs(parent).values():
        if rng.random() < rate:
            for key in pair:
                value = parent[key]
                child[key] = value + (sigma * scales.get(key, 1.0)) * gaussian(
                    noise_key(seed, "mutation", key), tuple(value.shape)
                )
    return child
