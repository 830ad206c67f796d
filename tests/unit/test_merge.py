"""strategy=merge: candidates against hand-computed combinations of their sources (float64), CMA-ES
only through `cma`'s own ask/tell (the strategy's asks are those of an optimiser driven directly),
exact replay after a resume, and its checks before Ray."""

from __future__ import annotations

import dataclasses
import math

import cma
import numpy as np
import pytest
import torch

from evora.errors import ConfigError
from evora.lora.layout import build_layout
from evora.lora.noise import noise_key
from evora.lora.peft_io import save_adapter
from evora.strategies.merge.combine import combine
from evora.strategies.merge.config import MergeConfig, check_merge
from evora.strategies.merge.sources import load_sources
from evora.strategies.merge.strategy import Merge, MergeState
from evora.strategies.protocol import StrategyContext, fitness_results, state_fields

SHAPES = {
    "model.layers.0.mlp.down_proj": (6, 10),
    "model.layers.1.mlp.down_proj": (6, 10),
    "model.layers.1.self_attn.q_proj": (8, 8),
}


def layout(rank: int, alpha: float, layers=None, targets=("down_proj", "q_proj")):
    return build_layout(SHAPES, rank=rank, alpha=alpha, target_modules=list(targets), layers=layers, base_model="m")


def random_adapter(lay, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=generator) for k, shape in lay.shapes().items()}


@pytest.fixture
def sources(tmp_path):
    """Three adapters of ranks 1, 2 and 1 and scales 2, 0.5 and 1 (alpha / r); the third adapts
    only layer 1."""
    folders = []
    for i, (rank, alpha, layers) in enumerate([(1, 2.0, None), (2, 1.0, None), (1, 1.0, [1])]):
        lay = layout(rank, alpha, layers)
        folders.append(str(save_adapter(tmp_path / f"a{i}", random_adapter(lay, i), lay)))
    return folders


def delta(tensors, prefix: str, scale: float) -> torch.Tensor:
    a, b = tensors[f"base_model.model.{prefix}.lora_A.weight"], tensors[f"base_model.model.{prefix}.lora_B.weight"]
    return scale * b.double() @ a.double()


def source_deltas(folders, prefix: str) -> list[torch.Tensor]:
    """Each adapter's own delta s_i B_i A_i, read as PEFT would (zeros where it has none)."""
    from evora.lora.peft_io import load_adapter_tensors, read_adapter_config

    out = []
    for folder in folders:
        config, tensors = read_adapter_config(folder), load_adapter_tensors(folder)
        has = f"base_model.model.{prefix}.lora_A.weight" in tensors
        out.append(delta(tensors, prefix, config["lora_alpha"] / config["r"]) if has else 0)
    return out


def test_concat_is_the_weighted_sum_of_the_adapters_deltas(sources):
    run = layout(8, 4.0)  # scale 0.5, rank 8 >= 1 + 2 + 1
    loaded = load_sources(sources, run)
    weights = np.array([[0.7], [-0.4], [1.3]])
    merged = combine(loaded, weights, run.rank, "concat")
    assert {k: tuple(v.shape) for k, v in merged.items()} == run.shapes()
    for prefix in SHAPES:
        expected = sum(w * d for w, d in zip(weights[:, 0], source_deltas(sources, prefix)))
        torch.testing.assert_close(delta(merged, prefix, run.scale), expected, rtol=1e-5, atol=1e-6)
    # the directions side by side: A_1, A_2, A_3, then zeros up to lora.rank
    a = merged["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
    assert torch.equal(a[4:], torch.zeros(4, 10)) and torch.equal(
        a[0], loaded[0]["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"][0]
    )


def test_per_layer_weights_weigh_each_layers_modules(sources):
    run = layout(8, 8.0)
    loaded = load_sources(sources, run)
    weights = np.array([[0.5, 2.0], [1.0, -1.0], [3.0, 0.25]])  # [adapter, layer 0 | layer 1]
    merged = combine(loaded, weights, run.rank, "concat")
    for prefix in SHAPES:
        layer = int(prefix.split(".")[2])
        expected = sum(w * d for w, d in zip(weights[:, layer], source_deltas(sources, prefix)))
        torch.testing.assert_close(delta(merged, prefix, run.scale), expected, rtol=1e-5, atol=1e-6)


def test_lorahub_sums_the_factors_as_loraHub_does(tmp_path):
    run = layout(2, 2.0)
    folders = [str(save_adapter(tmp_path / f"h{i}", random_adapter(run, 10 + i), run)) for i in range(2)]
    loaded = load_sources(folders, run)
    merged = combine(loaded, np.array([[0.25], [1.5]]), run.rank, "lorahub")
    for name in run.shapes():
        expected = 0.25 * loaded[0][name].double() + 1.5 * loaded[1][name].double()
        torch.testing.assert_close(merged[name].double(), expected, rtol=0, atol=1e-6)


def merge_state(sources, seed=0, **overrides):
    cfg = MergeConfig(adapters=sources, **overrides)
    strategy = Merge(cfg, seed)
    state = strategy.initial_state(StrategyContext(seed, layout(8, 8.0), "m"))
    return cfg, strategy, state


def objective(weights: np.ndarray) -> np.ndarray:
    """A fitness to maximise: the closer to (1, -0.5, 0.25), the higher."""
    return -np.sum((weights - np.array([1.0, -0.5, 0.25])) ** 2, axis=1)


def test_asks_are_those_of_cma_driven_directly_and_never_touch_numpys_global_generator(sources):
    cfg, strategy, state = merge_state(sources, population=6)
    generator = np.random.default_rng(noise_key(0, "merge"))
    options = {"seed": math.nan, "randn": lambda *s: generator.standard_normal(s), "popsize": 6, "verbose": -9}
    direct = cma.CMAEvolutionStrategy([1 / 3] * 3, cfg.sigma, options)
    for generation in range(5):
        np.random.seed(generation)  # another user of the global generator changes nothing
        specs, payload = strategy.ask(state, generation)
        asked = np.array(direct.ask())
        assert np.array_equal(payload.weights, asked) and len(specs) == 6
        fitness = objective(asked)
        direct.tell(asked, list(-fitness))
        state = strategy.tell(state, specs, fitness_results(generation, fitness)).state
        assert np.array_equal(state.mean, direct.result.xfavorite)
    assert objective(np.array([state.mean]))[0] > objective(np.array([state.start]))[0]


def test_a_resumed_strategy_replays_cma_to_the_same_next_candidates(sources):
    _, strategy, state = merge_state(sources, granularity="layer", bounds=[-1.5, 1.5])
    assert len(state.start) == 6  # 3 adapters x 2 layers
    for generation in range(3):
        specs, payload = strategy.ask(state, generation)
        state = strategy.tell(state, specs, fitness_results(generation, -np.abs(payload.weights).sum(axis=1))).state
    restarted = Merge(strategy.cfg, 0)  # a new driver: the state from its checkpoint's fields
    again = MergeState(**{k: v for k, v in state_fields(state).items()})
    assert np.array_equal(restarted.ask(again, 3)[1].weights, strategy.ask(state, 3)[1].weights)
    assert np.all(np.abs(strategy.ask(state, 3)[1].weights) <= 1.5)


def test_a_candidate_is_its_row_of_weights_and_the_center_the_mean(sources):
    _, strategy, state = merge_state(sources, population=4)
    specs, payload = strategy.ask(state, 0)
    candidate = strategy.materialise(payload, specs[2])
    expected = combine(state.sources, payload.weights[2].reshape(3, 1), 8, "concat")
    assert all(torch.equal(candidate[k], expected[k]) for k in expected)
    center = strategy.center(state)
    uniform = combine(state.sources, np.full((3, 1), 1 / 3), 8, "concat")
    assert all(torch.equal(center[k], uniform[k]) for k in uniform)  # before any tell: the uniform average


@dataclasses.dataclass
class Lora:
    rank: int


@dataclasses.dataclass
class Run:
    lora: Lora


@pytest.mark.parametrize(
    "overrides,rank,message",
    [
        ({"adapters": ["A0"]}, 8, "]: must name at least two adapters to merge"),
        ({}, 2, "lora.rank=2: must be at least 4 for strategy.combine=concat of ranks [1, 2, 1]"),
        (
            {"adapters": ["A0", "/no/such/adapter"]},
            8,
            'strategy.adapters[1]="/no/such/adapter": not a PEFT adapter folder',
        ),
        ({"bounds": [0.5, 1.0]}, 8, "strategy.bounds=[0.5, 1.0]: must hold the initial weight 0.333333"),
        ({"granularity": "module"}, 8, "strategy.granularity"),
        ({"on_cma_stop": "pause"}, 8, 'strategy.on_cma_stop="pause": allowed: stop, restart'),
    ],
)
def test_bad_merges_fail_in_one_line(sources, overrides, rank, message):
    adapters = [sources[0] if a == "A0" else a for a in overrides.pop("adapters", sources)]
    with pytest.raises(ConfigError) as error:
        check_merge(MergeConfig(adapters=adapters, **overrides), Run(Lora(rank)))
    assert message in str(error.value) and "\n" not in str(error.value)
    check_merge(MergeConfig(adapters=sources, combine="lorahub"), Run(Lora(2)))  # lorahub: the widest, 2


def test_an_adapter_on_modules_the_run_leaves_out_is_refused(sources):
    with pytest.raises(ConfigError, match=r'strategy.adapters\[0\]=".*": adapts .*q_proj.*, which lora.target_modules'):
        load_sources(sources, layout(8, 8.0, targets=("down_proj",)))


# --- when CMA-ES says stop --------------------------------------------------------------------


def cma_driven_directly(population: int, seed: int = 0, start=None, key=None) -> cma.CMAEvolutionStrategy:
    """CMA-ES with the strategy's options, told and asked here (pycma's own loop)."""
    generator = np.random.default_rng(noise_key(seed, "merge") if key is None else key)
    options = {"seed": math.nan, "randn": lambda *s: generator.standard_normal(s), "popsize": population, "verbose": -9}
    return cma.CMAEvolutionStrategy([1 / 3] * 3 if start is None else start, 0.2, options)


def flat_after_first(weights: np.ndarray, generation: int) -> np.ndarray:
    """Generation 0 ranked; after it every candidate of a generation ties (a fitness that cannot rank
    them), at a value that differs from generation to generation."""
    return objective(weights) if generation == 0 else np.full(len(weights), 0.1 * generation)


def test_a_constant_fitness_ends_the_run_with_cmas_reason_after_its_first_generation(sources):
    _, strategy, state = merge_state(sources, population=6)
    direct = cma_driven_directly(6)
    specs, payload = strategy.ask(state, 0)
    direct.tell(direct.ask(), [0.0] * 6)
    told = strategy.tell(state, specs, fitness_results(0, np.zeros(6)))
    reasons = direct.stop()
    assert "tolfun" in reasons  # what pycma itself says of a constant fitness
    expected = ", ".join(f"{name}={value}" for name, value in reasons.items())
    assert told.stop is not None and f"CMA-ES's stop() says {expected} " in told.stop
    assert told.records["merge_weights.jsonl"][0]["cma_stop"] == expected


def test_candidates_tied_in_two_generations_running_stop_on_tolflatfitness(sources):
    _, strategy, state = merge_state(sources, population=6)
    direct = cma_driven_directly(6)
    stops = []
    for generation in range(3):
        specs, payload = strategy.ask(state, generation)
        assert np.array_equal(payload.weights, direct.ask())
        fitness = flat_after_first(payload.weights, generation)
        direct.tell(payload.weights, list(-fitness))
        told = strategy.tell(state, specs, fitness_results(generation, fitness))
        state, reasons = told.state, direct.stop()
        stops.append(told.stop)
        assert (told.stop is None) == (not reasons)
    # pycma tolerates one flat generation; the generations' best differ, so no tolfun
    assert stops[:2] == [None, None] and "says tolflatfitness=1 (" in stops[2]


def test_a_ranked_fitness_does_not_stop(sources):
    _, strategy, state = merge_state(sources, population=6)
    for generation in range(10):
        specs, payload = strategy.ask(state, generation)
        told = strategy.tell(state, specs, fitness_results(generation, objective(payload.weights)))
        assert told.stop is None, told.stop
        state = told.state


def test_a_restart_is_a_fresh_cma_from_the_mean_and_a_resume_replays_it_exactly(sources):
    cfg, strategy, state = merge_state(sources, population=6, on_cma_stop="restart")
    asked, means, reasons = [], [], []
    for generation in range(6):
        specs, payload = strategy.ask(state, generation)
        asked.append(payload.weights)
        told = strategy.tell(state, specs, fitness_results(generation, flat_after_first(payload.weights, generation)))
        assert told.stop is None  # restarted instead
        state = told.state
        means.append(state.mean)
        reasons.append(told.records["merge_weights.jsonl"][0]["cma_stop"])
    # the first restart after tolflatfitness (generation 3, as above); then a restart after each tied
    # generation, each new CMA-ES's first (tolfun: one generation's history, flat)
    assert state.restarts == [3, 4, 5, 6] and told.stats["cma_restarts"] == 4
    assert reasons[:2] == [None, None] and "tolflatfitness=1" in reasons[2] and "tolfun=" in reasons[3]
    # the first restart: CMA-ES from the mean after generation 3, the initial sigma, a generator of its own
    fresh = cma_driven_directly(6, start=means[2], key=noise_key(0, "merge", 1))
    assert np.array_equal(asked[3], fresh.ask()) and not np.array_equal(asked[3], cma_driven_directly(6).ask())
    # a resumed driver (the checkpoint's fields) replays the tells and restarts to the same asks
    for generation in range(7):
        told_so_far = {"told": state.told[:generation], "restarts": [r for r in state.restarts if r <= generation]}
        partial = MergeState(**{**state_fields(state), **told_so_far})
        weights = Merge(cfg, 0).ask(partial, generation)[1].weights
        assert np.array_equal(weights, asked[generation] if generation < 6 else strategy.ask(state, 6)[1].weights)
