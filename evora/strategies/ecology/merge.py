"""Merging two organelles: their updates averaged, brought back to rank r.

Each module's update is dW = scale x B @ A (one scale for both). The merge's update is the
best rank-r approximation (Eckart-Young) of (dW_1 + dW_2) / 2: the GA's blend of two
parents at weight 1/2, computed on the thin factors, never the full matrix.
"""

from __future__ import annotations

from evora.lora import Tensors
from evora.strategies.ga.operators import blend_pair, module_pairs


def merge_adapters(first: Tensors, second: Tensors) -> Tensors:
    merged: Tensors = {}
    for a_key, b_key in module_pairs(first).values():
        merged[a_key], merged[b_key] = blend_pair(first[a_key], first[b_key], second[a_key], second[b_key], 0.5)
    return {k: merged[k] for k in first}  # the parents' tensor order
