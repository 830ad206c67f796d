"""SNES and PGPE (a sigma per value over the LoRA tensors): their updates against float64
transcriptions of the papers' rules (Schaul et al. 2011; Sehnke et al. 2010 with symmetric
sampling and ClipUp, Toklu et al. 2020, as EvoTorch's PGPE), NES's utilities, the candidates
rebuilt from seeds, and convergence on an analytic objective (no LLM)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evora.lora.noise import member_noise
from evora.strategies.pgpe import PGPE, PGPEConfig
from evora.strategies.protocol import fitness_results
from evora.strategies.separable import SeparablePayload, SeparableState
from evora.strategies.shaping import SHAPINGS, centered_ranks, nes_utilities
from evora.strategies.snes import SNES, SNESConfig
from evora.strategies.snes.config import SNES_SHAPINGS

SEED, GENERATION = 5, 3
SHAPES = {"model.layers.0.mlp.down_proj.lora_A.weight": (2, 7), "model.layers.0.mlp.down_proj.lora_B.weight": (5, 2)}
FP32 = 1e-5  # relative: fp32 sums of a few dozen terms against float64


def start(seed: int = 0, velocity: bool = False) -> SeparableState:
    g = torch.Generator().manual_seed(seed)
    mu = {k: torch.randn(s, generator=g) * 0.3 for k, s in SHAPES.items()}
    sigma = {k: torch.rand(s, generator=g) * 0.2 + 0.05 for k, s in SHAPES.items()}
    return SeparableState(mu, sigma, velocity={k: torch.randn(s, generator=g) * 0.01 for k, s in SHAPES.items()})


def noise(member: int, name: str) -> torch.Tensor:
    return member_noise(SEED, GENERATION, member, name, SHAPES[name]).double()


def close(ours: dict, reference: dict) -> None:
    for k in reference:
        scale = float(reference[k].abs().max())
        assert float((ours[k].double() - reference[k]).abs().max()) <= FP32 * scale, k


def test_nes_utilities_are_the_papers_and_ties_share_them():
    fitness = np.array([0.3, -1.0, 2.5, 0.9, 0.1, 1.7, -0.4, 0.0])
    n = len(fitness)
    best_first = np.argsort(-fitness)
    raw = [max(0.0, math.log(n / 2 + 1) - math.log(k)) for k in range(1, n + 1)]
    reference = np.empty(n)
    reference[best_first] = np.array(raw) / sum(raw) - 1 / n
    assert np.allclose(nes_utilities(fitness), reference, rtol=0, atol=1e-15)
    tied = nes_utilities(np.array([1.0, 0.0, 1.0, 2.0]))
    assert tied[0] == tied[2] and tied[3] > tied[0] > tied[1] and abs(tied.sum()) < 1e-15


def evotorch_weights(fitness: np.ndarray, shaping: str) -> np.ndarray:
    """EvoTorch's SNES weights (ExpSeparableGaussian._compute_gradients): the ranking's
    utilities, divided by their absolute sum unless the ranking is NES's; its `normalized`
    ranking takes the standard deviation with ddof=1, which the division cancels."""
    n = len(fitness)
    if shaping == "nes":  # the paper's utilities, transcribed
        best_first = np.argsort(-fitness)
        raw = [max(0.0, math.log(n / 2 + 1) - math.log(k)) for k in range(1, n + 1)]
        u = np.empty(n)
        u[best_first] = np.array(raw) / sum(raw) - 1 / n
        return u
    ranks = np.argsort(np.argsort(fitness))  # no ties in these draws
    u = {
        "zscore": (fitness - fitness.mean()) / fitness.std(ddof=1),
        "centered_rank": ranks / (n - 1) - 0.5,
    }[shaping]
    return u / np.abs(u).sum()


@pytest.mark.parametrize(
    "antithetic,shaping",
    [(False, "nes"), (True, "nes"), (False, "zscore"), (True, "centered_rank"), (True, "zscore")],
)
def test_snes_candidates_and_update_equal_the_papers_rule_in_float64(antithetic, shaping):
    """The paper's rule under its utilities; under any other shaping, EvoTorch's weights."""
    cfg = SNESConfig(population=8, antithetic=antithetic, lr=0.7, shaping=shaping)
    snes, state = SNES(cfg, SEED), start()
    specs, payload = snes.ask(state, GENERATION)
    for spec in specs:  # z_k = mu + sigma * s_k (s_k = -s_m for a mirrored candidate)
        expected = {
            k: state.mu[k].double() + spec.sign * state.sigma[k].double() * noise(spec.member, k) for k in SHAPES
        }
        close(snes.materialise(payload, spec), expected)
    fitness = np.random.default_rng(1).normal(size=len(specs))
    told = snes.tell(state, specs, fitness_results(GENERATION, fitness))
    u = evotorch_weights(fitness, shaping)
    d = sum(math.prod(s) for s in SHAPES.values())
    eta_sigma = (3 + math.log(d)) / (5 * math.sqrt(d))
    mu, sigma = {}, {}
    for k in SHAPES:
        s = [spec.sign * noise(spec.member, k) for spec in specs]
        grad_mu = sum(u_k * s_k for u_k, s_k in zip(u, s))
        grad_sigma = sum(u_k * (s_k**2 - 1) for u_k, s_k in zip(u, s))
        mu[k] = state.mu[k].double() + cfg.lr * state.sigma[k].double() * grad_mu
        sigma[k] = state.sigma[k].double() * torch.exp(eta_sigma / 2 * grad_sigma)
    close(told.state.mu, mu)
    close(told.state.sigma, sigma)
    assert told.state.step == 1 and told.stats["sigma_min"] > 0


def pgpe_reference(cfg: PGPEConfig, state: SeparableState, specs, fitness: np.ndarray):
    """EvoTorch's PGPE step (SymmetricSeparableGaussian's gradients divided by the number of
    directions, ClipUp's ascent, modify_tensor's max_change on sigma), in float64."""
    w = centered_ranks(fitness)
    plus, minus = w[0::2], w[1::2]
    flat = lambda tensors: torch.cat([t.reshape(-1) for t in tensors.values()])  # noqa: E731
    sigma = {k: state.sigma[k].double() for k in SHAPES}
    eps = [{k: sigma[k] * noise(m, k) for k in SHAPES} for m in range(len(plus))]
    grad_mu = {k: sum((p - q) / 2 * e[k] for p, q, e in zip(plus, minus, eps)) / len(plus) for k in SHAPES}
    grad_sigma = {
        k: sum((p + q) / 2 * (e[k] ** 2 - sigma[k] ** 2) / sigma[k] for p, q, e in zip(plus, minus, eps)) / len(plus)
        for k in SHAPES
    }
    g = flat(grad_mu)
    velocity = cfg.momentum * flat({k: v.double() for k, v in state.velocity.items()}) + g / g.norm() * cfg.lr
    limit = cfg.max_speed or 2 * cfg.lr
    if velocity.norm() > limit:
        velocity = velocity * (limit / velocity.norm())
    mu, offset = {}, 0
    for k, shape in SHAPES.items():
        size = math.prod(shape)
        mu[k] = state.mu[k].double() + velocity[offset : offset + size].reshape(shape)
        offset += size
    new_sigma = {}
    for k in SHAPES:
        target = sigma[k] + cfg.sigma_lr * grad_sigma[k]
        bound = cfg.sigma_max_change * sigma[k].abs()
        new_sigma[k] = torch.minimum(torch.maximum(target, sigma[k] - bound), sigma[k] + bound)
    return mu, new_sigma


@pytest.mark.parametrize("sigma_lr", [0.1, 5.0])  # 5.0: the max-change bound binds
def test_pgpe_update_equals_evotorchs_rules_in_float64(sigma_lr):
    cfg = PGPEConfig(population=10, lr=0.05, sigma_lr=sigma_lr)
    pgpe, state = PGPE(cfg, SEED), start(velocity=True)
    specs, payload = pgpe.ask(state, GENERATION)
    assert [(s.member, s.sign) for s in specs[:4]] == [(0, 1), (0, -1), (1, 1), (1, -1)]
    fitness = np.random.default_rng(2).normal(size=len(specs))
    told = pgpe.tell(state, specs, fitness_results(GENERATION, fitness))
    mu, sigma = pgpe_reference(cfg, state, specs, fitness)
    close(told.state.mu, mu)
    close(told.state.sigma, sigma)
    assert told.state.velocity is not None and told.stats["update_norm"] <= 2 * cfg.lr * (1 + 1e-6)


@pytest.mark.parametrize(
    "strategy",
    [
        *(SNES(SNESConfig(population=20, sigma=0.2, shaping=shaping), 0) for shaping in SNES_SHAPINGS),
        *(PGPE(PGPEConfig(population=20, sigma=0.2, lr=0.05, shaping=shaping), 0) for shaping in SHAPINGS),
    ],
    ids=[*(f"snes-{shaping}" for shaping in SNES_SHAPINGS), *(f"pgpe-{shaping}" for shaping in SHAPINGS)],
)
def test_converges_on_an_analytic_objective(strategy):
    """Maximise -||x - t||^2 over the adapter's values: the error shrinks tenfold."""
    g = torch.Generator().manual_seed(11)
    target = {k: torch.randn(s, generator=g) * 0.5 for k, s in SHAPES.items()}

    def objective(t):
        return -sum(float(((t[k] - target[k]) ** 2).sum()) for k in SHAPES)

    state = start()
    state.sigma = {k: torch.full(s, strategy.cfg.sigma) for k, s in SHAPES.items()}
    state.velocity = {k: torch.zeros(s) for k, s in SHAPES.items()} if isinstance(strategy, PGPE) else None
    initial = objective(state.mu)
    for generation in range(150):
        specs, payload = strategy.ask(state, generation)
        fitness = np.array([objective(strategy.materialise(payload, s)) for s in specs])
        state = strategy.tell(state, specs, fitness_results(generation, fitness)).state
    assert objective(state.mu) > initial * 0.1, (initial, objective(state.mu))


def test_a_payload_is_the_centre_and_the_spreads():
    state = start()
    _, payload = SNES(SNESConfig(population=4), SEED).ask(state, 0)
    assert isinstance(payload, SeparablePayload) and payload.mu is state.mu and payload.sigma is state.sigma


@pytest.mark.parametrize("name", ["snes", "pgpe"])
def test_a_run_resumed_from_a_checkpoint_continues_bitwise_as_one_never_stopped(name, tmp_path):
    """Six generations against three, a checkpoint written and read back as the driver does
    (tracking/checkpoint.py), then three: the same centre, spreads and velocity, bit for bit.
    (The driver's restart around it is chaos-tested with es, ga, randopt, eggroll, the ecology
    and sft: tests/integration/test_chaos.py.)"""
    from evora.strategies.protocol import state_fields
    from evora.tracking.checkpoint import atomic_save, load_run_state, run_state

    strategy = SNES(SNESConfig(population=6, sigma=0.2), 3) if name == "snes" else PGPE(PGPEConfig(population=6), 3)

    def generations(state, first, last):
        for generation in range(first, last):
            specs, payload = strategy.ask(state, generation)
            fitness = np.array(
                [-float(sum((t**2).sum() for t in strategy.materialise(payload, s).values())) for s in specs]
            )
            state = strategy.tell(state, specs, fitness_results(generation, fitness)).state
        return state

    def fresh() -> SeparableState:
        state = start()
        return state if name == "pgpe" else SeparableState(state.mu, state.sigma)  # SNES keeps no velocity

    whole, half = generations(fresh(), 0, 6), generations(fresh(), 0, 3)
    atomic_save(run_state(name, half, state_fields(half), {"next_generation": 3}), tmp_path / "latest.pt")
    resumed = generations(SeparableState(**load_run_state(tmp_path / "latest.pt", name, SeparableState)["state"]), 3, 6)
    for field in ("mu", "sigma", "velocity"):
        ours, theirs = getattr(resumed, field), getattr(whole, field)
        assert (ours is None) == (theirs is None) and all(torch.equal(ours[k], theirs[k]) for k in ours or {}), field
