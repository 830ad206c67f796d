"""Changing an adapter's rank, scale or modules while keeping what it learned.

A module's update is dW = scale * B @ A (scale = alpha / rank). Shrinking the rank keeps
the best rank-r' approximation of dW (truncated SVD, Eckart-Young); growing it pads B
with zero columns and A with fresh rows, so dW is unchanged and the new directions can
still learn (their B gradient is not zero). Everything works on the thin factors: the
out x in matrix is never formed.
"""

from __future__ import annotations

import math

import torch

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.lora.noise import gaussian, noise_key


def truncate_product(left: torch.Tensor, right: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) with B @ A the best rank-`rank` approximation of left @ right, where left is
    out x k and right k x in (QR of both factors, then an SVD of a k x k matrix)."""
    q_left, r_left = torch.linalg.qr(left.double())
    q_right, r_right = torch.linalg.qr(right.double().T)
    u, s, vh = torch.linalg.svd(r_left @ r_right.T)
    keep = min(rank, s.shape[0])
    root = s[:keep].sqrt()
    b = (q_left @ u[:, :keep]) * root
    a = root[:, None] * (vh[:keep] @ q_right.T)
    if keep < rank:  # fewer singular values than the rank asked for: pad with zeros
        a = torch.cat([a, a.new_zeros(rank - keep, a.shape[1])])
        b = torch.cat([b, b.new_zeros(b.shape[0], rank - keep)], dim=1)
    return a.to(left.dtype), b.to(left.dtype)


def resize_adapter(tensors: Tensors, source: AdapterLayout, target: AdapterLayout, seed: int) -> Tensors:
    """`tensors` (laid out as `source`) as an adapter laid out as `target`, with the same
    update dW on every module both have; modules new to `target` start at dW = 0."""
    out: Tensors = {}
    have = {slot.name: slot for slot in source.modules}
    for slot in target.modules:
        old = have.get(slot.name)
        if old is None:
            out[slot.a_key] = gaussian(
                noise_key(seed, "resize", slot.a_key), (target.rank, slot.in_features)
            ) / math.sqrt(slot.in_features)
            out[slot.b_key] = torch.zeros(slot.out_features, target.rank)
            continue
        a, b = tensors[old.a_key].float(), tensors[old.b_key].float()
        ratio = source.scale / target.scale  # keeps scale * B @ A under the new scale
        if target.rank < source.rank:
            out[slot.a_key], out[slot.b_key] = truncate_product(b * ratio, a, target.rank)
        else:
            extra = target.rank - source.rank
            fresh = gaussian(noise_key(seed, "resize", slot.a_key), (extra, slot.in_features)) / math.sqrt(
                slot.in_features
            )
            out[slot.a_key] = torch.cat([a, fresh])
            out[slot.b_key] = torch.cat([b * ratio, torch.zeros(slot.out_features, extra)], dim=1)
    return out


def low_rank_delta(deltas: dict[str, torch.Tensor], layout: AdapterLayout) -> tuple[Tensors, float]:
    """A PEFT adapter (laid out as `layout`) whose scale * B @ A is, for every module, the best
    rank-`layout.rank` approximation of its full update `deltas[module]` (truncated SVD,
    Eckart-Young), and the relative Frobenius error of the whole approximation."""
    out: Tensors = {}
    dropped, total = 0.0, 0.0
    for slot in layout.modules:
        u, s, vh = torch.linalg.svd(deltas[slot.name].double(), full_matrices=False)
        keep = min(layout.rank, s.shape[0])
        root = s[:keep].sqrt()
        b = (u[:, :keep] * root) / layout.scale
        a = root[:, None] * vh[:keep]
        if keep < layout.rank:
            a = torch.cat([a, a.new_zeros(layout.rank - keep, a.shape[1])])
            b = torch.cat([b, b.new_zeros(b.shape[0], layout.rank - keep)], dim=1)
        out[slot.a_key], out[slot.b_key] = a.float(), b.float()
        dropped += float((s[keep:] ** 2).sum())
        total += float((s**2).sum())
    return out, math.sqrt(dropped / total) if total > 0 else 0.0
