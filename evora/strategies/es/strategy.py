"""Evolution strategies over LoRA tensors (Salimans et al. 2017; Qiu et al. 2025).

    theta <- theta + lr * 1/(N sigma) * sum_i w_i eps_i      (SGD; Adam optional)

with w the shaped fitness, eps_i ~ N(0, I) per tensor from `lora.noise`, antithetic pairs
(eps, -eps) sharing one draw, optional per-tensor sigma multipliers (per-layer scale)
and decoupled weight decay. Master weights stay fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from evora.lora.noise import member_noise
from evora.strategies.adapter_init import initial_adapter, noise_scales
from evora.strategies.es.config import ESConfig
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told, clone_tensors
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

    def noise(self, generation: int, member: int, name: str, shape_: tuple[int, ...]) -> torch.Tensor:
        return member_noise(self.run_seed, generation, member, name, shape_)

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

    def materialise(self, payload: ESPayload, spec: CandidateSpec) -> Tensors:
        scales = payload.noise_scales
        return {
            k: v + (spec.sign * self.sigma_of(scales, k)) * self.noise(spec.generation, spec.member, k, tuple(v.shape))
            for k, v in payload.theta.items()
        }

    def gradient(self, state: ESState, specs: list[CandidateSpec], fitness: np.ndarray) -> Tensors:
        """1/(N sigma_k) * sum_i w_i sign_i eps_i, one noise draw per member, in a fixed order."""
        if [s.index for s in specs] != list(range(len(specs))):
            raise ValueError("specs must be the whole population in index order")
        weights = shape(fitness, self.cfg.shaping)
        coefficient: dict[int, float] = {}
        for spec, w in zip(specs, weights):
            coefficient[spec.member] = coefficient.get(spec.member, 0.0) + float(w) * spec.sign
        generation = specs[0].generation
        grad = {}
        for name, value in state.theta.items():
            acc = torch.zeros_like(value)
            for member in sorted(coefficient):
                if coefficient[member] != 0.0:
                    acc.add_(self.noise(generation, member, name, tuple(value.shape)), alpha=coefficient[member])
            grad[name] = acc / (len(specs) * self.sigma_of(state.noise_scales, name))
        return grad

    def tell(self, state: ESState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        theta = state.theta
        grad = self.gradient(state, specs, shaping_input(results, self.cfg.shaping))
        step = state.step + 1
        new = ESState(theta={}, step=step, noise_scales=state.noise_scales)
        direction = grad
        if self.cfg.optimizer == "adam":
            direction, new.adam_m, new.adam_v = self._adam(state, grad, step)
        lr, decay = self.cfg.lr, self.cfg.weight_decay
        new.theta = {k: theta[k] + lr * direction[k] - (lr * decay) * theta[k] for k in theta}
        stats = {
            "grad_norm": _norm(grad),
            "update_norm": _norm({k: new.theta[k] - theta[k] for k in theta}),
            "theta_norm": _norm(new.theta),
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


def _norm(tensors: Tensors) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors.values()))
