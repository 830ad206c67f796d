"""Evolution strategies over LoRA tensors (Salimans et al. 2017; Qiu et al. 2025).

    theta <- theta + lr * 1/(N sigma) * sum_i w_i eps_i      (SGD; Adam optional)

with w the shaped fitness, eps_i ~ N(0, I) per tensor from `lora.noise`, antithetic pairs
(eps, -eps) sharing one draw, optional per-tensor sigma multipliers (per-layer scale),
decoupled weight decay, and noise reuse (`noise_reuse=k`: generation g draws the noise of
generation g - g % k, EGGROLL's reuse of one population's perturbations for k updates). Master weights stay fp32.

The sum over members is computed where the noise is (`strategies/noise_sums.py`): the workers
sum fixed groups of members, and the driver adds the groups and takes the step (`tell_with`);
`tell` does both here. The noise is LoRA noise, drawn on the CPU over the process's threads:
vLLM builds adapters on the host and copies them into its GPU slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch

from evora.lora.noise import (
    device_of,
    in_parallel,
    named_values,
    noise_generation,
    noise_key,
    perturbed_adapter,
    tensors_to,
    weighted_sum,
)
from evora.strategies.adapter_init import initial_adapter, noise_scales
from evora.strategies.es.config import ESConfig
from evora.strategies.noise_sums import NoiseSums, member_coefficients, member_groups, summed_locally
from evora.strategies.protocol import (
    CandidateSpec,
    GenerationResults,
    StrategyContext,
    Tensors,
    Told,
    clone_tensors,
    tensors_norm,
)
from evora.strategies.shaping import shape, shaping_input


@dataclass
class ESState:
    STATE_VERSION: ClassVar[int] = 1
    theta: Tensors  # the mean adapter, fp32
    step: int = 0
    noise_scales: dict[str, float] = field(default_factory=dict)  # tensor name -> sigma multiplier
    adam_m: Tensors | None = None
    adam_v: Tensors | None = None


@dataclass(frozen=True)
class ESPayload:
    generation: int
    theta: Tensors
    noise_scales: dict[str, float]


class EvolutionStrategy:
    state_type: ClassVar[type] = ESState

    def __init__(self, cfg: ESConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    def sigma_of(self, scales: dict[str, float], tensor_name: str) -> float:
        return self.cfg.sigma * scales.get(tensor_name, 1.0)

    def population(self, generation: int) -> list[CandidateSpec]:
        if self.cfg.antithetic:
            return [
                CandidateSpec(generation, i, member=i // 2, sign=1 if i % 2 == 0 else -1)
                for i in range(self.cfg.population)
            ]
        return [CandidateSpec(generation, i, member=i) for i in range(self.cfg.population)]

    # --- ask / tell -----------------------------------------------------------------

    def initial_state(self, context: StrategyContext) -> ESState:
        return self.start(initial_adapter(self.cfg, context), noise_scales(self.cfg, context))

    def start(self, adapter: Tensors, scales: dict[str, float] | None = None) -> ESState:
        theta = clone_tensors(adapter)
        state = ESState(theta=theta, noise_scales=dict(scales or {}))
        if self.cfg.optimizer == "adam":
            state.adam_m = {k: torch.zeros_like(v) for k, v in theta.items()}
            state.adam_v = {k: torch.zeros_like(v) for k, v in theta.items()}
        return state

    def ask(self, state: ESState, generation: int) -> tuple[list[CandidateSpec], ESPayload]:
        return self.population(generation), ESPayload(generation, state.theta, state.noise_scales)

    def payload_to(self, payload: Any, device: str) -> Any:
        if not isinstance(payload, ESPayload):
            return payload
        return replace(payload, theta=tensors_to(payload.theta, device))

    def materialise(self, payload: ESPayload, spec: CandidateSpec) -> Tensors:
        scales, generation = payload.noise_scales, noise_generation(spec.generation, self.cfg.noise_reuse)
        return perturbed_adapter(
            payload.theta, self.run_seed, generation, spec.member, lambda k: spec.sign * self.sigma_of(scales, k)
        )

    # --- the update: sums of the members' noise, then the step ---------------------------

    def noise_sums(self, state: ESState, specs: list[CandidateSpec], results: GenerationResults) -> NoiseSums:
        return self._sums(specs, shaping_input(results, self.cfg.shaping))

    def _sums(self, specs: list[CandidateSpec], fitness: np.ndarray) -> NoiseSums:
        if [s.index for s in specs] != list(range(len(specs))):
            raise ValueError("specs must be the whole population in index order")
        coefficients = member_coefficients(specs, shape(fitness, self.cfg.shaping))
        return NoiseSums(specs[0].generation, coefficients, member_groups(len(coefficients)))

    def group_sum(self, payload: ESPayload, sums: NoiseSums, group: int) -> Tensors:
        """sum over the group's members of c_m eps_m per tensor, members in order (c_m = 0 skipped),
        drawn on theta's device (on the CPU, tensors at once over the process's threads)."""
        start, stop = sums.groups[group]
        live = [(m, sums.coefficients[m]) for m in range(start, stop) if sums.coefficients[m] != 0.0]

        def summed(item: tuple[str, torch.Tensor]) -> torch.Tensor:
            name, value = item
            drawn = noise_generation(sums.generation, self.cfg.noise_reuse)
            keys = [(noise_key(self.run_seed, "noise", drawn, m, name), c) for m, c in live]
            return weighted_sum(keys, tuple(value.shape), value.device)

        theta = payload.theta
        return dict(zip(theta, in_parallel(summed, list(theta.items()), device_of(theta), cost=named_values)))

    def gradient(self, state: ESState, specs: list[CandidateSpec], fitness: np.ndarray) -> Tensors:
        """1/(N sigma_k) * sum_i w_i sign_i eps_i, one noise draw per member, summed here."""
        return self._scaled(state, self._summed_here(state, self._sums(specs, fitness)), len(specs))

    def _summed_here(self, state: ESState, sums: NoiseSums) -> Tensors:
        return summed_locally(self, ESPayload(sums.generation, state.theta, state.noise_scales), sums)

    def _scaled(self, state: ESState, total: Tensors, candidates: int) -> Tensors:
        return {k: total[k] / (candidates * self.sigma_of(state.noise_scales, k)) for k in state.theta}

    def tell(self, state: ESState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        total = self._summed_here(state, self.noise_sums(state, specs, results))
        return self.tell_with(state, specs, results, total)

    def tell_with(self, state: ESState, specs: list[CandidateSpec], results: GenerationResults, total: Tensors) -> Told:
        """The step from the members' summed noise (`noise_sums`' groups, added in order)."""
        theta = state.theta
        grad = self._scaled(state, total, len(specs))
        step = state.step + 1
        new = ESState(theta={}, step=step, noise_scales=state.noise_scales)
        direction = grad
        if self.cfg.optimizer == "adam":
            direction, new.adam_m, new.adam_v = self._adam(state, grad, step)
        lr, decay = self.cfg.lr, self.cfg.weight_decay
        new.theta = {k: theta[k] + lr * direction[k] for k in theta}
        if decay:  # (without it, subtracting 0 * theta changed nothing but the time)
            new.theta = {k: new.theta[k] - (lr * decay) * theta[k] for k in theta}
        stats = {
            "grad_norm": tensors_norm(grad),
            "update_norm": tensors_norm({k: new.theta[k] - theta[k] for k in theta}),
            "theta_norm": tensors_norm(new.theta),
        }
        return Told(new, stats)

    def _adam(self, state: ESState, grad: Tensors, step: int) -> tuple[Tensors, Tensors, Tensors]:
        if state.adam_m is None or state.adam_v is None:
            raise ValueError("optimizer=adam: the ES state has no Adam moments")
        b1, b2, eps = self.cfg.beta1, self.cfg.beta2, self.cfg.eps
        m = {k: b1 * state.adam_m[k] + (1 - b1) * g for k, g in grad.items()}
        v = {k: b2 * state.adam_v[k] + (1 - b2) * g * g for k, g in grad.items()}
        direction = {k: (m[k] / (1 - b1**step)) / ((v[k] / (1 - b2**step)).sqrt() + eps) for k in grad}
        return direction, m, v

    def center(self, state: ESState) -> Tensors:
        return state.theta
