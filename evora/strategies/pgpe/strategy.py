"""Policy gradients with parameter-based exploration over the LoRA tensors (PGPE: Sehnke et al.
2010, with symmetric sampling), stepped by ClipUp (Toklu et al. 2020), as EvoTorch's PGPE does.

A Gaussian with a centre mu and a standard deviation sigma per value. Each generation draws
population / 2 directions eps_m = sigma * s_m and evaluates mu + eps_m and mu - eps_m. With the
candidates' utilities w (0-centred ranks by default) and w+_m, w-_m a direction's two:

    g_mu    = 1/M sum_m (w+_m - w-_m) / 2 * eps_m
    g_sigma = 1/M sum_m (w+_m + w-_m) / 2 * (eps_m^2 - sigma^2) / sigma

ClipUp moves the centre: v <- momentum * v + lr * g_mu / |g_mu|, v clipped to |v| <= max_speed
(2 lr by default), mu <- mu + v (norms over all the adapter's values); `optimizer=sgd`:
mu <- mu + lr * g_mu. sigma <- sigma + sigma_lr * g_sigma, each value kept within
sigma_max_change of its last (0.2). Candidates travel as seeds; the state (mu, sigma and ClipUp's
velocity, fp32) makes resume exact.
"""

from __future__ import annotations

import numpy as np
import torch

from evora.strategies import separable
from evora.strategies.noise_sums import NoiseSums
from evora.strategies.pgpe.config import PGPEConfig
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Tensors, Told, tensors_norm
from evora.strategies.separable import SeparablePayload, SeparableState
from evora.strategies.shaping import shape, shaping_input


class PGPE(separable.SeparableSearch):
    cfg: PGPEConfig

    def initial_state(self, context: StrategyContext) -> SeparableState:
        return separable.initial_state(self.cfg, context, velocity=self.cfg.optimizer == "clipup")

    def ask(self, state: SeparableState, generation: int) -> tuple[list[CandidateSpec], SeparablePayload]:
        specs = separable.population(self.cfg.population, generation, antithetic=True)
        return specs, SeparablePayload(generation, state.mu, state.sigma)

    # --- the update: the members' noise summed in groups (on the workers), then the step ----

    def weights(self, results: GenerationResults) -> np.ndarray:
        """The candidates' 0-centred utilities (in spec order)."""
        weights = shape(shaping_input(results, self.cfg.shaping), self.cfg.shaping)
        if self.cfg.shaping == "none":  # the others are 0-centred already; the update assumes it
            weights = weights - weights.mean()
        return weights

    def noise_sums(self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults) -> NoiseSums:
        # (w+ - w-) / 2 and (w+ + w-) / 2 per direction
        return separable.moment_noise_sums(specs, self.weights(results), factor=0.5)

    def tell_with(
        self, state: SeparableState, specs: list[CandidateSpec], results: GenerationResults, total: Tensors
    ) -> Told:
        linear, squares = separable.split_moments(total)
        signed, plain = separable.per_member(specs, self.weights(results))
        directions, spent = len(signed), sum(d / 2 for d in plain)
        g_mu = {k: state.sigma[k] * linear[k] / directions for k in state.mu}
        g_sigma = {k: state.sigma[k] * (squares[k] - spent) / directions for k in state.mu}
        step, velocity = self._centre_step(state, g_mu)
        mu = {k: state.mu[k] + step[k] for k in state.mu}
        sigma = {k: self._bounded(state.sigma[k], state.sigma[k] + self.cfg.sigma_lr * g_sigma[k]) for k in state.mu}
        stats = {"grad_norm": tensors_norm(g_mu), "update_norm": tensors_norm(step), **separable.sigma_stats(sigma)}
        return Told(SeparableState(mu, sigma, state.step + 1, velocity), stats)

    def _centre_step(self, state: SeparableState, g_mu: Tensors) -> tuple[Tensors, Tensors | None]:
        lr = self.cfg.lr
        if self.cfg.optimizer == "sgd":
            return {k: lr * g for k, g in g_mu.items()}, None
        if state.velocity is None:
            raise ValueError("optimizer=clipup: the PGPE state has no velocity")
        size = tensors_norm(g_mu)
        scale = lr / size if size > 0 else 0.0  # (all candidates tied: no direction, momentum only)
        velocity = {k: self.cfg.momentum * state.velocity[k] + scale * g for k, g in g_mu.items()}
        speed, limit = tensors_norm(velocity), self.cfg.max_speed or 2 * lr
        if speed > limit:
            velocity = {k: v * (limit / speed) for k, v in velocity.items()}
        return velocity, velocity

    def _bounded(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        change = self.cfg.sigma_max_change
        if change is None:
            return new
        return torch.minimum(torch.maximum(new, old - change * old.abs()), old + change * old.abs())
