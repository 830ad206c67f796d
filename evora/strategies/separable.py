"""Search distributions with a standard deviation per parameter over the LoRA tensors, the
shared part of SNES and PGPE (`strategies/snes`, `strategies/pgpe`): a centre `mu` and a
`sigma` per value (fp32 tensors, named as the adapter's), candidates `mu + sign * sigma * s`
rebuilt from seeds on the workers (s the member's N(0, I) noise, `lora.noise.member_noise`), and
the two sums each one's update takes over a generation's members:

    linear  = sum_m c_m s_m          squares = sum_m d_m s_m^2     (per tensor, fp32)

The driver draws each member's noise again to take them (the LoRA tensors are small beside the
engines' work; ES's sums on the workers, `noise_sums.py`, are for its larger populations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from evora.lora.noise import in_parallel, member_noise, named_values, perturbed_adapter
from evora.strategies.adapter_init import initial_adapter, noise_scales
from evora.strategies.protocol import CandidateSpec, StrategyContext, Tensors, clone_tensors


@dataclass
class SeparableState:
    STATE_VERSION: ClassVar[int] = 1
    mu: Tensors  # the centre, fp32
    sigma: Tensors  # a standard deviation per value, fp32
    step: int = 0
    velocity: Tensors | None = None  # PGPE's ClipUp velocity (None: SNES, or PGPE with optimizer=sgd)


@dataclass(frozen=True)
class SeparablePayload:
    generation: int
    mu: Tensors
    sigma: Tensors


def initial_state(cfg: Any, context: StrategyContext, velocity: bool = False) -> SeparableState:
    """mu: the strategy's initial adapter (`strategy.init`); sigma: `strategy.sigma` everywhere,
    times each layer's scale under `strategy.noise_scale=per_layer`."""
    mu = clone_tensors(initial_adapter(cfg, context))
    scales = noise_scales(cfg, context)
    sigma = {k: torch.full_like(v, cfg.sigma * scales.get(k, 1.0)) for k, v in mu.items()}
    return SeparableState(mu, sigma, velocity={k: torch.zeros_like(v) for k, v in mu.items()} if velocity else None)


def population(size: int, generation: int, antithetic: bool) -> list[CandidateSpec]:
    """`size` candidates; antithetic: pairs (+s, -s) of one member's noise, plus first."""
    if antithetic:
        return [CandidateSpec(generation, i, member=i // 2, sign=1 if i % 2 == 0 else -1) for i in range(size)]
    return [CandidateSpec(generation, i, member=i) for i in range(size)]


def candidate(run_seed: int, payload: SeparablePayload, spec: CandidateSpec) -> Tensors:
    sigma = payload.sigma
    return perturbed_adapter(payload.mu, run_seed, spec.generation, spec.member, lambda k: spec.sign * sigma[k])


def moment_sums(
    run_seed: int, generation: int, mu: Tensors, linear: Sequence[float], squares: Sequence[float]
) -> tuple[Tensors, Tensors]:
    """Per tensor, (sum_m linear[m] s_m, sum_m squares[m] s_m^2) over the generation's members,
    each member's noise drawn once, members in order (a zero coefficient adds nothing)."""

    def summed(item: tuple[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        name, value = item
        first, second = torch.zeros_like(value), torch.zeros_like(value)
        for member, (c, d) in enumerate(zip(linear, squares)):
            if c == 0.0 and d == 0.0:
                continue
            s = member_noise(run_seed, generation, member, name, tuple(value.shape))
            first.add_(s, alpha=c)
            second.add_(s * s, alpha=d)
        return first, second

    pairs = in_parallel(summed, list(mu.items()), cost=named_values)
    return {k: p[0] for k, p in zip(mu, pairs)}, {k: p[1] for k, p in zip(mu, pairs)}


def per_member(specs: Sequence[CandidateSpec], weights: np.ndarray) -> tuple[list[float], list[float]]:
    """(sum of sign * w, sum of w) over each member's candidates: the coefficients of s_m and of
    s_m^2 in sum_k w_k s_k and sum_k w_k s_k^2 (s_k = sign_k s_m)."""
    members = max(s.member for s in specs) + 1
    signed, plain = [0.0] * members, [0.0] * members
    for spec, w in zip(specs, weights):
        signed[spec.member] += spec.sign * float(w)
        plain[spec.member] += float(w)
    return signed, plain


def values(tensors: Tensors) -> int:
    return sum(t.numel() for t in tensors.values())


def sigma_stats(sigma: Tensors) -> dict[str, float]:
    """The spread of the standard deviations, for metrics.jsonl."""
    flat = torch.cat([t.reshape(-1) for t in sigma.values()]).double()
    return {"sigma_mean": float(flat.mean()), "sigma_min": float(flat.min()), "sigma_max": float(flat.max())}
