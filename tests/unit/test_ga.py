"""GA maths without an LLM: pair-preserving crossovers, the blend's Eckart-Young optimality,
seeded mutation, elitism, selection pressure, convergence on an analytic objective, the
seed-chain encoding, self-adaptive scales, lineage records and config validation."""

import math
import random
import re

import numpy as np
import pytest
import torch

from evora.errors import ConfigError
from evora.lora.layout import build_layout
from evora.lora.noise import gaussian, noise_key
from evora.plan.compose import compose_run
from evora.strategies.ga import GAConfig, GAState, GeneticAlgorithm
from evora.strategies.ga.operators import (
    CROSSOVERS,
    blend_pair,
    crossover_blend,
    crossover_layers,
    crossover_modules,
    module_pairs,
    mutate,
)
from evora.strategies.ga.strategy import CROSSOVER, ELITE, MUTATE, GASpec
from evora.strategies.protocol import fitness_results


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small QR/SVDs (the blend) are ~30x slower with several intra-op threads on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# 3 layers x 2 target modules (the layer crossover has two cut points), plus a module that
# is not targeted.
LAYERS = 3
SHAPES = {}
for _layer in range(LAYERS):
    SHAPES[f"model.layers.{_layer}.self_attn.q_proj"] = (8, 8)
    SHAPES[f"model.layers.{_layer}.self_attn.k_proj"] = (4, 8)
    SHAPES[f"model.layers.{_layer}.mlp.down_proj"] = (8, 12)


def layout(rank=2, shapes=SHAPES, targets=("q_proj", "down_proj")):
    return build_layout(shapes, rank=rank, alpha=rank, target_modules=list(targets), layers=None, base_model="toy")


def random_adapter(seed, rank=2, scale=1.0, lay=None):
    g = torch.Generator().manual_seed(seed)
    lay = lay or layout(rank)
    return {k: torch.randn(s, generator=g) * scale for k, s in lay.shapes().items()}


def source(child, parents, pair):
    """Which parent (index) gave the module's A and B, checked tensor by tensor (a tuple if A and B disagree)."""
    origins = []
    for key in pair:
        matches = [i for i, p in enumerate(parents) if torch.equal(child[key], p[key])]
        assert len(matches) <= 1  # parents' tensors all differ
        origins.append(matches[0] if matches else None)
    return origins[0] if origins[0] == origins[1] else ("split", *origins)


def layer_of_module(module):
    return int(re.search(r"\.layers\.(\d+)\.", module).group(1))


# --- 1. crossover keeps A and B together ------------------------------------------------------


@pytest.mark.parametrize("op", ["module", "layer"])
def test_crossover_never_splits_an_a_b_pair(op):
    p1, p2 = random_adapter(1), random_adapter(2)
    pairs = module_pairs(p1)
    assert len(pairs) == 2 * LAYERS
    seen_sources = {module: set() for module in pairs}
    mixed = 0
    for seed in range(60):
        child = CROSSOVERS[op](p1, p2, seed)
        assert list(child) == list(p1)  # same tensors, same order
        sources = {}
        for module, pair in pairs.items():
            origin = source(child, (p1, p2), pair)
            assert origin in (0, 1), (op, seed, module, origin)  # both from one parent, never split
            assert child[pair[0]] is (p1, p2)[origin][pair[0]]  # the very tensors, not copies
            sources[module] = origin
            seen_sources[module].add(origin)
        mixed += len(set(sources.values())) == 2
    if op == "module":  # (the layer crossover always takes the first layer from the first parent)
        assert all(s == {0, 1} for s in seen_sources.values()), seen_sources  # both parents contribute
    else:
        assert len(set.union(*seen_sources.values())) == 2
    assert mixed > 20  # most children mix the parents


def test_module_crossover_is_a_fair_coin_per_module():
    p1, p2 = random_adapter(1), random_adapter(2)
    pairs = module_pairs(p1)
    from_first = trials = 0
    for seed in range(300):
        child = crossover_modules(p1, p2, seed)
        for pair in pairs.values():
            from_first += source(child, (p1, p2), pair) == 0
            trials += 1
    assert abs(from_first / trials - 0.5) < 0.05, from_first / trials  # std ~0.008


def test_layer_crossover_takes_a_prefix_of_layers_from_the_first_parent():
    p1, p2 = random_adapter(1), random_adapter(2)
    pairs = module_pairs(p1)
    cuts = []
    for seed in range(40):
        child = crossover_layers(p1, p2, seed)
        by_layer = {}
        for module, pair in pairs.items():
            by_layer.setdefault(layer_of_module(module), set()).add(source(child, (p1, p2), pair))
        assert all(len(s) == 1 for s in by_layer.values()), by_layer  # a layer comes whole from one parent
        origin = [by_layer[layer].pop() for layer in range(LAYERS)]
        cut = origin.count(0)
        assert origin == [0] * cut + [1] * (LAYERS - cut), origin  # prefix from the first, rest from the second
        assert 1 <= cut <= LAYERS - 1  # a true one-point crossover: both parents present
        cuts.append(cut)
    assert set(cuts) == set(range(1, LAYERS)), cuts  # different seeds, different cuts
    assert crossover_layers(p1, p2, 7).keys() == p1.keys()
    for seed in range(10):  # the same seed, the same cut
        a, b = crossover_layers(p1, p2, seed), crossover_layers(p1, p2, seed)
        assert all(a[k] is b[k] for k in a)


def test_layer_crossover_with_a_single_layer_takes_one_parent_whole():
    shapes = {"model.layers.0.self_attn.q_proj": (8, 8), "model.layers.0.mlp.down_proj": (8, 12)}
    lay = layout(shapes=shapes)
    p1, p2 = random_adapter(1, lay=lay), random_adapter(2, lay=lay)
    wholes = set()
    for seed in range(30):
        child = crossover_layers(p1, p2, seed)
        origins = {source(child, (p1, p2), pair) for pair in module_pairs(p1).values()}
        assert len(origins) == 1 and origins <= {0, 1}
        wholes |= origins
    assert wholes == {0, 1}


# --- 2. blend crossover: the best rank-r approximation of the blended update --------------------


def blend_weights(seed, n):
    rng = random.Random(noise_key(seed, "blend-crossover"))
    return [rng.random() for _ in range(n)]


def check_optimal(a, b, a1, b1, a2, b2, w, rank):
    assert a.shape == a1.shape and b.shape == b1.shape and a.dtype == a1.dtype and b.dtype == b1.dtype
    dense = w * (b1.double() @ a1.double()) + (1 - w) * (b2.double() @ a2.double())
    u, s, vh = torch.linalg.svd(dense, full_matrices=False)
    best = (u[:, :rank] * s[:rank]) @ vh[:rank]
    best_error = float(torch.linalg.norm(dense - best))
    child_error = float(torch.linalg.norm(dense - b.double() @ a.double()))
    assert best_error > 1e-3  # the blend is not already rank r: the check has teeth
    assert abs(child_error - best_error) <= 1e-4 * best_error, (child_error, best_error)
    assert float(torch.linalg.norm(b.double() @ a.double() - best)) <= 1e-4 * float(torch.linalg.norm(best))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_blend_crossover_is_the_best_rank_r_approximation(rank):
    # k_proj has out=4 < 2r for rank 3: the thin QR is narrower than 2r there.
    lay = layout(rank, targets=("q_proj", "k_proj", "down_proj"))
    for seed in range(8):
        p1, p2 = random_adapter(10 + seed, rank, lay=lay), random_adapter(50 + seed, rank, lay=lay)
        child = crossover_blend(p1, p2, seed)
        assert list(child) == list(p1)
        pairs = module_pairs(p1)
        weights = blend_weights(seed, len(pairs))
        assert len(set(weights)) == len(weights)  # one weight per module
        for (a_key, b_key), w in zip(pairs.values(), weights):
            check_optimal(child[a_key], child[b_key], p1[a_key], p1[b_key], p2[a_key], p2[b_key], w, rank)


@pytest.mark.parametrize("w", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_blend_pair_at_chosen_weights(w):
    g = torch.Generator().manual_seed(3)
    a1, a2 = torch.randn(2, 12, generator=g), torch.randn(2, 12, generator=g)
    b1, b2 = torch.randn(8, 2, generator=g), torch.randn(8, 2, generator=g)
    a, b = blend_pair(a1, b1, a2, b2, w)
    if w in (0.0, 1.0):  # a pure parent: its own (rank-r) product exactly
        want = b1 @ a1 if w == 1.0 else b2 @ a2
        assert torch.allclose(b @ a, want, rtol=1e-5, atol=1e-5)
    else:
        check_optimal(a, b, a1, b1, a2, b2, w, rank=2)


def test_blend_of_equal_parents_keeps_the_product():
    p = random_adapter(4)
    for seed in range(5):
        child = crossover_blend(p, p, seed)
        for a_key, b_key in module_pairs(p).values():
            want = p[b_key] @ p[a_key]
            assert torch.allclose(child[b_key] @ child[a_key], want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


# --- 3. mutation ----------------------------------------------------------------------------


def mutated_modules(parent, child):
    out = []
    for module, (a_key, b_key) in module_pairs(parent).items():
        changed = (not torch.equal(child[a_key], parent[a_key]), not torch.equal(child[b_key], parent[b_key]))
        assert changed[0] == changed[1], (module, changed)  # A and B together, or neither
        if not changed[0]:
            assert child[a_key] is parent[a_key] and child[b_key] is parent[b_key]
        out.append(changed[0])
    return out


def test_mutation_is_reproducible_from_its_seed():
    p = random_adapter(0)
    a, b = mutate(p, 123, 0.1, 0.5), mutate(p, 123, 0.1, 0.5)
    assert list(a) == list(p)
    assert all(torch.equal(a[k], b[k]) for k in p)
    c = mutate(p, 124, 0.1, 0.5)
    assert any(not torch.equal(a[k], c[k]) for k in p)
    full1, full2 = mutate(p, 1, 0.1, 1.0), mutate(p, 2, 0.1, 1.0)
    assert all(not torch.equal(full1[k], full2[k]) for k in p)  # every tensor's noise depends on the seed


def test_mutation_touches_a_and_b_of_mutated_modules_only():
    p = random_adapter(0)
    snapshot = {k: v.clone() for k, v in p.items()}
    counts = []
    for seed in range(40):
        child = mutate(p, seed, 0.05, 0.5)
        assert list(child) == list(p)
        counts.append(sum(mutated_modules(p, child)))
    assert all(torch.equal(p[k], snapshot[k]) for k in p)  # the parent is not modified in place
    assert any(0 < c < len(module_pairs(p)) for c in counts)  # partial mutations happen


def test_mutation_rate_zero_and_one():
    p = random_adapter(0)
    for seed in range(20):
        untouched = mutate(p, seed, 0.5, 0.0)
        assert all(untouched[k] is p[k] for k in p)
        assert all(mutated_modules(p, mutate(p, seed, 0.5, 1.0)))


def test_mutation_rate_is_the_fraction_of_mutated_modules():
    p = random_adapter(0)
    flags = [m for seed in range(300) for m in mutated_modules(p, mutate(p, seed, 0.1, 0.5))]
    assert abs(np.mean(flags) - 0.5) < 0.05, np.mean(flags)  # 1800 draws: std ~0.012
    flags = [m for seed in range(300) for m in mutated_modules(p, mutate(p, seed, 0.1, 0.2))]
    assert abs(np.mean(flags) - 0.2) < 0.04, np.mean(flags)


def test_mutation_noise_is_sigma_times_scale_times_seeded_gaussian():
    p = random_adapter(0)
    key = next(iter(p))
    sigma = 0.03
    child = mutate(p, 9, sigma, 1.0, scales={key: 4.0})
    for k in p:
        scale = 4.0 if k == key else 1.0
        want = p[k] + (sigma * scale) * gaussian(noise_key(9, "mutation", k), tuple(p[k].shape))
        assert torch.equal(child[k], want)
    noise = torch.cat([(child[k] - p[k]).flatten() for k in p if k != key])
    assert abs(float(noise.std()) - sigma) < 0.2 * sigma
    a_keys = [a for a, _ in module_pairs(p).values()]
    assert not torch.allclose(child[a_keys[0]] - p[a_keys[0]], child[a_keys[2]] - p[a_keys[2]])  # per-name noise


# --- GA helpers -------------------------------------------------------------------------------


def targets_for(lay, seed=11, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    r = lay.rank
    return {
        s.name: torch.randn(s.out_features, r, generator=g) @ torch.randn(r, s.in_features, generator=g) * scale
        for s in lay.modules
    }


def objective_for(lay, targets):
    def objective(t):
        return -sum(float(((t[s.b_key] @ t[s.a_key] - targets[s.name]) ** 2).sum()) for s in lay.modules)

    return objective


def run_ga(cfg, generations, objective, start, run_seed=0, noise_scales=None, hook=None):
    ga = GeneticAlgorithm(cfg, run_seed=run_seed)
    state = ga.start(start, noise_scales)
    for generation in range(generations):
        specs, payload = ga.ask(state, generation)
        members = [ga.materialise(payload, s) for s in specs]
        fitness = np.array([objective(m) for m in members])
        told = ga.tell(state, specs, fitness_results(specs[0].generation, fitness))
        new_state, stats = told.state, told.stats
        if hook:
            hook(ga, state, specs, payload, members, fitness, new_state, stats)
        state = new_state
    return ga, state


def pool_state(ga, n=4, sigmas=None):
    pool = [random_adapter(100 + i, scale=0.3) for i in range(n)]
    return GAState(
        pool=pool,
        ids=[f"g3-{i:02d}-mutate" for i in range(n)],
        fitness=[-float(i) for i in range(n)],
        sigmas=list(sigmas or [0.01 * (i + 1) for i in range(n)]),
    )


# --- 4. elitism -------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["tensors", "seeds"])
def test_elites_are_carried_unchanged(encoding):
    cfg = GAConfig(
        population=6,
        keep_top=2,
        parents=3,
        crossover_rate=0.0 if encoding == "seeds" else 0.5,
        mutation_scale=0.1,
        encoding=encoding,
    )
    lay = layout()
    objective = objective_for(lay, targets_for(lay))
    checked = []

    def hook(ga, state, specs, payload, members, fitness, new_state, stats):
        elites = [s for s in specs if s.op == ELITE]
        assert len(elites) == min(cfg.keep_top, len(state.pool))
        assert [s.index for s in elites] == list(range(len(elites)))
        for spec in elites:
            member, parent = members[spec.index], state.pool[spec.parents[0]]
            assert spec.parents == (spec.index,)
            assert all(torch.equal(member[k], parent[k]) for k in parent)  # materialises to the pool member
            assert fitness[spec.index] == objective(parent)
        keep = ga.survivors(fitness)
        for pos, i in enumerate(keep):
            if specs[i].op == ELITE:
                parent = state.pool[specs[i].parents[0]]
                assert all(torch.equal(new_state.pool[pos][k], parent[k]) for k in parent)
                assert new_state.sigmas[pos] == state.sigmas[specs[i].parents[0]]
                checked.append(i)

    _, state = run_ga(cfg, 6, objective, random_adapter(0, scale=0.3), hook=hook)
    assert checked  # some elite survived and was checked


def test_an_elite_survives_when_it_stays_the_best():
    cfg = GAConfig(population=5, keep_top=2, parents=2, crossover_rate=0.5, mutation_scale=0.1)
    ga = GeneticAlgorithm(cfg, run_seed=1)
    state = pool_state(ga, n=2)
    specs, payload = ga.ask(state, 4)
    assert [s.op for s in specs[:2]] == [ELITE, ELITE] and all(s.op != ELITE for s in specs[2:])
    fitness = np.array([5.0, 4.0, 1.0, 2.0, 3.0])  # the elites stay best
    told = ga.tell(state, specs, fitness_results(specs[0].generation, fitness))
    new_state, stats = told.state, told.stats
    for pos in range(2):
        assert all(torch.equal(new_state.pool[pos][k], state.pool[pos][k]) for k in state.pool[pos])
    assert new_state.ids == state.ids[:2]
    assert new_state.fitness == [5.0, 4.0] and stats["best_fitness"] == 5.0


# --- 5. selection -----------------------------------------------------------------------------


def select_counts(cfg, fitness, draws=6000, exclude=None):
    ga = GeneticAlgorithm(cfg, run_seed=0)
    rng = random.Random(1234)
    counts = np.zeros(len(fitness), dtype=int)
    for _ in range(draws):
        counts[ga._select(rng, fitness, exclude=exclude)] += 1
    return counts


def chi_square(counts, probs):
    expected = np.asarray(probs) * counts.sum()
    mask = expected > 0
    assert (counts[~mask] == 0).all(), counts
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


FITNESS = [1.0, 4.0, 2.0, 3.0]  # the fittest is position 1, the worst position 0
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27}  # chi-square 0.999 quantiles by degrees of freedom


@pytest.mark.parametrize(
    "cfg",
    [GAConfig(selection="tournament", tournament_size=1, parents=4), GAConfig(selection="truncation", parents=4)],
    ids=["tournament1", "truncation"],
)
def test_uniform_selection(cfg):
    counts = select_counts(cfg, FITNESS)
    assert chi_square(counts, [0.25] * 4) < CHI2_999[3], counts
    counts = select_counts(cfg, FITNESS, exclude=2)
    assert counts[2] == 0
    assert chi_square(counts, [1 / 3, 1 / 3, 0, 1 / 3]) < CHI2_999[2], counts


@pytest.mark.parametrize("size", [2, 3, 4])
def test_tournament_favours_the_fittest(size):
    counts = select_counts(GAConfig(selection="tournament", tournament_size=size, parents=4), FITNESS)
    # Without replacement: the member of rank i (0 best) wins with C(n-1-i, k-1) / C(n, k).
    order = np.argsort(-np.array(FITNESS))
    probs = np.zeros(4)
    for rank, pos in enumerate(order):
        probs[pos] = math.comb(4 - 1 - rank, size - 1) / math.comb(4, size)
    assert chi_square(counts, probs) < CHI2_999[3], (counts, probs)
    assert counts[1] > 1.8 * counts.sum() / 4  # the fittest clearly more often than uniform
    assert counts[0] == 0  # the worst never wins a tournament of two or more


def test_tournament_ignores_unknown_fitness():
    ga = GeneticAlgorithm(GAConfig(selection="tournament", tournament_size=2, parents=3), run_seed=0)
    rng = random.Random(0)
    picks = {ga._select(rng, [float("nan"), 1.0, 2.0]) for _ in range(500)}
    assert picks == {1, 2}  # an unknown (NaN) fitness never beats a known one


# --- 6. convergence and determinism -----------------------------------------------------------


CONVERGE_SHAPES = {}
for _layer in range(LAYERS):
    CONVERGE_SHAPES[f"model.layers.{_layer}.self_attn.q_proj"] = (4, 6)
    CONVERGE_SHAPES[f"model.layers.{_layer}.mlp.down_proj"] = (6, 4)


def converge(crossover, run_seed=0, generations=60):
    lay = layout(rank=1, shapes=CONVERGE_SHAPES)
    objective = objective_for(lay, targets_for(lay))
    start = random_adapter(5, rank=1, scale=0.3, lay=lay)
    cfg = GAConfig(
        population=32,
        keep_top=2,
        parents=6,
        selection="tournament",
        tournament_size=2,
        crossover_rate=0.5,
        crossover=crossover,
        mutation_rate=0.5,
        mutation_scale=0.1,
        self_adaptive=True,
    )
    crossovers = []

    def hook(ga, state, specs, payload, members, fitness, new_state, stats):
        crossovers.append(sum(s.op == CROSSOVER for s in specs))

    ga, state = run_ga(cfg, generations, objective, start, run_seed=run_seed, hook=hook)
    assert sum(crossovers) > generations * 8  # crossover was really used
    return objective(start), objective(ga.center(state)), state


@pytest.mark.parametrize("crossover", ["module", "layer", "blend"])
def test_converges_on_an_analytic_objective(crossover):
    """Maximise -||B A - T||^2 over every module: the GA must find a low-rank fit of T."""
    initial, final, state = converge(crossover)
    assert final >= initial / 5, (initial, final)  # at least 5x closer
    assert state.fitness[0] == final  # the center is the best member, its fitness as evaluated
    assert state.fitness == sorted(state.fitness, reverse=True)


def test_runs_are_deterministic():
    _, _, first = converge("module", run_seed=3, generations=15)
    _, _, second = converge("module", run_seed=3, generations=15)
    _, _, other = converge("module", run_seed=4, generations=15)
    assert first.ids == second.ids and first.sigmas == second.sigmas
    for a, b in zip(first.pool, second.pool):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(first.pool[0][k], other.pool[0][k]) for k in first.pool[0])


def test_tell_needs_the_whole_population_in_order():
    ga = GeneticAlgorithm(GAConfig(population=4, keep_top=1, parents=2), run_seed=0)
    state = ga.start(random_adapter(0))
    specs, _ = ga.ask(state, 0)
    with pytest.raises(ValueError):
        ga.tell(state, specs[::-1], fitness_results(0, np.zeros(4)))


# --- 7. seed-chain encoding -------------------------------------------------------------------


@pytest.mark.parametrize("self_adaptive", [False, True])
def test_seed_encoding_matches_tensor_encoding(self_adaptive):
    lay = layout()
    objective = objective_for(lay, targets_for(lay))
    start = random_adapter(5, scale=0.3)
    scales = {k: 0.5 + i / 10 for i, k in enumerate(start)}
    common = dict(
        population=7,
        keep_top=2,
        parents=3,
        crossover_rate=0.0,
        mutation_rate=0.5,
        mutation_scale=0.05,
        self_adaptive=self_adaptive,
    )
    runs = {}
    for encoding in ("tensors", "seeds"):
        trace = []

        def hook(ga, state, specs, payload, members, fitness, new_state, stats, trace=trace):
            trace.append((specs, payload, members, fitness, state, new_state))

        runs[encoding] = trace
        run_ga(GAConfig(**common, encoding=encoding), 5, objective, start, run_seed=2, noise_scales=scales, hook=hook)
    for (specs_t, payload_t, members_t, fit_t, _, new_t), (specs_s, payload_s, members_s, fit_s, old_s, new_s) in zip(
        runs["tensors"], runs["seeds"]
    ):
        assert specs_t == specs_s
        assert payload_s.pool is None and payload_s.chains is not None  # only the chains travel
        assert np.array_equal(fit_t, fit_s)
        for mt, ms in zip(members_t, members_s):
            assert all(torch.equal(mt[k], ms[k]) for k in mt)
        assert new_t.ids == new_s.ids and new_t.sigmas == new_s.sigmas
        for pt, ps in zip(new_t.pool, new_s.pool):
            assert all(torch.equal(pt[k], ps[k]) for k in pt)
        # chains: one more entry per generation for a mutated member, the same chain for an elite
        keep = sorted(range(len(fit_s)), key=lambda i: (-fit_s[i], i))[: common["parents"]]
        assert len(new_s.chains) == len(keep)
        for chain, i in zip(new_s.chains, keep):
            spec = specs_s[i]
            parent_chain = old_s.chains[spec.parents[0]]
            if spec.op == ELITE:
                assert chain == parent_chain
            else:
                assert spec.op == MUTATE
                assert chain == [*parent_chain, [spec.seed, spec.sigma]]
    assert any(len(c) >= 3 for c in runs["seeds"][-1][5].chains)  # chains really grew over generations


# --- 8. self-adaptive mutation scales ---------------------------------------------------------


@pytest.mark.parametrize("self_adaptive", [False, True])
def test_self_adaptive_scales(self_adaptive):
    cfg = GAConfig(
        population=40,
        keep_top=2,
        parents=4,
        crossover_rate=0.5,
        mutation_rate=1.0,
        self_adaptive=self_adaptive,
        adaptation_rate=0.2,
    )
    ga = GeneticAlgorithm(cfg, run_seed=0)
    state = pool_state(ga, n=4, sigmas=[0.01, 0.02, 0.04, 0.08])
    specs, payload = ga.ask(state, 2)
    ops = {s.op for s in specs}
    assert ops == {ELITE, MUTATE, CROSSOVER}
    for spec in specs:
        inherited = float(np.mean([state.sigmas[p] for p in spec.parents]))
        if spec.op == ELITE:
            assert spec.sigma == state.sigmas[spec.parents[0]]
            continue
        assert spec.sigma > 0
        if spec.op == CROSSOVER:
            assert len(spec.parents) == 2 and spec.parents[0] != spec.parents[1]
        if self_adaptive:
            assert spec.sigma != pytest.approx(inherited, rel=1e-9)
            assert 0.2 < spec.sigma / inherited < 5  # a log-normal step of rate 0.2
        else:
            assert spec.sigma == pytest.approx(inherited, rel=1e-12)
        # the member is mutated with its own scale
        child = ga.materialise(payload, spec)
        first = state.pool[spec.parents[0]]
        if spec.op == CROSSOVER:
            first = CROSSOVERS[cfg.crossover](first, state.pool[spec.parents[1]], spec.seed)
        for k in child:
            want = first[k] + spec.sigma * gaussian(noise_key(spec.seed, "mutation", k), tuple(first[k].shape))
            assert torch.equal(child[k], want)
    if self_adaptive:
        log_steps = [math.log(s.sigma / state.sigmas[s.parents[0]]) for s in specs if s.op == MUTATE]
        assert abs(np.std(log_steps) - 0.2) < 0.1


# --- 9. lineage -------------------------------------------------------------------------------


def test_lineage_records():
    cfg = GAConfig(population=8, keep_top=2, parents=3, crossover_rate=0.4, mutation_scale=0.05)
    lay = layout()
    objective = objective_for(lay, targets_for(lay))
    seen_ids = set()
    generations = []

    def hook(ga, state, specs, payload, members, fitness, new_state, stats):
        records = ga.lineage(state, specs, fitness, new_state)
        generation = specs[0].generation + 1
        generations.append(generation)
        assert len(records) == cfg.population
        ids = [r["id"] for r in records]
        assert len(set(ids)) == len(ids)
        for r, spec in zip(records, specs):
            assert {"id", "parents", "op", "generation", "fitness", "survived"} <= set(r)
            assert r["generation"] == generation and r["op"] == spec.op and r["fitness"] == float(fitness[spec.index])
            if spec.op == ELITE:
                assert r["id"] == state.ids[spec.parents[0]]  # the elite keeps the id of the member it carries
                assert r["parents"] == []
            else:
                assert r["id"] == f"g{generation}-{spec.index:02d}-{spec.op}"
                assert re.fullmatch(r"g\d+-\d{2}-(mutate|crossover)", r["id"])
                assert r["id"] not in seen_ids
                assert r["parents"] == [state.ids[p] for p in spec.parents]
                assert len(r["parents"]) == (2 if spec.op == CROSSOVER else 1)
        survived = [r for r in records if r["survived"]]
        assert len(survived) == cfg.parents
        assert {r["id"] for r in survived} == set(new_state.ids)
        best_first = sorted(survived, key=lambda r: (-r["fitness"], r["index"]))
        assert [r["id"] for r in best_first] == new_state.ids
        assert min(r["fitness"] for r in survived) >= max(r["fitness"] for r in records if not r["survived"])
        seen_ids.update(ids)

    ga, state = run_ga(cfg, 4, objective, random_adapter(0, scale=0.3), hook=hook)
    assert generations == [1, 2, 3, 4]
    assert ga.start(random_adapter(0)).ids == ["g0-00-init"]
    assert GASpec(0, 3, MUTATE, (0,), 1, 0.1).label == "g1-03-mutate"


# --- 10. config validation --------------------------------------------------------------------


def test_ga_config_composes():
    run = compose_run(["+experiment=quickstart/ga"])
    assert isinstance(run.strategy, GAConfig)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ("strategy.keep_top=32", "strategy.keep_top=32: must be in 1..strategy.population - 1"),
        ("strategy.population=4 strategy.keep_top=5 strategy.parents=5", "strategy.keep_top=5:"),
        ("strategy.crossover_rate=1.5", "strategy.crossover_rate=1.5: must be in [0, 1]"),
        ("strategy.mutation_rate=-0.1", "strategy.mutation_rate=-0.1: must be in [0, 1]"),
        ("strategy.population=1", "strategy.population=1: must be an integer >= 2"),
        (
            "strategy.keep_top=1 strategy.parents=1 strategy.crossover_rate=0.5 strategy.tournament_size=1",
            "strategy.crossover_rate=0.5: crossover needs two parents",
        ),
        ("strategy.encoding=seeds strategy.crossover_rate=0.2", 'strategy.encoding="seeds": '),
        ("strategy.tournament_size=9", "strategy.tournament_size=9: must be in 1..strategy.parents (8)"),
        ("strategy.keep_top=3 strategy.parents=2", "strategy.parents=2:"),
        ("strategy.crossover=uniform", 'strategy.crossover="uniform": allowed: module, layer, blend'),
        ("strategy.selection=roulette", 'strategy.selection="roulette": allowed: truncation, tournament'),
    ],
)
def test_bad_ga_configs_fail_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        compose_run(["+experiment=quickstart/ga", *overrides.split(" ")])
    assert message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


def test_seed_encoding_without_crossover_is_valid():
    run = compose_run(["+experiment=quickstart/ga", "strategy.encoding=seeds", "strategy.crossover_rate=0"])
    assert run.strategy.encoding == "seeds"


def test_nan_fitness_never_survives():
    from evora.strategies.ga import GAConfig, GeneticAlgorithm

    ga = GeneticAlgorithm(GAConfig(population=3, keep_top=1, parents=2), run_seed=0)
    assert ga.survivors(np.array([1.0, float("nan"), 2.0])) == [2, 0]


def test_driver_replaces_broken_fitness_with_the_worst_finite_value():
    from evora.distributed.search import finite_fitness

    fixed, invalid = finite_fitness(np.array([0.5, float("nan"), 0.2, float("inf")]))
    assert invalid == 2 and list(fixed) == [0.5, 0.2, 0.2, 0.2]
    assert list(finite_fitness(np.array([float("nan")]))[0]) == [0.0]
