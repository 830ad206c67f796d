"""ES maths: the update against a direct reference computation, and convergence on an
analytic objective over adapter tensors (no LLM)."""

import dataclasses

import numpy as np
import pytest
import torch

from evora.lora.layout import build_layout
from evora.lora.noise import member_noise
from evora.strategies.es import ESConfig, ESPayload, ESState, EvolutionStrategy
from evora.strategies.noise_sums import add_groups, member_groups
from evora.strategies.protocol import BASE, CENTER, CandidateSpec, EvalPayload, fitness_results, materialise

SHAPES = {
    "model.layers.0.mlp.down_proj": (6, 10),
    "model.layers.0.self_attn.o_proj": (6, 6),
    "model.layers.1.mlp.down_proj": (6, 10),
}


def layout(rank=2):
    return build_layout(
        SHAPES, rank=rank, alpha=rank, target_modules=["down_proj", "o_proj"], layers=None, base_model="toy"
    )


def theta0(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * 0.1 for k, s in layout().shapes().items()}


def reference_gradient(es, theta, fitness, generation, scales=None):
    """sum_i w_i eps_i / (N sigma_k), materialising every candidate's noise explicitly."""
    scales = scales or {}
    cfg = es.cfg
    w = (fitness - fitness.mean()) / fitness.std() if cfg.shaping == "zscore" else fitness
    grad = {k: torch.zeros_like(v) for k, v in theta.items()}
    specs = es.population(generation)
    for spec, wi in zip(specs, w):
        cand = es.materialise(ESPayload(generation, theta, scales), spec)
        for k in theta:
            eps = (cand[k] - theta[k]) / es.sigma_of(scales, k)
            grad[k] += float(wi) * eps
    return {k: g / (len(specs) * es.sigma_of(scales, k)) for k, g in grad.items()}


@pytest.mark.parametrize("antithetic", [True, False])
def test_sgd_update_matches_reference(antithetic):
    cfg = ESConfig(population=6, sigma=0.05, lr=0.1, antithetic=antithetic, shaping="zscore", weight_decay=0.01)
    es = EvolutionStrategy(cfg, run_seed=3)
    scales = {"base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight": 2.0}
    theta = theta0()
    state = es.start(theta, scales)
    specs, payload = es.ask(state, generation=4)
    fitness = np.array([0.1, 0.7, 0.3, 0.9, 0.2, 0.5])
    told = es.tell(state, specs, fitness_results(4, fitness))
    new, stats = told.state, told.stats
    ref = reference_gradient(es, theta, fitness, 4, scales)
    for k in theta:
        expected = theta[k] + 0.1 * ref[k] - 0.1 * 0.01 * theta[k]
        assert torch.allclose(new.theta[k], expected, atol=1e-6), k
    assert stats["update_norm"] > 0


def test_antithetic_pairs_are_mirrored_and_share_one_draw():
    es = EvolutionStrategy(ESConfig(population=4, sigma=0.1), run_seed=0)
    theta = theta0()
    specs = es.population(0)
    plus, minus = (es.materialise(ESPayload(0, theta, {}), s) for s in specs[:2])
    for k in theta:
        assert torch.allclose(plus[k] - theta[k], -(minus[k] - theta[k]))
        expected = theta[k] + 0.1 * member_noise(0, 0, 0, k, tuple(theta[k].shape))
        assert torch.equal(plus[k], expected)


def test_adam_update_matches_reference():
    cfg = ESConfig(population=4, sigma=0.1, lr=0.01, optimizer="adam", shaping="centered_rank")
    es = EvolutionStrategy(cfg, run_seed=1)
    state = es.start(theta0())
    grads = []
    for generation, fitness in enumerate([np.array([1.0, 0.0, 0.5, 0.2]), np.array([0.3, 0.1, 0.9, 0.4])]):
        specs, _ = es.ask(state, generation)
        grads.append(es.gradient(state, specs, fitness))
        prev = state
        state = es.tell(state, specs, fitness_results(generation, fitness)).state
    for k in prev.theta:
        g1, g2 = grads[0][k], grads[1][k]
        m = 0.9 * (0.1 * g1) + 0.1 * g2
        v = 0.999 * (0.001 * g1 * g1) + 0.001 * g2 * g2
        step = (m / (1 - 0.9**2)) / ((v / (1 - 0.999**2)).sqrt() + 1e-8)
        assert torch.allclose(state.theta[k], prev.theta[k] + 0.01 * step, atol=1e-6)


def test_center_and_base_specs():
    es = EvolutionStrategy(ESConfig(population=2), run_seed=0)
    theta = theta0()
    assert materialise(es, EvalPayload(theta), CandidateSpec(0, 0, op=BASE)) is None
    assert materialise(es, EvalPayload(theta), CandidateSpec(0, 0, op=CENTER)) is theta


def test_gradient_needs_the_whole_population_in_order():
    es = EvolutionStrategy(ESConfig(population=4), run_seed=0)
    specs = es.population(0)
    with pytest.raises(ValueError):
        es.gradient(es.start(theta0()), specs[::-1], np.zeros(4))


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.05), ("adam", 0.02)])
def test_converges_on_an_analytic_objective(optimizer, lr):
    """Maximise -||B A - T||^2 over every module: ES must find a low-rank fit of T."""
    lay = layout(rank=2)
    g = torch.Generator().manual_seed(11)
    targets = {
        s.name: torch.randn(s.out_features, 2, generator=g) @ torch.randn(2, s.in_features, generator=g) * 0.3
        for s in lay.modules
    }

    def objective(t):
        return -sum(float(((t[s.b_key] @ t[s.a_key] - targets[s.name]) ** 2).sum()) for s in lay.modules)

    cfg = ESConfig(population=40, sigma=0.05, lr=lr, optimizer=optimizer, shaping="centered_rank")
    es = EvolutionStrategy(cfg, run_seed=0)
    start = {k: torch.randn(s, generator=g) * 0.3 for k, s in lay.shapes().items()}
    state = es.start(start)
    initial = objective(state.theta)
    for generation in range(150):
        specs, payload = es.ask(state, generation)
        fitness = np.array([objective(es.materialise(payload, s)) for s in specs])
        state = es.tell(state, specs, fitness_results(generation, fitness)).state
    final = objective(state.theta)
    assert final > initial * 0.1, (initial, final)  # the squared error shrank more than tenfold


def test_strategy_state_is_plain_data():
    es = EvolutionStrategy(ESConfig(population=2, optimizer="adam"), run_seed=0)
    state = es.start(theta0())
    assert isinstance(state, ESState) and state.STATE_VERSION == 1
    assert {f.name for f in dataclasses.fields(state)} == {"theta", "step", "noise_scales", "adam_m", "adam_v"}
    assert dataclasses.is_dataclass(es.cfg)


def test_the_update_summed_in_groups_anywhere_is_bitwise_tell():
    """The workers' way (strategies/noise_sums.py): each fixed group of members summed by a
    strategy of its own (any worker, any thread count, any order), the groups added in order,
    is bitwise the update `tell` computes in one process; and it is the ES gradient."""
    cfg = ESConfig(population=18, sigma=0.1, lr=0.05)
    fitness = np.random.default_rng(3).normal(size=18)
    es = EvolutionStrategy(cfg, run_seed=5)
    state = es.start(theta0())
    specs, payload = es.ask(state, 0)
    results = fitness_results(0, fitness)
    told = es.tell(state, specs, results)
    sums = es.noise_sums(state, specs, results)
    assert sums.groups == member_groups(9) == ((0, 3), (3, 6), (6, 9))  # 9 pairs: 3 groups of 3
    threads = torch.get_num_threads()
    parts = {}
    try:
        for group, count in zip((2, 0, 1), (1, 2, 1)):  # out of order, on 1 and 2 threads
            torch.set_num_threads(count)
            parts[group] = EvolutionStrategy(cfg, run_seed=5).group_sum(payload, sums, group)
    finally:
        torch.set_num_threads(threads)
    summed = es.tell_with(state, specs, results, add_groups([parts[g] for g in range(3)]))
    assert all(torch.equal(summed.state.theta[k], told.state.theta[k]) for k in told.state.theta)
    w = (fitness - fitness.mean()) / fitness.std()
    for k, value in state.theta.items():  # 1/(N sigma) sum_i w_i sign_i eps_i, in float64
        ref = sum(w[s.index] * s.sign * member_noise(5, 0, s.member, k, tuple(value.shape)).double() for s in specs)
        step = told.state.theta[k].double() - value.double()
        torch.testing.assert_close(step, 0.05 * ref / (18 * 0.1), rtol=0, atol=1e-6)


def test_noise_reuse_draws_a_generations_noise_for_the_next_ones():
    """noise_reuse=3: generations 3, 4 and 5 evaluate and update with generation 3's noise
    (the same candidates and the same step as a fresh-noise run's generation 3); 6 draws anew."""
    fitness = np.random.default_rng(3).normal(size=8)
    reused = EvolutionStrategy(ESConfig(population=8, sigma=0.1, lr=0.01, noise_reuse=3), run_seed=0)
    fresh = EvolutionStrategy(ESConfig(population=8, sigma=0.1, lr=0.01), run_seed=0)
    state = fresh.start(theta0())
    expected_specs, expected_payload = fresh.ask(state, 3)
    expected = fresh.tell(state, expected_specs, fitness_results(3, fitness)).state.theta
    for generation in (3, 4, 5):
        specs, payload = reused.ask(state, generation)
        for spec, twin in zip(specs, expected_specs):
            candidate, reference = reused.materialise(payload, spec), fresh.materialise(expected_payload, twin)
            assert all(torch.equal(candidate[k], reference[k]) for k in reference)
        stepped = reused.tell(state, specs, fitness_results(generation, fitness)).state.theta
        assert all(torch.equal(stepped[k], expected[k]) for k in expected)
    specs, payload = reused.ask(state, 6)
    assert not torch.equal(
        *(
            m[next(iter(m))]
            for m in (reused.materialise(payload, specs[0]), fresh.materialise(expected_payload, expected_specs[0]))
        )
    )
