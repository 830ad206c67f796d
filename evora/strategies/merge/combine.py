"""A weighted combination of LoRA adapters, itself a LoRA of the run's layout.

With weights w_i (per adapter, or per adapter and layer) and the sources' factors A_i, B_i
(`sources.py`, already at the run's scale s):

- combine=concat (the default) is exact: A = [A_1; ...; A_n] and B = [w_1 B_1, ..., w_n B_n]
  side by side, so s B A = sum_i w_i s B_i A_i, the weighted sum of the sources' deltas. It takes
  rank sum_i r_i; lora.rank may be larger (the extra directions are zeros).
- combine=lorahub is LoraHub's element-wise merge (Huang et al. 2023): A = sum_i w_i A_i and
  B = sum_i w_i B_i at the sources' rank, whose delta s (sum_i w_i B_i)(sum_j w_j A_j) carries the
  cross terms w_i w_j B_i A_j: an approximation of the weighted sum, which LoraHub searches as it
  is, in the rank of one adapter.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from evora.lora.layout import layer_of
from evora.strategies.protocol import Tensors

A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"


def modules(source: Tensors) -> list[str]:
    """The module prefixes of an adapter's tensors, in their order."""
    return [name[: -len(A_SUFFIX)] for name in source if name.endswith(A_SUFFIX)]


def layer_groups(source: Tensors) -> dict[str, int]:
    """Module prefix -> its weight group under granularity=layer: the layers in order, then
    one group for modules outside the repeated layers."""
    prefixes = modules(source)
    layers = sorted({layer for layer in map(layer_of, prefixes) if layer is not None})
    index = {layer: i for i, layer in enumerate(layers)}
    return {p: index.get(layer_of(p), len(layers)) for p in prefixes}  # type: ignore[arg-type]


def group_count(source: Tensors, granularity: str) -> int:
    return 1 if granularity == "adapter" else len(set(layer_groups(source).values()))


def combine(sources: Sequence[Tensors], weights: np.ndarray, rank: int, how: str) -> Tensors:
    """The adapter that `weights` ([sources, groups]; one group: per adapter) make of `sources`."""
    groups = layer_groups(sources[0]) if weights.shape[1] > 1 else None
    out: Tensors = {}
    for prefix in modules(sources[0]):
        column = weights[:, groups[prefix]] if groups is not None else weights[:, 0]
        factors = [(s[prefix + A_SUFFIX], s[prefix + B_SUFFIX], float(w)) for s, w in zip(sources, column)]
        a, b = (concat if how == "concat" else elementwise)(factors, rank)
        out[prefix + A_SUFFIX], out[prefix + B_SUFFIX] = a, b
    return out


def concat(factors: list[tuple[torch.Tensor, torch.Tensor, float]], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.zeros(rank, factors[0][0].shape[1])
    b = torch.zeros(factors[0][1].shape[0], rank)
    start = 0
    for source_a, source_b, w in factors:
        end = start + source_a.shape[0]
        a[start:end] = source_a
        b[:, start:end] = source_b * w
        start = end
    return a, b


def elementwise(
    factors: list[tuple[torch.Tensor, torch.Tensor, float]], rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.zeros(rank, factors[0][0].shape[1])
    b = torch.zeros(factors[0][1].shape[0], rank)
    for source_a, source_b, w in factors:
        r = source_a.shape[0]
        a[:r] += source_a * w
        b[:, :r] += source_b * w
    return a, b
