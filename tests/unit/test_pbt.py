"""strategy=pbt without a Ray cluster: the LoRALab explore rules stay within bounds, rank
resizing keeps what the adapter learned (Eckart-Young optimum when shrinking, exact when
growing or changing alpha), exploit starts a child from its parent's checkpoint, the
trial's LoRA training learns and resumes exactly, and the run summaries."""

import json
import random
from dataclasses import replace

import pytest
import torch

from evora.config.compose import compose_run
from evora.errors import ConfigError
from evora.lora.layout import build_layout
from evora.lora.noise import gaussian, noise_key
from evora.lora.peft_io import save_adapter
from evora.lora.resize import resize_adapter, truncate_product
from evora.strategies.pbt.runner import (
    TRIALS_FILE,
    TrialContext,
    converged,
    generation_records,
    layout_for,
    read_trials,
    starting_point,
    training_pairs,
)
from evora.strategies.pbt.space import KEYS, explore, member_id, module_sets, sample
from evora.tracking.compute import Spend
from evora.training.lora_sft import LoraSFT, TrainSettings, batch_of, lr_at


@pytest.fixture(scope="module")
def pbt_run():
    return compose_run(["strategy=pbt"])


# --- explore ------------------------------------------------------------------------------


def test_explore_keeps_every_hyperparameter_within_the_search_space(pbt_run):
    space, rng = pbt_run.strategy, random.Random(0)
    changed = {key: 0 for key in KEYS}
    config = sample(space, rng)
    for _ in range(2000):
        new, operations = explore(config, space, rng)
        assert new["rank"] in space.ranks and new["alpha_multiplier"] in space.alpha_multipliers
        assert new["dropout"] in space.dropouts and new["target_modules"] in module_sets(space)
        assert space.lr_min <= new["learning_rate"] <= space.lr_max
        operation = operations.get("learning_rate", "")
        if operation.startswith("x"):
            factor = float(operation[1:])
            assert factor in space.lr_factors
            assert new["learning_rate"] == min(max(config["learning_rate"] * factor, space.lr_min), space.lr_max)
        elif operation:
            assert new["learning_rate"] in space.learning_rates
        for key in KEYS:
            changed[key] += key in operations
            assert key in operations or new[key] == config[key]
        assert set(operations) <= set(KEYS)
        config = new
    # each key changes with probability mutation_probability (0.3): about 600 of 2000
    for key, count in changed.items():
        assert 450 < count < 750, (key, count)


def test_explore_scales_and_clamps_the_learning_rate():
    space = replace(
        compose_run(["strategy=pbt"]).strategy,
        mutation_probability=1.0,
        resample_probability=0.0,
        lr_factors=[2.0],
        lr_max=3e-4,
    )
    new, operations = explore(
        {
            "rank": 16,
            "alpha_multiplier": 1,
            "learning_rate": 2e-4,
            "dropout": 0.05,
            "target_modules": module_sets(space)[0],
        },
        space,
        random.Random(1),
    )
    assert new["learning_rate"] == 3e-4 and operations["learning_rate"] == "x2.0"  # 4e-4 clamped
    ranks = space.ranks
    assert operations["rank"] == "neighbour" and abs(ranks.index(new["rank"]) - ranks.index(16)) <= 1


def test_explore_with_zero_mutation_probability_changes_nothing(pbt_run):
    space = replace(pbt_run.strategy, mutation_probability=0.0)
    config = sample(space, random.Random(3))
    assert explore(config, space, random.Random(4)) == (config, {})


def test_member_ids_read_like_seed_000():
    assert member_id({"rank": 16, "learning_rate": 2e-05, "dropout": 0.1}, 3) == "r16_lr2e-5_d0.1_g3"


# --- rank resize ----------------------------------------------------------------------------


def _factors(out_features: int, in_features: int, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return gaussian(noise_key(seed, "a"), (rank, in_features)), gaussian(noise_key(seed, "b"), (out_features, rank))


def test_truncate_product_is_the_eckart_young_optimum():
    a, b = _factors(40, 24, 16, seed=0)
    product = b.double() @ a.double()
    singular = torch.linalg.svdvals(product)
    for rank in (1, 4, 8):
        new_a, new_b = truncate_product(b, a, rank)
        assert new_a.shape == (rank, 24) and new_b.shape == (40, rank)
        error = torch.linalg.norm(product - new_b.double() @ new_a.double())
        optimum = singular[rank:].pow(2).sum().sqrt()
        assert abs(error - optimum) <= 1e-5 * optimum, (rank, float(error), float(optimum))


def test_truncate_product_to_a_rank_at_least_the_inner_one_is_exact():
    a, b = _factors(12, 10, 4, seed=1)
    new_a, new_b = truncate_product(b, a, 8)  # padded with zero directions
    assert new_a.shape == (8, 10) and torch.allclose(new_b @ new_a, b @ a, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_layouts(tiny_shapes, tiny_path):
    def layout(rank, alpha, modules=("q_proj", "v_proj")):
        return build_layout(
            tiny_shapes, rank=rank, alpha=alpha, target_modules=list(modules), layers=None, base_model=tiny_path
        )

    return layout


def _random_adapter(layout, seed):
    return {key: gaussian(noise_key(seed, key), shape) for key, shape in layout.shapes().items()}


def _updates(tensors, layout):
    return {
        slot.name: layout.scale * tensors[slot.b_key].double() @ tensors[slot.a_key].double() for slot in layout.modules
    }


def test_resize_shrinks_to_the_best_approximation_and_grows_exactly(tiny_layouts):
    source = tiny_layouts(16, 32)
    tensors = _random_adapter(source, seed=5)
    before = _updates(tensors, source)
    shrunk_layout = tiny_layouts(8, 8)  # rank and alpha both change
    shrunk = _updates(resize_adapter(tensors, source, shrunk_layout, seed=1), shrunk_layout)
    for name, dw in before.items():
        optimum = torch.linalg.svdvals(dw)[8:].pow(2).sum().sqrt()
        error = torch.linalg.norm(dw - shrunk[name])
        assert abs(error - optimum) <= 1e-5 * optimum, name
    for target in (tiny_layouts(16, 64), tiny_layouts(64, 64)):  # alpha only; rank grows
        after = _updates(resize_adapter(tensors, source, target, seed=1), target)
        for name, dw in before.items():
            assert torch.allclose(after[name], dw, rtol=1e-5, atol=1e-6), name
        grown = resize_adapter(tensors, source, target, seed=1)
        assert all(grown[k].shape == s for k, s in target.shapes().items())


def test_resize_to_other_modules_keeps_shared_ones_and_starts_new_ones_at_zero(tiny_layouts):
    source, target = tiny_layouts(8, 8), tiny_layouts(8, 8, modules=("v_proj", "down_proj"))
    tensors = _random_adapter(source, seed=6)
    resized = resize_adapter(tensors, source, target, seed=2)
    before, after = _updates(tensors, source), _updates(resized, target)
    for name, dw in after.items():
        if name.endswith("v_proj"):
            assert torch.allclose(dw, before[name], rtol=1e-6, atol=1e-7)
        else:
            assert name.endswith("down_proj") and not dw.any()
            assert resized[next(s.a_key for s in target.modules if s.name == name)].abs().sum() > 0


# --- trial training and exploit -------------------------------------------------------------

HP = {"rank": 8, "alpha_multiplier": 2.0, "learning_rate": 3e-3, "dropout": 0.0, "target_modules": "q_proj,v_proj"}


@pytest.fixture(scope="module")
def tiny_run(tiny_path):
    return compose_run(["strategy=pbt", f"model.path={tiny_path}", "task.train_size=64"])


@pytest.fixture(scope="module")
def pairs(tiny_run, tiny_path):
    return training_pairs(tiny_run, tiny_path)


def _trainer(tiny_path, pairs, hp=HP, **start):
    settings = TrainSettings(
        batch_size=8,
        gradient_accumulation=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        warmup_ratio=0.1,
        total_steps=20,
        layers=(1,),
        seed=7,
    )
    return LoraSFT(tiny_path, hp, settings, pairs[0], pairs[1], **start)


def test_learning_rate_warms_up_then_decays():
    settings = TrainSettings(1, 1, 0.0, 1.0, 0.1, 100, None, 0)
    rates = [lr_at(step, 1.0, settings) for step in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:])) and rates[-1] < 0.02


def _loss(trainer, pairs) -> float:
    """Loss on a fixed batch of the train split (the training loss itself is noisy)."""
    ids, mask, labels = batch_of(pairs[0][:64], pairs[1])
    with torch.no_grad():
        return float(trainer.model(input_ids=ids, attention_mask=mask, labels=labels).loss)


def test_trial_training_learns_and_resumes_exactly(tiny_path, pairs):
    straight = _trainer(tiny_path, pairs)
    before = _loss(straight, pairs)
    straight.train(3)
    straight.train(3)
    assert _loss(straight, pairs) < 0.97 * before, (before, _loss(straight, pairs))  # deterministic: seeded batches
    assert all(".layers.1." in k for k in straight.adapter())  # only the chosen layer
    interrupted = _trainer(tiny_path, pairs)
    interrupted.train(3)
    state = interrupted.state()
    resumed = _trainer(
        tiny_path, pairs, adapter=interrupted.adapter(), optimizer_state=state["optimizer"], step=state["step"]
    )
    resumed.train(3)
    for key, value in straight.adapter().items():
        assert torch.equal(value, resumed.adapter()[key]), key


def _checkpoint(folder, trainer, hp, context, trial, member, generation=2):
    save_adapter(folder / "adapter", trainer.adapter(), layout_for(hp, context))
    torch.save(
        {"trial": trial, "member": member, "parent": "", "generation": generation, "hp": hp, **trainer.state()},
        folder / "trainer.pt",
    )


def test_exploit_starts_the_child_from_its_parents_checkpoint(tmp_path, tiny_run, tiny_path, tiny_shapes, pairs):
    context = TrialContext(tiny_run, tiny_path, "unused", tiny_shapes)
    parent = _trainer(tiny_path, pairs)
    parent.train(2)
    _checkpoint(tmp_path, parent, HP, context, trial="parent_trial", member="r8_lr0.003_d0.0_g0")
    weights = parent.adapter()

    child = starting_point(tmp_path, {**HP, "learning_rate": 1e-3, "dropout": 0.05}, "child_trial", context)
    assert child.parent == "r8_lr0.003_d0.0_g0" and child.member == "" and child.step == 2
    assert child.generation == 2 and child.adapter.keys() == weights.keys()
    assert all(torch.equal(child.adapter[k], weights[k]) for k in weights)
    clone = _trainer(
        tiny_path,
        pairs,
        {**HP, "learning_rate": 1e-3},
        adapter=child.adapter,
        optimizer_state=child.optimizer,
        step=child.step,
    )
    assert all(torch.equal(clone.adapter()[k], weights[k]) for k in weights)  # trains on from the parent

    smaller = {**HP, "rank": 1}
    shrunk = starting_point(tmp_path, smaller, "child_trial", context)
    old, new = layout_for(HP, context), layout_for(smaller, context)
    assert shrunk.adapter.keys() == weights.keys()
    for slot in new.modules:
        dw = old.scale * weights[slot.b_key].double() @ weights[slot.a_key].double()
        approx = new.scale * shrunk.adapter[slot.b_key].double() @ shrunk.adapter[slot.a_key].double()
        optimum = torch.linalg.svdvals(dw)[1:].pow(2).sum().sqrt()
        assert abs(torch.linalg.norm(dw - approx) - optimum) <= 1e-5 * optimum + 1e-12
    resumed_shape = _trainer(
        tiny_path, pairs, smaller, adapter=shrunk.adapter, optimizer_state=shrunk.optimizer, step=shrunk.step
    )
    assert resumed_shape.step == 2  # the optimizer state of another shape is dropped, not loaded

    own = starting_point(tmp_path, HP, "parent_trial", context)  # a resume keeps the member
    assert own.member == "r8_lr0.003_d0.0_g0" and own.parent == ""


# --- summaries ------------------------------------------------------------------------------


def test_convergence_flag_is_under_one_percent_over_five_generations():
    assert converged([0.1, 0.2, 0.3, 0.4, 0.5]) is None
    assert converged([0.1, 0.5, 0.502, 0.503, 0.504, 0.504, 0.504]) is True  # 0.5 -> 0.504 over 5
    assert converged([0.1, 0.5, 0.502, 0.503, 0.504, 0.504]) is False  # 0.1 -> 0.504 over 5
    assert converged([0.1, 0.5, 0.52, 0.53, 0.54, 0.56, 0.57]) is False


def test_trials_reduce_to_one_record_per_generation(tmp_path):
    rows = [
        {"trial": "a", "generation": 1, "fitness": 0.1, "accuracy": 0.2, "member": "ma", "tokens_trained": 10},
        {"trial": "b", "generation": 1, "fitness": 0.3, "accuracy": 0.4, "member": "mb"},
        {"trial": "a", "generation": 2, "fitness": 0.0, "accuracy": 0.1, "member": "ma"},
        {"trial": "a", "generation": 2, "fitness": 0.5, "accuracy": 0.6, "member": "ma"},  # resumed: repeats
        {"trial": "b", "generation": 2, "fitness": 0.2, "accuracy": 0.3, "member": "mb"},
    ]
    (tmp_path / TRIALS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    trials = read_trials(tmp_path)
    assert len(trials) == 4 and trials[2]["fitness"] == 0.5
    records = generation_records(trials, 1000, Spend(tokens_generated=100))
    assert [r["generation"] for r in records] == [1, 2]
    # compute: 6 P T for training, and the scoring (2 P T) shared out evenly over the generations
    assert records[0]["flops"] == 6 * 1000 * 10 + 2 * 1000 * 100 / 2
    assert records[1]["cumulative_flops"] == records[0]["flops"] + 2 * 1000 * 100 / 2
    assert records[1]["fitness_max"] == 0.5 and records[1]["best_member"] == "ma"
    assert records[0]["fitness_median"] == pytest.approx(0.2) and records[0]["trials"] == 2


@pytest.mark.parametrize(
    "override,message",
    [
        ("strategy.ranks=[]", "strategy.ranks=[]: must list at least one value"),
        ("strategy.ranks=[3,8]", "rank 3 is not one vLLM serves"),
        ("strategy.learning_rates=[0.001,0]", "every learning rate must be > 0"),
        ("strategy.learning_rates=[-1e-4]", "every learning rate must be > 0"),
        ("strategy.dropouts=[1.5]", "every dropout must be in [0, 1)"),
        ("strategy.target_modules=[[]]", "every option must name at least one module"),
        ("strategy.keep_top_fraction=0.7", "strategy.keep_top_fraction=0.7"),
        ("strategy.mutation_probability=1.5", "strategy.mutation_probability=1.5"),
        ("strategy.fitness=loss", "strategy.fitness"),
        ("hardware.trial_cpus=0", "hardware.trial_cpus=0"),
    ],
)
def test_bad_search_spaces_are_rejected(override, message):
    with pytest.raises(ConfigError) as error:
        compose_run(["strategy=pbt", override])
    assert message in str(error.value) and "\n" not in str(error.value)
