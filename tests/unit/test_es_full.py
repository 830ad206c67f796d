"""strategy=es_full's maths against independent references: the update equals a float64
computation from the same noise (zscore; antithetic pairs; weight decay), a candidate is
master + sign sigma eps and leaves the master untouched, the noise is a pure function of
(seed, generation, member, matrix name), replays agree bit for bit, bad settings fail in
one line, and the shipped yaml composes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evora.errors import ConfigError
from evora.lora.layout import AdapterLayout, ModuleSlot
from evora.lora.noise import noise_key
from evora.plan.compose import compose_run
from evora.strategies import get_strategy
from evora.strategies.es_full import EsFullConfig, EsFullStrategy, check_es_full
from evora.strategies.full_weights import matrix_name
from evora.strategies.kinds import FULL_WEIGHT
from evora.strategies.master_weights import MasterWeights
from evora.strategies.protocol import StrategyContext, fitness_results

SLOTS = (
    ModuleSlot("model.layers.0.mlp.down_proj", 0, 24, 16),
    ModuleSlot("model.layers.1.self_attn.o_proj", 1, 16, 16),
    ModuleSlot("transformer.h.0.mlp.c_fc", 0, 12, 20),  # a Conv1D: stored [in, out] = [12, 20]
)
CONV1D = matrix_name(SLOTS[2].name)
SEED = 7


def make(**overrides) -> tuple[EsFullStrategy, object]:
    cfg = EsFullConfig(**{"population": 6, "sigma": 0.1, "lr": 0.01, **overrides})
    es = EsFullStrategy(cfg, run_seed=SEED)
    state = es.initial_state(StrategyContext(SEED, AdapterLayout(SLOTS, 1, 1.0, ("x",), None, "tiny"), "tiny"))
    return es, state


def base_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for slot in SLOTS:
        name = matrix_name(slot.name)
        stored = (slot.in_features, slot.out_features) if name == CONV1D else (slot.out_features, slot.in_features)
        out[name] = torch.randn(*stored, generator=generator) * 0.05
    return out


def master_of(es: EsFullStrategy, seed: int = 0) -> MasterWeights:
    return es.start_master(base_weights(seed), frozenset({CONV1D}))


def eps64(generation: int, member: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The noise regenerated independently of the strategy, widened to float64."""
    generator = torch.Generator().manual_seed(noise_key(SEED, "es_full", generation, member, name))
    return torch.randn(shape, generator=generator, dtype=torch.float32).double()


def told(es, state, generation, fitness):
    specs, _ = es.ask(state, generation)
    return es.tell(state, specs, fitness_results(generation, np.asarray(fitness, dtype=np.float64))).state


def zscore64(f) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    return (f - f.mean()) / f.std()


@pytest.mark.parametrize(
    ("overrides", "members_and_signs"),
    [
        ({}, [(i, 1) for i in range(6)]),
        ({"antithetic": True}, [(0, 1), (0, -1), (1, 1), (1, -1), (2, 1), (2, -1)]),
        ({"weight_decay": 0.3}, [(i, 1) for i in range(6)]),
    ],
)
def test_the_update_equals_a_float64_computation_from_the_same_noise(overrides, members_and_signs):
    es, state = make(**overrides)
    specs, _ = es.ask(state, 0)
    assert [(s.member, s.sign) for s in specs] == members_and_signs
    fitness = [0.3, -1.0, 2.0, 0.5, 0.0, 1.5]
    state = told(es, state, 0, fitness)
    master = master_of(es)
    before = {k: v.double() for k, v in master.tensors.items()}
    norm = es.apply(master, es.update_of(state, 0))
    z, lr, wd, squares = zscore64(fitness), 0.01, overrides.get("weight_decay", 0.0), 0.0
    for name, w in before.items():
        # W + lr / N sum_i z_i sign_i eps_m(i) - lr wd W: no division by sigma (the paper's update).
        step = sum(
            zi * sign * eps64(0, member, name, tuple(w.shape)) for zi, (member, sign) in zip(z, members_and_signs)
        )
        expected = w + lr / 6 * step - lr * wd * w
        assert master.tensors[name].shape == w.shape  # the Conv1D stays [in, out]
        torch.testing.assert_close(master.tensors[name].double(), expected, rtol=0, atol=1e-6)
        squares += float(((expected - w) ** 2).sum())
    assert norm == pytest.approx(squares**0.5, rel=1e-5)
    assert master.generation == 1


def test_a_candidate_is_master_plus_sign_sigma_eps_and_leaves_the_master_untouched():
    es, state = make(antithetic=True)
    specs, payload = es.ask(state, 0)
    master = master_of(es)
    original = {k: v.clone() for k, v in master.tensors.items()}
    checksum = master.checksum()
    for spec in specs[:4]:
        candidate = es.perturbed(master, payload, spec)
        assert set(candidate) == set(master.tensors)
        for name, w in master.tensors.items():
            eps = es.noise(0, spec.member, name, tuple(w.shape))
            assert candidate[name].dtype == torch.float32 and candidate[name].shape == w.shape
            assert torch.equal(candidate[name], w + (spec.sign * 0.1) * eps)  # bitwise
            assert candidate[name].data_ptr() != w.data_ptr()
    assert master.checksum() == checksum
    assert all(torch.equal(master.tensors[k], original[k]) for k in original)
    plus, minus = es.perturbed(master, payload, specs[0]), es.perturbed(master, payload, specs[1])
    for name, w in master.tensors.items():  # a pair is symmetric about the master
        torch.testing.assert_close(plus[name] + minus[name], 2 * w, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="candidate of generation 1 on weights of generation 0"):
        es.perturbed(master, es.ask(state, 1)[1], es.ask(state, 1)[0][0])
    with pytest.raises(TypeError, match="not a LoRA"):
        es.materialise(payload, specs[0])


def test_noise_is_a_pure_function_of_seed_generation_member_and_matrix():
    es, _ = make()
    a, b = matrix_name(SLOTS[0].name), matrix_name(SLOTS[1].name)
    assert torch.equal(es.noise(2, 3, a, (16, 24)), es.noise(2, 3, a, (16, 24)))
    assert torch.equal(es.noise(2, 3, a, (16, 24)), EsFullStrategy(es.cfg, SEED).noise(2, 3, a, (16, 24)))
    assert torch.equal(es.noise(2, 3, a, (16, 24)).double(), eps64(2, 3, a, (16, 24)))
    others = [
        es.noise(2, 4, a, (16, 24)),
        es.noise(3, 3, a, (16, 24)),
        EsFullStrategy(es.cfg, 8).noise(2, 3, a, (16, 24)),
    ]
    assert all(not torch.allclose(o, es.noise(2, 3, a, (16, 24))) for o in others)
    assert not torch.allclose(es.noise(2, 3, a, (16, 16)), es.noise(2, 3, b, (16, 16)))  # same shape, other matrix


def test_replay_from_fitness_is_bitwise_equal_on_two_masters_and_from_a_snapshot():
    es, state = make(weight_decay=0.01)
    for generation in range(4):
        state = told(es, state, generation, np.random.default_rng(generation).normal(size=6))
    first, second, other = master_of(es), master_of(es), master_of(es)
    norms = [es.apply(first, es.update_of(state, g)) for g in range(4)]
    assert norms == [es.apply(second, es.update_of(state, g)) for g in range(4)]
    assert first.checksum() == second.checksum() != master_of(es).checksum()
    for generation in range(2):
        es.apply(other, es.update_of(state, generation))
    replayed = MasterWeights.from_snapshot(other.snapshot(), 2, other.transposed)  # what a resumed worker loads
    for generation in (2, 3):
        es.apply(replayed, es.update_of(state, generation))
    assert replayed.checksum() == first.checksum()
    with pytest.raises(ValueError, match="update of generation 1 on weights of generation 4"):
        es.apply(first, es.update_of(state, 1))
    with pytest.raises(ValueError, match="tell of generation 1 after 4 generations"):
        told(es, state, 1, np.zeros(6))


def test_ties_move_nothing():
    es, state = make()
    specs, _ = es.ask(state, 0)
    result = es.tell(state, specs, fitness_results(0, np.ones(6)))
    assert result.stats == {"members_tied": 1.0}
    master = master_of(es)
    checksum = master.checksum()
    assert es.apply(master, es.update_of(result.state, 0)) == 0.0
    assert master.checksum() == checksum and master.generation == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"population": 1}, "strategy.population=1: must be an integer >= 2"),
        ({"population": 7, "antithetic": True}, "strategy.population=7: must be even with strategy.antithetic=true"),
        ({"sigma": 0.0}, "strategy.sigma=0.0: must be > 0"),
        ({"lr": -1.0}, "strategy.lr=-1.0: must be > 0"),
        ({"weight_decay": -0.1}, "strategy.weight_decay=-0.1: must be >= 0"),
        ({"shaping": "rank"}, 'strategy.shaping="rank": allowed: zscore, centered_rank, nes, none, per_prompt'),
        ({"snapshot_every": 0}, "strategy.snapshot_every=0: must be an integer >= 1"),
        ({"delta_rank": 0}, "strategy.delta_rank=0: must be an integer >= 1"),
    ],
)
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        check_es_full(EsFullConfig(**overrides))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_an_odd_population_is_fine_without_pairs():
    check_es_full(EsFullConfig(population=7))


def test_the_shipped_yaml_composes_with_the_papers_defaults():
    entry = get_strategy("es_full")
    assert entry.kind is FULL_WEIGHT and entry.in_place and entry.center == "delta"
    # No experiment named: the strategy's own yaml, the paper's values.
    run = compose_run(["strategy=es_full", "model=qwen2_5_0_5b"])
    assert run.strategy == EsFullConfig()
    assert (run.strategy.population, run.strategy.sigma, run.strategy.lr) == (30, 0.001, 5e-4)
    assert not run.strategy.antithetic and run.strategy.shaping == "zscore"
    with pytest.raises(ConfigError) as error:
        compose_run(["strategy=es_full", "strategy.antithetic=true", "strategy.population=5"])
    assert str(error.value).startswith("strategy.population=5: must be even")
    with pytest.raises(ConfigError) as error:
        compose_run(["strategy=es_full", "hardware=gpu", "engine=hf", "hardware.tensor_parallel_size=2"])
    assert str(error.value) == (
        "hardware.tensor_parallel_size=2: > 1 needs GPU engines (hardware.gpus_per_worker=1) that shard a model: "
        "engine=vllm"
    )


def test_the_update_of_the_tiny_models_matrix_equals_a_float64_computation(tiny_path):
    """On a real model's weights (the bundled tiny model's layer-1 down_proj, 128 x 384)."""
    from evora.lora.base_weights import read_weights
    from evora.strategies.es_full.strategy import EsFullState

    name = "model.layers.1.mlp.down_proj.weight"
    weights = read_weights(tiny_path, [name])
    es = EsFullStrategy(EsFullConfig(population=6, sigma=0.02, lr=0.02), run_seed=SEED)
    state = EsFullState([name.removesuffix(".weight")], [list(weights[name].shape)])
    fitness = [0.25, 0.5, 0.0, 0.75, 0.5, 1.0]
    state = told(es, state, 0, fitness)
    master = es.start_master(weights)
    es.apply(master, es.update_of(state, 0))
    shape = tuple(weights[name].shape)
    step = sum(z * eps64(0, m, name, shape) for m, z in enumerate(zscore64(fitness)))
    expected = weights[name].double() + (0.02 / 6) * step
    assert torch.allclose(master.tensors[name].double(), expected, rtol=0, atol=1e-7)
    assert not torch.equal(master.tensors[name], weights[name].float())


def test_the_plan_puts_the_master_copies_on_the_gpu_when_they_fit_beside_the_engine():
    """hardware.master_weights=auto: on the GPU when the fp32 copies (and a margin) fit in what
    vLLM leaves of it, on the host otherwise; device/host choose; CPU workers keep them on the CPU."""
    from evora.lora.modules import model_modules
    from evora.models import locate_model
    from evora.models.memory import GIB
    from evora.plan.fit import MASTER_MARGIN, master_device, plan_memory
    from evora.plan.run_plan import model_layout

    def placed(*overrides: str) -> tuple[str, int]:
        run = compose_run(["+experiment=quickstart/es_full", *overrides])
        path = locate_model(run.model.path).path
        modules = model_modules(path)
        memory = plan_memory(run, modules, model_layout(run, modules, path))
        return master_device(run, memory), memory.master

    device, master = placed()
    assert device == "cpu" and master > 0  # CPU workers
    gpu = ["hardware=gpu", "hardware.num_workers=1"]
    # What vLLM leaves of a GPU: (1 - 0.85) x size. 80 GiB leaves 12 GiB: the tiny model's copies fit.
    assert placed(*gpu, "hardware.gpu_memory_gib=80")[0] == "cuda"
    # A GPU whose 15% is below the margin: the host.
    assert placed(*gpu, f"hardware.gpu_memory_gib={(MASTER_MARGIN / GIB) / 0.15 * 0.9:.3f}")[0] == "cpu"
    assert placed(*gpu, "hardware.gpu_memory_gib=80", "hardware.master_weights=host")[0] == "cpu"
    assert placed(*gpu, "hardware.gpu_memory_gib=1", "hardware.master_weights=device")[0] == "cuda"
    assert placed("hardware.master_weights=device")[0] == "cpu"  # a CPU worker's device is the CPU
