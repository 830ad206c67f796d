"""Separable natural evolution strategies over the LoRA tensors (SNES: Schaul, Glasmachers and
Schmidhuber 2011, "High dimensions and heavy tails for natural evolution strategies").

A Gaussian with a centre mu and a standard deviation sigma per value. Each generation draws
s_k ~ N(0, I), evaluates z_k = mu + sigma * s_k, ranks them into utilities u_k (`shaping=nes`, the
paper's), and moves

    grad_mu    = sum_k u_k s_k                 mu    <- mu + eta_mu * sigma * grad_mu
    grad_sigma = sum_k u_k (s_k^2 - 1)         sigma <- sigma * exp(eta_sigma / 2 * grad_sigma)

with eta_mu = 1 and eta_sigma = (3 + ln d) / (5 sqrt d) for d values by default. Under any other
shaping (zscore, centered_rank, per_prompt; `none` is refused) the weights are first divided by the sum of their
absolute values, as EvoTorch's SNES (ExpSeparableGaussian) does: NES's utilities sum to about 1.2
in absolute value, a z-score's to about 0.8 N (24 at N = 30) and centered ranks' to N / 4, so
unnormalised they would step 6 to 20 times as far as the paper's. `antithetic=true`
(not the paper's) evaluates each s as the pair (+s, -s). Candidates travel as seeds; the state is
mu and sigma, fp32, so resume is exact.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from evora.strategies import separable
from evora.strategies.noise_sums import NoiseSums
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told, tensors_norm
from evora.strategies.separable import SeparablePayload, SeparableState
from evora.strategies.shaping import shape, shaping_input
from evora.strategies.snes.config import SNESConfig


def paper_sigma_lr(values: int) -> float:
    """eta_sigma = (3 + ln d) / (5 sqrt d) (Schaul et al. 2011, Table 1)."""
    return (3 + math.log(values)) / (5 * math.sqrt(values))


def utilities(fitness: np.ndarray, shaping: str) -> np.ndarray:
    """The update's weights: NES's utilities as the paper's; any other shaping's weights divided
    by their absolute sum (EvoTorch's SNES), all zeros when they are."""
    weights = shape(fitness, shaping)
    if shaping == "nes":
        return weights
    total = float(np.abs(weights).sum())
    return weights / total if total > 0 else weights


class SNES(separable.SeparableSearch):
    cfg: SNESConfig

    def initial_state(self, context: StrategyContext) -> SeparableState:
        return separable.initial_state(self.cfg, context)

    def ask(self, state: SeparableState, generation: int) -> tuple[list[CandidateSpec], SeparablePayload]:
        specs = separable.population(self.cfg.population, generation, self.cfg.antithetic)
        return specs, SeparablePayload(generation, state.mu, state.sigma)

    def sigma_lr(self, state: SeparableState) -> float:
        return self.cfg.sigma_lr if self.cfg.sigma_lr is not None else paper_sigma_lr(separable.values(state.mu))

    # --- the update: the members' noise summed in groups (on the workers), then the step ----

    def utilities(self, results: GenerationResults) -> np.ndarray:
        return utilities(shaping_input(results, self.cfg.shaping), self.cfg.shaping)

    def noise_sums(self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults) -> NoiseSums:
        return separable.moment_noise_sums(specs, self.utilities(results))

    def tell_with(
        self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults, total: Tensors
    ) -> Told:
        linear, squares = separable.split_moments(total)
        spent = float(np.sum(self.utilities(results)))  # sum_k u_k (s_k^2 - 1) = sum_k u_k s_k^2 - sum_k u_k
        lr, half = self.cfg.lr, self.sigma_lr(state) / 2
        mu = {k: state.mu[k] + lr * state.sigma[k] * linear[k] for k in state.mu}
        sigma = {k: state.sigma[k] * torch.exp(half * (squares[k] - spent)) for k in state.mu}
        stats = {
            "update_norm": tensors_norm({k: mu[k] - state.mu[k] for k in mu}),
            **separable.sigma_stats(sigma),
        }
        return Told(SeparableState(mu, sigma, state.step + 1), stats)
