"""plasticity=es (`strategy.py`): the antithetic probes around an organelle, rebuilt from
seeds on the workers, and each probed organelle's ES step from their fitness in `tell`."""

from __future__ import annotations

import numpy as np
import torch

from evora.lora.noise import gaussian, noise_key
from evora.strategies.ecology.economy import Organelle
from evora.strategies.ecology.state import PROBE, EcologyPayload, EcologyState, EcoSpec
from evora.strategies.protocol import GenerationResults, Tensors
from evora.strategies.shaping import zscore


def probe_noise(
    run_seed: int, generation: int, organelle_id: str, member: int, name: str, shape: tuple[int, ...]
) -> torch.Tensor:
    return gaussian(noise_key(run_seed, "ecology-probe", generation, organelle_id, member, name), shape)


def probed(run_seed: int, sigma: float, payload: EcologyPayload, spec: EcoSpec) -> Tensors:
    """A probe's adapter: its organelle's, plus sign * sigma * (per-tensor scale) * its noise."""
    adapter, organelle_id = payload.adapters[spec.organelle], payload.ids[spec.organelle]
    return {
        k: v
        + (spec.sign * sigma * payload.noise_scales.get(k, 1.0))
        * probe_noise(run_seed, spec.generation, organelle_id, spec.member, k, tuple(v.shape))
        for k, v in adapter.items()
    }


def es_step(
    run_seed: int,
    sigma: float,
    lr: float,
    scales: dict[str, float],
    organelle: Organelle,
    probes: list[EcoSpec],
    weights: np.ndarray,
) -> Tensors:
    """lr/(N sigma) sum_i w_i sign_i eps_i, tensor by tensor."""
    step = {}
    for name, value in organelle.adapter.items():
        grad = torch.zeros_like(value)
        for spec, w in zip(probes, weights):
            if w != 0.0:
                noise = probe_noise(run_seed, spec.generation, organelle.id, spec.member, name, tuple(value.shape))
                grad.add_(noise, alpha=float(w) * spec.sign)
        scale = sigma * scales.get(name, 1.0)
        step[name] = (lr / (len(probes) * scale)) * grad
    return step


def learn(
    run_seed: int,
    sigma: float,
    lr: float,
    state: EcologyState,
    organelles: list[Organelle],
    specs: list[EcoSpec],
    results: GenerationResults,
) -> dict[str, float]:
    """Each probed organelle's antithetic ES step, 1/(N sigma) sum_i w_i sign_i eps_i (w: z-scored
    fitness), applied in place; returns each stepped organelle's step norm."""
    norms = {}
    probes_of: dict[int, list[EcoSpec]] = {}  # organelle position -> its probes, in spec order
    for spec in specs:
        if spec.op == PROBE:
            probes_of.setdefault(spec.organelle, []).append(spec)
    for position, organelle in enumerate(organelles):
        probes = probes_of.get(position)
        if not probes:
            continue
        weights = zscore(np.array([results.fitness[s.index] for s in probes]))
        step = es_step(run_seed, sigma, lr, state.noise_scales, organelle, probes, weights)
        organelle.adapter = {k: v + step[k] for k, v in organelle.adapter.items()}
        squares = sum(((t.double() ** 2).sum() for t in step.values()), torch.zeros((), dtype=torch.float64))
        norms[organelle.id] = float(torch.sqrt(squares))
    return norms
