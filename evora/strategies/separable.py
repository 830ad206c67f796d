"""Search distributions with a standard deviation per parameter over the LoRA tensors, the
shared part of SNES and PGPE (`strategies/snes`, `strategies/pgpe`): a centre `mu` and a
`sigma` per value (fp32 tensors, named as the adapter's), candidates `mu + sign * sigma * s`
rebuilt from seeds on the workers (s the member's N(0, I) noise, `lora.noise.member_noise`), and
the two sums each one's update takes over a generation's members:

    linear  = sum_m c_m s_m          squares = sum_m d_m s_m^2     (per tensor, fp32)

Both are summed where the noise is drawn, as ES's update is (`noise_sums.py`): the workers sum
fixed groups of members (`moment_group_sum`, on their GPU under hardware.noise_device=auto) and
the driver adds the groups in order, so 1 and N workers, and a resume, step bitwise alike; the
driver draws no noise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from evora.lora.noise import device_of, in_parallel, member_noise, named_values, perturbed_adapter, tensors_to
from evora.strategies.adapter_init import initial_adapter, noise_scales
from evora.strategies.noise_sums import NoiseSums, member_groups, summed_locally
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told, clone_tensors


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


def moment_noise_sums(specs: Sequence[CandidateSpec], weights: np.ndarray, factor: float = 1.0) -> NoiseSums:
    """What the workers sum for an update from the candidates' weights (in spec order): per
    member `factor` times its signed and its plain sum of weights (`per_member`), the
    coefficients of s_m and of s_m^2, in ES's fixed member groups."""
    signed, plain = per_member(specs, weights)
    return NoiseSums(
        specs[0].generation,
        tuple(factor * c for c in signed),
        member_groups(len(signed)),
        tuple(factor * d for d in plain),
    )


SQUARES = "#squares"  # a tensor's sum of d_m s_m^2 travels beside its linear sum, named thus


def moment_group_sum(run_seed: int, payload: SeparablePayload, sums: NoiseSums, group: int) -> Tensors:
    """Per tensor, sum_m c_m s_m (its name) and sum_m d_m s_m^2 (name + SQUARES) over the group's
    members, each member's noise drawn once, members in order (zero coefficients skipped), on
    mu's device (on the CPU, tensors at once over the process's threads)."""
    start, stop = sums.groups[group]
    live = [(m, sums.coefficients[m], sums.squares[m]) for m in range(start, stop)]
    live = [(m, c, d) for m, c, d in live if c != 0.0 or d != 0.0]

    def summed(item: tuple[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        name, value = item
        first, second = torch.zeros_like(value), torch.zeros_like(value)
        for member, c, d in live:
            s = member_noise(run_seed, sums.generation, member, name, tuple(value.shape), value.device)
            first.add_(s, alpha=c)
            second.add_(s * s, alpha=d)
        return first, second

    pairs = in_parallel(summed, list(payload.mu.items()), device_of(payload.mu), cost=named_values)
    out: Tensors = {}
    for name, (first, second) in zip(payload.mu, pairs):
        out[name], out[name + SQUARES] = first, second
    return out


def split_moments(total: Tensors) -> tuple[Tensors, Tensors]:
    """(linear, squares) per tensor from the groups' sums added (`moment_group_sum`)."""
    linear = {k: v for k, v in total.items() if not k.endswith(SQUARES)}
    return linear, {k: total[k + SQUARES] for k in linear}


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


class SeparableSearch(ABC):
    """What SNES and PGPE share: candidates rebuilt from seeds, the moment sums summed in groups
    where the noise is drawn (a noise_sums.SummedStrategy and a DeviceNoiseStrategy), and `tell`
    as `tell_with` over the groups summed in this process. Each has its own start and population
    (`initial_state`, `ask`), its sums' coefficients (`noise_sums`) and its step (`tell_with`)."""

    state_type: ClassVar[type] = SeparableState

    def __init__(self, cfg: Any, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    def materialise(self, payload: SeparablePayload, spec: CandidateSpec) -> Tensors:
        return candidate(self.run_seed, payload, spec)

    def payload_to(self, payload: Any, device: str) -> Any:
        """A generation's payload with mu and sigma on `device`; any other payload as it is."""
        if not isinstance(payload, SeparablePayload):
            return payload
        return replace(payload, mu=tensors_to(payload.mu, device), sigma=tensors_to(payload.sigma, device))

    def group_sum(self, payload: SeparablePayload, sums: NoiseSums, group: int) -> Tensors:
        return moment_group_sum(self.run_seed, payload, sums, group)

    def tell(self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        sums = self.noise_sums(state, specs, results)
        payload = SeparablePayload(sums.generation, state.mu, state.sigma)
        return self.tell_with(state, specs, results, summed_locally(self, payload, sums))

    @abstractmethod
    def initial_state(self, context: StrategyContext) -> SeparableState: ...

    @abstractmethod
    def ask(self, state: SeparableState, generation: int) -> tuple[list[CandidateSpec], SeparablePayload]: ...

    @abstractmethod
    def noise_sums(
        self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults
    ) -> NoiseSums: ...

    @abstractmethod
    def tell_with(
        self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults, total: Tensors
    ) -> Told: ...

    def center(self, state: SeparableState) -> Tensors:
        return state.mu
