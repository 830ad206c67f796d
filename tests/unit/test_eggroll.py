"""strategy=eggroll's maths against independent references: candidates are sign sigma E as
LoRAs, the update equals the per-candidate sum built from those LoRAs (SGD) and torch's own
Adam, replay from a snapshot is bitwise the straight run, fp32 master copies keep updates
that bf16 rounds away, the delta adapter is the Eckart-Young truncation, and the exported
model folder loads in transformers; distribution=snes adapts a sigma per matrix by SNES's rule."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from evora.errors import ConfigError
from evora.lora.layout import AdapterLayout, ModuleSlot
from evora.lora.resize import low_rank_delta
from evora.strategies.eggroll import EggrollConfig, EggrollStrategy, check_eggroll
from evora.strategies.full_weights import matrix_name
from evora.strategies.master_weights import MasterWeights
from evora.strategies.protocol import StrategyContext, fitness_results

SLOTS = (
    ModuleSlot("model.layers.0.mlp.down_proj", 0, 24, 16),
    ModuleSlot("model.layers.1.self_attn.o_proj", 1, 16, 16),
)


def layout(rank: int, alpha: float) -> AdapterLayout:
    return AdapterLayout(SLOTS, rank, alpha, ("down_proj", "o_proj"), None, "tiny")


def strategy(**overrides) -> tuple[EggrollStrategy, object]:
    cfg = EggrollConfig(**{"population": 6, "rank": 2, "sigma": 0.1, "lr": 0.01, **overrides})
    eggroll = EggrollStrategy(cfg, run_seed=7)
    state = eggroll.initial_state(StrategyContext(7, layout(cfg.rank, 3.0 * cfg.rank), "tiny"))
    return eggroll, state


def base_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {matrix_name(s.name): torch.randn(s.out_features, s.in_features, generator=generator) * 0.05 for s in SLOTS}


def lora_product(tensors, slot, scale) -> torch.Tensor:
    return scale * tensors[slot.b_key].double() @ tensors[slot.a_key].double()


def told(eggroll, state, generation, fitness):
    specs, _ = eggroll.ask(state, generation)
    return eggroll.tell(state, specs, fitness_results(generation, np.asarray(fitness, dtype=np.float64))).state


def test_candidates_are_sign_sigma_e_as_a_lora_at_any_scale():
    eggroll, state = strategy()
    specs, payload = eggroll.ask(state, generation=3)
    assert payload.scale == 3.0
    plus, minus = eggroll.materialise(payload, specs[4]), eggroll.materialise(payload, specs[5])
    for slot in SLOTS:
        b, a = eggroll.factors(3, specs[4].member, slot.name, slot.out_features, slot.in_features)
        expected = 0.1 * (b.double() @ a.double()) / math.sqrt(2)
        assert torch.allclose(lora_product(plus, slot, 3.0), expected, atol=1e-6)
        assert torch.allclose(lora_product(minus, slot, 3.0), -expected, atol=1e-6)
    other = eggroll.materialise(payload, specs[0])  # another member: other noise
    assert not torch.allclose(other[SLOTS[0].b_key], plus[SLOTS[0].b_key])


def test_sgd_update_equals_the_sum_over_candidates_built_from_their_loras():
    eggroll, state = strategy(shaping="none")
    fitness = [0.3, -1.0, 2.0, 0.5, 0.0, 1.5]
    state = told(eggroll, state, 0, fitness)
    master = eggroll.start_master(base_weights())
    before = {k: v.clone() for k, v in master.tensors.items()}
    eggroll.apply(master, eggroll.update_of(state, 0))
    # W + lr / (N sigma) sum_i w_i sign_i E_i, where candidate i's LoRA is sign_i sigma E_i.
    specs, payload = eggroll.ask(state, 0)
    for slot in SLOTS:
        reference = sum(
            w * lora_product(eggroll.materialise(payload, spec), slot, payload.scale) / 0.1
            for spec, w in zip(specs, fitness)
        )
        expected = before[matrix_name(slot.name)].double() + 0.01 / (6 * 0.1) * reference
        assert torch.allclose(master.tensors[matrix_name(slot.name)].double(), expected, atol=1e-6)
    assert master.generation == 1


def test_adam_update_equals_torch_adam_on_the_same_gradients():
    eggroll, state = strategy(optimizer="adam", lr=0.003, weight_decay=0.0)
    master = eggroll.start_master(base_weights())
    name = matrix_name(SLOTS[0].name)
    parameter = torch.nn.Parameter(master.tensors[name].clone())
    optimizer = torch.optim.Adam([parameter], lr=0.003, betas=(0.9, 0.999), eps=1e-8)
    for generation, fitness in enumerate([[1, 0, 2, 0, 0, 3], [0, 1, 1, 0, 2, 2], [3, 1, 0, 0, 1, 1]]):
        state = told(eggroll, state, generation, fitness)
        update = eggroll.update_of(state, generation)
        parameter.grad = -eggroll.gradient(update, SLOTS[0].name, 16, 24)  # Adam descends; ES ascends
        optimizer.step()
        eggroll.apply(master, update)
    assert torch.allclose(master.tensors[name], parameter.detach(), atol=1e-6)


def test_the_update_coefficients_add_each_pair_with_its_signs():
    eggroll, state = strategy(shaping="none")
    specs, _ = eggroll.ask(state, 0)
    result = eggroll.tell(state, specs, fitness_results(0, np.array([3.0, 1.0, 0.5, 0.5, -1.0, 2.0])))
    assert eggroll.update_of(result.state, 0).coefficients == (2.0, 0.0, -3.0)
    assert result.stats == {"pairs_tied": pytest.approx(1 / 3)}  # the middle pair moves nothing
    with pytest.raises(ValueError, match="tell of generation 0 after 1 generations"):
        eggroll.tell(result.state, specs, fitness_results(0, np.zeros(6)))


def test_replay_from_a_snapshot_is_bitwise_the_straight_run():
    eggroll, state = strategy(optimizer="adam")
    for generation in range(4):
        state = told(eggroll, state, generation, np.random.default_rng(generation).normal(size=6))
    straight, other = eggroll.start_master(base_weights()), eggroll.start_master(base_weights())
    for generation in range(4):
        eggroll.apply(straight, eggroll.update_of(state, generation))
        if generation < 2:
            eggroll.apply(other, eggroll.update_of(state, generation))
    replayed = MasterWeights.from_snapshot(other.snapshot(), 2)  # what a resumed worker loads
    for generation in (2, 3):
        eggroll.apply(replayed, eggroll.update_of(state, generation))
    assert replayed.checksum() == straight.checksum()
    assert all(torch.equal(replayed.tensors[k], straight.tensors[k]) for k in straight.tensors)
    with pytest.raises(ValueError, match="update of generation 1 on weights of generation 4"):
        eggroll.apply(straight, eggroll.update_of(state, 1))


def test_fp32_master_copies_keep_updates_that_bf16_rounds_away():
    """Each update is far below bf16's resolution at these weights (spacing 2^-7 in [1, 2)):
    applied to bf16 weights directly they vanish; accumulated in the fp32 master they move
    the bf16 weights the engine is given."""
    eggroll, state = strategy(population=4, rank=1, sigma=1.0, lr=3e-4, shaping="zscore")
    weights = {k: (1.5 + 0.1 * torch.rand_like(v)).to(torch.bfloat16) for k, v in base_weights().items()}
    master = eggroll.start_master(weights)
    without = {k: v.clone() for k, v in weights.items()}
    steps = 600
    for generation in range(steps):
        state = told(eggroll, state, generation, np.random.default_rng(generation).normal(size=4))
        before = {k: v.clone() for k, v in master.tensors.items()}
        eggroll.apply(master, eggroll.update_of(state, generation))
        for k in without:
            delta = master.tensors[k] - before[k]
            assert float(delta.abs().max()) < 2**-7 / 2  # every single update is below half a bf16 step
            without[k] = (without[k].float() + delta).to(torch.bfloat16)
    for k, original in weights.items():
        moved_with_master = (master.tensors[k].to(torch.bfloat16) != original).float().mean()
        moved_without = (without[k] != original).float().mean()
        assert moved_without == 0.0
        assert moved_with_master > 0.15, float(moved_with_master)


def test_delta_adapter_is_the_eckart_young_truncation_with_its_error():
    generator = torch.Generator().manual_seed(3)
    deltas = {s.name: torch.randn(s.out_features, s.in_features, generator=generator) for s in SLOTS}
    small = layout(4, 8.0)  # scale 2: B is divided by it
    tensors, error = low_rank_delta(deltas, small)
    dropped, total = 0.0, 0.0
    for slot in SLOTS:
        u, s, vh = np.linalg.svd(deltas[slot.name].double().numpy(), full_matrices=False)
        truncated = (u[:, :4] * s[:4]) @ vh[:4]
        assert np.allclose(lora_product(tensors, slot, 2.0).numpy(), truncated, atol=1e-4)
        dropped, total = dropped + (s[4:] ** 2).sum(), total + (s**2).sum()
    assert error == pytest.approx(math.sqrt(dropped / total), rel=1e-9)
    whole, exact = low_rank_delta(deltas, layout(16, 16.0))  # rank >= every module's: exact
    assert exact < 1e-6
    for slot in SLOTS:
        assert torch.allclose(lora_product(whole, slot, 1.0).float(), deltas[slot.name], atol=1e-4)


def test_exported_model_folder_loads_in_transformers_with_the_new_weights(tiny_path, tmp_path):
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from evora.lora.base_weights import read_weights
    from evora.models.export import write_model

    name = "model.layers.1.mlp.down_proj.weight"
    original = read_weights(tiny_path, [name, "model.layers.0.mlp.up_proj.weight"])
    changed = {name: original[name] + 0.25}
    folder = write_model(Path(tiny_path), tmp_path / "model", changed)
    assert {p.name for p in Path(tiny_path).iterdir() if p.is_file()} == {p.name for p in folder.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    state = model.state_dict()
    assert torch.equal(state[name], changed[name])
    assert torch.equal(state["model.layers.0.mlp.up_proj.weight"], original["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(KeyError, match="no weight named model.nope.weight"):
        write_model(Path(tiny_path), tmp_path / "other", {"model.nope.weight": torch.zeros(1)})
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"population": 7}, "strategy.population=7: must be even"),
        ({"rank": 0}, "strategy.rank=0: must be an integer in 1..512"),
        ({"sigma": 0.0}, "strategy.sigma=0.0: must be > 0"),
        ({"optimizer": "lion"}, 'strategy.optimizer="lion": allowed: sgd, adam'),
        ({"snapshot_every": 0}, "strategy.snapshot_every=0: must be an integer >= 1"),
        ({"distribution": "cma"}, 'strategy.distribution="cma": allowed: fixed, snes'),
        ({"sigma_lr": 0.0}, "strategy.sigma_lr=0.0: must be > 0, or null"),
    ],
)
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        check_eggroll(EggrollConfig(**overrides))
    assert str(error.value).startswith(message)


def test_noise_reuse_perturbs_and_updates_with_the_drawing_generations_factors():
    """noise_reuse=3: generations 3, 4 and 5 share generation 3's factors, in the candidates
    and in the update; generation 6 draws its own."""
    reused, state = strategy(noise_reuse=3)
    fresh, _ = strategy()
    for generation in (3, 4, 5):
        assert reused.factor_keys(generation, 1, SLOTS[0].name) == fresh.factor_keys(3, 1, SLOTS[0].name)
    assert reused.factor_keys(6, 1, SLOTS[0].name) != fresh.factor_keys(3, 1, SLOTS[0].name)
    fitness = [0.3, -1.0, 2.0, 0.5, 0.0, 1.5]
    for generation in range(5):  # fitness histories of five generations; the update of the fifth
        state = told(reused, state, generation, fitness)
    update = reused.update_of(state, 4)
    for slot in SLOTS:
        ours = reused.gradient(update, slot.name, slot.out_features, slot.in_features)
        theirs = fresh.gradient(replace(update, generation=3), slot.name, slot.out_features, slot.in_features)
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("anchor", ["zero", "start"])
def test_weight_decay_pulls_towards_its_anchor(anchor):
    """W <- W + lr g - lr wd (W - A): A = 0, or the model's own weights (weight_decay_anchor=start),
    which the copies carry beside them (memory counted), never in a snapshot."""
    eggroll, state = strategy(shaping="none", weight_decay=0.5, weight_decay_anchor=anchor)
    fitness = [0.3, -1.0, 2.0, 0.5, 0.0, 1.5]
    start = base_weights()
    master = eggroll.start_master(start)
    assert (master.anchor is not None) == (anchor == "start") == eggroll.anchored
    assert eggroll.master_bytes(layout(2, 6.0)) == 4 * sum(s.out_features * s.in_features for s in SLOTS) * (
        1 + (anchor == "start")
    )
    for generation in range(2):
        state = told(eggroll, state, generation, fitness)
        before = {k: v.double() for k, v in master.tensors.items()}
        update = eggroll.update_of(state, generation)
        eggroll.apply(master, update)
        for slot in SLOTS:
            name = matrix_name(slot.name)
            pull = before[name] - (start[name].double() if anchor == "start" else 0.0)
            grad = eggroll.gradient(update, slot.name, slot.out_features, slot.in_features).double()
            expected = before[name] + 0.01 * grad - 0.01 * 0.5 * pull
            assert torch.allclose(master.tensors[name].double(), expected, atol=1e-6)
    assert not any(k.startswith("anchor") for k in master.snapshot()) and master.to("cpu").anchor is master.anchor


def test_distribution_snes_adapts_each_matrix_sigma_by_a_float64_transcription_of_snes_rule():
    """sigma_j <- sigma_j exp(eta / 2 sum_k u_k (|E_k,j|^2 / (out in) - 1)), u = zscore(f) / N,
    eta = (3 + ln d) / (5 sqrt d) for d = 2 matrices; E_k built densely here, per candidate."""
    eggroll, state = strategy(distribution="snes")
    assert state.sigmas == [[0.1, 0.1]]
    fitness = np.array([0.3, -1.0, 2.0, 0.5, 0.0, 1.5])
    result = eggroll.tell(state, eggroll.ask(state, 0)[0], fitness_results(0, fitness))
    u = (fitness - fitness.mean()) / fitness.std() / 6
    eta = (3 + math.log(2)) / (5 * math.sqrt(2))
    for j, slot in enumerate(SLOTS):
        gradient = 0.0
        for k, spec in enumerate(eggroll.population(0)):
            b, a = eggroll.factors(0, spec.member, slot.name, slot.out_features, slot.in_features)
            e = spec.sign * (b.double() @ a.double()) / math.sqrt(2)
            gradient += u[k] * (float((e**2).sum()) / (slot.out_features * slot.in_features) - 1)
        assert result.state.sigmas[1][j] == pytest.approx(0.1 * math.exp(eta / 2 * gradient), rel=1e-12)
    assert result.stats["sigma_min"] == min(result.state.sigmas[1]) != 0.1


def test_distribution_snes_perturbs_and_updates_each_matrix_with_its_own_sigma():
    """Generation 1 after an adaptation: candidate i's LoRA is sign sigma_j E_j, and the SGD
    update is lr / (N sigma_j) sum_i w_i sign_i E_i, matrix by matrix."""
    eggroll, state = strategy(distribution="snes", shaping="none", sigma_lr=2.0)
    state = told(eggroll, state, 0, [0.3, -1.0, 2.0, 0.5, 0.0, 1.5])
    fitness = [1.0, 0.0, -0.5, 0.25, 2.0, -1.0]
    state = told(eggroll, state, 1, fitness)
    sigmas = state.sigmas[1]
    assert sigmas[0] != sigmas[1]
    specs, payload = eggroll.ask(state, 1)
    master = eggroll.start_master(base_weights())
    before = {k: v.clone() for k, v in master.tensors.items()}
    master.generation = 1
    eggroll.apply(master, eggroll.update_of(state, 1))
    for slot, sigma in zip(SLOTS, sigmas):
        b, a = eggroll.factors(1, specs[2].member, slot.name, slot.out_features, slot.in_features)
        lora = lora_product(eggroll.materialise(payload, specs[2]), slot, payload.scale)
        assert torch.allclose(lora, sigma * (b.double() @ a.double()) / math.sqrt(2), atol=1e-7)
        reference = sum(
            w * lora_product(eggroll.materialise(payload, spec), slot, payload.scale) / sigma
            for spec, w in zip(specs, fitness)
        )
        expected = before[matrix_name(slot.name)].double() + 0.01 / (6 * sigma) * reference
        assert torch.allclose(master.tensors[matrix_name(slot.name)].double(), expected, atol=1e-6)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_distribution_snes_widens_when_larger_perturbations_score_better_and_narrows_otherwise(sign):
    eggroll, state = strategy(distribution="snes")
    for generation in range(3):
        specs, _ = eggroll.ask(state, generation)
        q = eggroll.squared_noise(state, generation, [s.member for s in specs]).sum(axis=1)
        state = eggroll.tell(state, specs, fitness_results(generation, sign * q)).state
    assert all((s > 0.1) == (sign > 0) for s in state.sigmas[-1])


def test_distribution_fixed_keeps_strategy_sigma_and_no_sigma_history():
    eggroll, state = strategy()
    state = told(eggroll, state, 0, [0.3, -1.0, 2.0, 0.5, 0.0, 1.5])
    assert state.sigmas == [] and eggroll.ask(state, 1)[1].sigmas == (0.1, 0.1)
    assert dict(eggroll.update_of(state, 0).sigmas) == {s.name: 0.1 for s in SLOTS}


@pytest.mark.parametrize("population", [6, 20])  # K = 6 (factors smaller than the matrices), 20 (not)
def test_sgd_adds_the_update_in_place_and_returns_its_norm_whichever_way_a_matrix_is_stored(population):
    """Plain SGD adds each matrix's low-rank update into the weights (add_low_rank: through the
    K x K Grams, or the product where the factors are not smaller than the matrix) and returns
    the update's norm: against float64, and for copies stored [in, out] (GPT-2's Conv1D)."""
    eggroll, state = strategy(population=population, shaping="none")
    state = told(eggroll, state, 0, np.random.default_rng(3).normal(size=population))
    update = eggroll.update_of(state, 0)
    start = base_weights()
    plain = eggroll.start_master(start)
    stored = eggroll.start_master({k: v.T.contiguous() for k, v in start.items()}, frozenset(start))
    norms = [eggroll.apply(master, update) for master in (plain, stored)]
    moved = math.sqrt(sum(float(((plain.tensors[k].double() - v.double()) ** 2).sum()) for k, v in start.items()))
    assert norms == pytest.approx([moved, moved], rel=1e-5) and moved > 0
    for name, weight in start.items():
        expected = weight.double() + 0.01 * eggroll.gradient(update, name.rsplit(".", 1)[0], *weight.shape).double()
        assert torch.allclose(plain.tensors[name].double(), expected, atol=1e-6)
        assert torch.allclose(stored.tensors[name].T, plain.tensors[name], atol=1e-6)
